"""Training objectives other than next-token cross-entropy (olmax.train.loss): each a loss over the model's
outputs plus its metrics, pure JAX, for use inside the one jitted train step. `dpo`: direct preference
optimisation (docs/post-training.md, "DPO")."""
