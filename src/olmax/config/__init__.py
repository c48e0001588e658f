"""The experiment's configuration, in plain Python (no jax): one frozen, typed dataclass per section
(model, data, optimizer, schedule, trainer, mesh, run, dpo, grpo), composed into ExperimentConfig
(experiment.py); YAML, dotted overrides and each field's help (io.py); the named recipes (recipes.py);
what a config becomes on N devices (mesh.py, layout.py); the remat policies' names (remat.py).

May import: olmax.errors.
"""
