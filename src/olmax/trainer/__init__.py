"""`olmax train`: one run from its resolved config to the end of its loop, as named phases (run.py):
mesh, fit, state (start.py), data with the objective's extras (batches.py; DPO's reference pass,
reference.py), the loop (loop.py); its metrics (metrics.py), exit record (exits.py) and `olmax status`
(status.py).

May import: every package below the launcher (parity, evals, convert, rollout, fit, checkpoint,
train and down); never launch, demo or cli.
"""
