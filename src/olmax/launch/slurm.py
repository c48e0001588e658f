"""The Slurm backend: an sbatch script that starts one trainer process per node with srun.

Each process drives all GPUs of its node; `olmax.launch.worker` sets up jax.distributed from the
variables the script exports (the first node of the job hosts the coordinator) and Slurm's own
(SLURM_NTASKS, SLURM_PROCID). Two Slurm features carry the launcher's guarantees:

- `--dependency=singleton` with a job name per run directory: Slurm starts a job only when no other
  job of that name and user runs, so two copies of one run never run at once, whoever submits them;
- `--no-requeue`: Slurm does not restart a failed or preempted job by itself, so resubmission has one
  owner (resume-until-done, which waits with `sbatch --wait`: its exit status is the job's).

With OLMAX_SLURM_TIME set, `--signal=TERM@300` sends SIGTERM to the trainers 5 minutes before the
limit: they save at the next step boundary and exit, and resume-until-done resubmits.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Mapping

from olmax.launch import LaunchError
from olmax.launch.env import SLURM_VARS, positive_int, read_env
from olmax.launch.plan import Command, LaunchPlan

# Seconds before the time limit at which Slurm sends SIGTERM (the trainer's preemption notice).
TERM_BEFORE_LIMIT_S = 300


class SlurmBackend:
    name = "slurm"

    def __init__(self, plan: LaunchPlan, environ: Mapping[str, str]):
        self.plan, self.env = plan, read_env(SLURM_VARS, environ, "--backend slurm")
        gpus = positive_int(self.env, "OLMAX_SLURM_GPUS_PER_NODE")
        total = plan.layout.total_devices
        if total % gpus:
            raise LaunchError(f"--total-devices {total} is not a multiple of OLMAX_SLURM_GPUS_PER_NODE={gpus} "
                              "(one trainer process per node drives all of its GPUs)")
        self.nodes, self.gpus_per_node = total // gpus, gpus
        positive_int(self.env, "OLMAX_COORDINATOR_PORT")
        for name in ("OLMAX_SLURM_PARTITION", "OLMAX_SLURM_ACCOUNT", "OLMAX_SLURM_TIME"):
            if any(c.isspace() or c in "'\"" for c in self.env[name]):
                raise LaunchError(f"{name}={self.env[name]!r}: #SBATCH values may not hold spaces or quotes")
        self.script_path = Path(plan.run_dir) / "launch" / f"{plan.name}.sbatch"

    def script(self) -> str:
        env, plan = self.env, self.plan
        directives = [
            f"--job-name={plan.name}",
            f"--partition={env['OLMAX_SLURM_PARTITION']}",
            f"--nodes={self.nodes}",
            "--ntasks-per-node=1",
            f"--gpus-per-node={self.gpus_per_node}",
            "--dependency=singleton",
            "--no-requeue",
        ]
        if env["OLMAX_SLURM_ACCOUNT"]:
            directives.append(f"--account={env['OLMAX_SLURM_ACCOUNT']}")
        if env["OLMAX_SLURM_TIME"]:
            directives += [f"--time={env['OLMAX_SLURM_TIME']}", f"--signal=TERM@{TERM_BEFORE_LIMIT_S}"]
        worker = [env["OLMAX_SLURM_PYTHON"], "-m", "olmax.launch.worker", *plan.train_args()]
        srun = ["srun", f"--nodes={self.nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1", *worker]
        lines = ["#!/bin/bash", *(f"#SBATCH {d}" for d in directives),
                 f"# Written by `olmax launch --backend slurm`: {plan.layout.describe()}.",
                 "set -euo pipefail"]
        if env["OLMAX_SLURM_SETUP"]:
            lines.append(env["OLMAX_SLURM_SETUP"])  # a shell line by design (e.g. activating a venv)
        lines += [
            "# jax.distributed: one process per node, the first node hosts the coordinator (sed, not head:\n"
            "# under pipefail, head closing the pipe early would fail the line)",
            "export OLMAX_DISTRIBUTED=slurm",
            'first_node="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"',
            f'export OLMAX_COORDINATOR="$first_node:{env["OLMAX_COORDINATOR_PORT"]}"',
            shlex.join(srun),
        ]
        return "\n".join(lines) + "\n"

    def _sbatch(self, *extra: str) -> Command:
        # --output on the command line, not as #SBATCH: a run directory may hold any character
        output = str(Path(self.plan.run_dir) / "launch" / "slurm-%j.out")
        return Command(["sbatch", f"--output={output}", *extra, str(self.script_path)])

    def launch_steps(self) -> list[Command]:
        """Submit the script once and return (the job runs on its own)."""
        return [self._sbatch()]

    def attempt_steps(self, attempt: int) -> list[Command]:
        """Submit and wait for the job to end; sbatch --wait exits with the job's exit status."""
        return [self._sbatch("--wait")]

    def files(self) -> dict[str, str]:
        """Files to write before the commands run: {path: content}."""
        return {str(self.script_path): self.script()}
