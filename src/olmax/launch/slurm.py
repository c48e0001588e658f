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

import re
import shlex
import subprocess
from pathlib import Path
from typing import Mapping, Optional

from olmax.exits import ExitStatus, from_returncode
from olmax.launch import LaunchError
from olmax.launch.env import SLURM_VARS, positive_int, read_env
from olmax.launch.plan import Command, LaunchPlan

# Seconds before the time limit at which Slurm sends SIGTERM (the trainer's preemption notice).
TERM_BEFORE_LIMIT_S = 300


class SlurmBackend:
    name = "slurm"

    def __init__(self, plan: LaunchPlan, environ: Mapping[str, str]):
        self.plan, self.env = plan, read_env(SLURM_VARS, environ, "--backend slurm")
        if "://" in plan.run_dir:
            raise LaunchError(
                f"--backend slurm writes its script and job output into the run directory: it must "
                f"be a path on the cluster's shared filesystem, not {plan.run_dir}"
            )
        gpus = positive_int(self.env, "OLMAX_SLURM_GPUS_PER_NODE")
        total = plan.layout.total_devices
        if total % gpus:
            raise LaunchError(
                f"--total-devices {total} is not a multiple of OLMAX_SLURM_GPUS_PER_NODE={gpus} "
                "(one trainer process per node drives all of its GPUs)"
            )
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
        lines = [
            "#!/bin/bash",
            *(f"#SBATCH {d}" for d in directives),
            f"# Written by `olmax launch --backend slurm`: {plan.layout.describe()}.",
            "set -euo pipefail",
        ]
        if env["OLMAX_SLURM_SETUP"]:
            lines.append(env["OLMAX_SLURM_SETUP"])  # a shell line by design (e.g. activating a venv)
        lines += [f"export {k}={shlex.quote(v)}" for k, v in plan.options.env]  # --env; srun passes them on
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

    def outcome(self, code: int, attempt_log: Path) -> tuple[ExitStatus, str]:
        """The row of a job that left no trainer record: its Slurm state (sacct, by the job id sbatch
        printed into the attempt log) where that says more than the exit code, else the exit code
        (sbatch --wait exits with the job's: srun's, the highest of the tasks', 128 + N for signal N)."""
        job = _job_id(attempt_log)
        state = _sacct_state(job) if job else None
        if state in SLURM_STATES:
            return SLURM_STATES[state], f"Slurm job {job}: {state}"
        return from_returncode(code), f"Slurm job {job}: {state}, exit code" if job else "exit code"


# Slurm job states that decide the row by themselves (the others, COMPLETED and FAILED, by the exit code)
SLURM_STATES = {
    "PREEMPTED": ExitStatus.PREEMPTED,
    "NODE_FAIL": ExitStatus.TRANSIENT,
    "BOOT_FAIL": ExitStatus.TRANSIENT,
    "TIMEOUT": ExitStatus.CRASHED,  # the trainer did not stop within TERM_BEFORE_LIMIT_S of the SIGTERM
    "OUT_OF_MEMORY": ExitStatus.CRASHED,
    "DEADLINE": ExitStatus.CRASHED,
    "CANCELLED": ExitStatus.USER_ERROR,  # scancel: someone stopped it on purpose; not resubmitted
}


def _job_id(attempt_log: Path) -> Optional[str]:
    """The id in sbatch's last `Submitted batch job N` line of the attempt log."""
    try:
        ids = re.findall(r"Submitted batch job (\d+)", Path(attempt_log).read_text())
    except OSError:
        return None
    return ids[-1] if ids else None


def _sacct_state(job: str) -> Optional[str]:
    """The job's state word (`CANCELLED by 123` -> CANCELLED), or None when sacct cannot tell."""
    try:
        out = subprocess.run(
            ["sacct", "-j", job, "-X", "-n", "-P", "-o", "State"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    words = out.stdout.split()
    return words[0].rstrip("+") if out.returncode == 0 and words else None
