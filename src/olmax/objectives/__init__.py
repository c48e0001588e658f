"""Training objectives other than next-token cross-entropy (olmax.train.loss): DPO (dpo.py) and
GRPO (grpo.py), each a loss over the model's outputs plus its metrics, pure JAX, for the one jitted
train step.

May import: olmax.model, olmax.config, olmax.errors.
"""
