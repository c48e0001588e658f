"""The proofs against AI2's code: logit parity of a converted checkpoint with transformers (logits.py)
and training parity with ai2-olmo-core 3.0.0, step by step (training.py, with OLMo-core's side in
olmo_core.py, the shared setup in harness.py and the SFT data in sft.py). Needs the `parity` extra.

May import: olmax.convert, olmax.checkpoint, olmax.step, olmax.model, olmax.data, olmax.config. Never
evals.
"""
