"""The experiment's configuration, in plain Python (no jax): one frozen, typed dataclass per section
(model, data, optimizer, schedule, trainer, mesh, checkpoint (with eval and wandb), dpo, grpo), composed
into ExperimentConfig (experiment.py); what a config knows of an objective (objective.py); YAML, dotted
overrides and each field's help (io.py); the named recipes (recipes.py); what a config becomes on N
devices (mesh.py, layout.py); the remat policies' names (remat.py).

May import: olmax.errors. Plain Python: no jax, no numpy.
"""
