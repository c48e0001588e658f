"""The jitted, sharded training step `train_step(state, batch) -> (state, metrics)` (train_step.py), the
same for every objective, and what it is made of: micro-batches and gradient accumulation
(micro_batches.py), the train state and its shardings (state.py), AdamW with skip-step (optim.py), the
learning-rate schedules (schedules.py). The losses are the objectives' (olmax.objectives). No loop, no
files.

May import: olmax.objectives, olmax.model, olmax.config, olmax.errors.
"""
