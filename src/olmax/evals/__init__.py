"""The verification surfaces (docs/verification.md): held-out loss (heldout.py), per-domain perplexity
(domains.py), token-level KL between two checkpoints (kl.py), `olmax verify` (verify.py), the
lm-eval-harness adapter (lm_eval_adapter.py, tasks.py) and run-to-run comparison (compare.py, runs.py,
plots.py); scoring.py holds the forward-only passes they share.

May import: olmax.rollout, olmax.checkpoint, olmax.objectives, olmax.model, olmax.data, olmax.config,
olmax.extras. Never parity.
"""
