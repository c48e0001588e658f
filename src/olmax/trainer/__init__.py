"""`olmax train`: one run from its resolved config to the end of its loop, as named phases (run.py):
mesh, fit, state (start.py), the batches of the objective's data with what it asks the run to prepare
(batches.py; the reference pass, reference.py), the loop (loop.py); its metrics writers (metrics.py) and
the exit status an exception ends it with (failures.py). It asks the objective (olmax.objectives), never
its name.

May import: olmax.evals, olmax.convert, olmax.rollout, olmax.fit, olmax.checkpoint, olmax.step,
olmax.objectives, olmax.model, olmax.data, olmax.rundir, olmax.config, olmax.extras, olmax.errors. Never
launch, demo or cli.
"""
