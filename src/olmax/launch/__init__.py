"""`olmax launch`: start a training run on this machine (local), a TPU slice on GKE (xpk) or a Slurm
cluster, and keep resubmitting it from its newest complete checkpoint until it reaches its last step.

- env.py     the environment variables that describe a cluster (one table)
- plan.py    what every backend runs: the trainer's arguments and the batch layout for N devices
- local.py, xpk.py, slurm.py   one backend each: the commands (and script) for one attempt
- resume.py  resume-until-done: the run-directory lock, the attempt loop, the launch log
- worker.py  the process each host runs: jax.distributed set up from the scheduler, then `olmax ...`

The launcher runs the trainer as a separate process; it imports jax only to compute the batch layout
with the trainer's own code (on an abstract mesh: no device is touched) and to list checkpoints.
docs/launcher.md describes the whole.
"""
