"""`olmax launch`: start a training run on this machine (local), a TPU slice on GKE (xpk) or a Slurm
cluster, and keep resubmitting it from its newest complete checkpoint until it reaches its last step.

- env.py     the environment variables that describe a cluster (one table)
- plan.py    what every backend runs: the trainer's arguments and the batch layout for N devices
- local.py, xpk.py, slurm.py   one backend each: the commands (and script) for one attempt
- outcome.py how an attempt ended, from the exit record or the scheduler
- resume.py  resume-until-done: the run-directory lock, the attempt loop, the launch log

The launcher runs the trainer as a separate process (`python -m olmax.cli.worker`) and imports no
jax: the batch layout is plain Python (olmax.config.layout), and the caller hands resume-until-done
its list of complete checkpoints. docs/launcher.md.

May import: olmax.fit.chips, olmax.rundir, olmax.config, olmax.errors. Never jax, the trainer or cli.
"""
