"""The verification surfaces (docs/verification.md): held-out loss (`heldout`), per-domain perplexity
(`domains`), token-level KL between two checkpoints (`kl`), the lm-eval-harness adapter
(`lm_eval_adapter`, with the KV-cache decoder in `decode`), and run-to-run curve comparison
(`compare`, `runs`, `plots`). `scoring` holds the forward-only passes they share.
"""
