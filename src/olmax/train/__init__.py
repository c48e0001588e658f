"""The jitted, sharded training step `train_step(state, batch) -> (state, metrics)` (step.py) and
what it is made of: the train state and its shardings (state.py), AdamW with skip-step (optim.py),
the learning-rate schedules (schedules.py) and the LM loss (loss.py). No loop, no files.

May import: olmax.objectives, olmax.model, olmax.config, olmax.errors.
"""
