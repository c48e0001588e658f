"""The Slurm backend: an sbatch script that starts one trainer process per node with srun.

Each process drives all GPUs of its node; `olmax.cli.worker` sets up jax.distributed from the
variables the script exports (the first node of the job hosts the coordinator) and Slurm's own
(SLURM_NTASKS, SLURM_PROCID). Two Slurm features carry the launcher's guarantees:

- `--dependency=singleton` with a job name per run directory: Slurm starts a job only when no other
  job of that name and user runs, so two copies of one run never run at once, whoever submits them;
- `--no-requeue`: Slurm does not restart a failed or preempted job by itself, so resubmission has one
  owner (resume-until-done, which waits with `sbatch --wait`: its exit status is the job's).

Every trainer gets the GPU flag profile of olmax.fit.chips (XLA_FLAGS, XLA_PYTHON_CLIENT_MEM_FRACTION and
NCCL's settings: the XLA flags `olmax compile-check --topology h100:NxG` compiles with), the profile of
--chip when it names a GPU; a variable the launch sets with --env is left to it.

With OLMAX_SLURM_TIME set, `--signal=TERM@300` sends SIGTERM to the trainers 5 minutes before the
limit: they save at the next step boundary and exit, and resume-until-done resubmits. `scancel` sends
the same SIGTERM, so the trainer's record cannot tell the two apart; Slurm's job state (sacct) can,
and a CANCELLED job is not resubmitted (the table above SLURM_STATES).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from pathlib import Path
from typing import Mapping, Optional

from olmax.errors import LaunchError
from olmax.fit.chips import get_chip, gpu_env
from olmax.launch.env import SLURM_VARS, positive_int, read_env
from olmax.launch.outcome import Ended, Outcome, cancelled
from olmax.launch.plan import Command, LaunchPlan
from olmax.rundir.exits import ExitStatus, from_returncode

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
        self.node_layout = _node_layout(plan, gpus)
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
        worker = [env["OLMAX_SLURM_PYTHON"], "-m", "olmax.cli.worker", *plan.train_args()]
        srun = ["srun", f"--nodes={self.nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1", *worker]
        lines = [
            "#!/bin/bash",
            *(f"#SBATCH {d}" for d in directives),
            f"# Written by `olmax launch --backend slurm`: {plan.layout.describe()}.",
            f"# Mesh {self.node_layout}.",
            "set -euo pipefail",
        ]
        if env["OLMAX_SLURM_SETUP"]:
            lines.append(env["OLMAX_SLURM_SETUP"])  # a shell line by design (e.g. activating a venv)
        lines += [f"export {k}={shlex.quote(v)}" for k, v in self.gpu_profile()]
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

    def gpu_profile(self) -> list[tuple[str, str]]:
        """The trainers' GPU flag profile (olmax.fit.chips.gpu_env) without the variables --env sets; none
        when --chip names a TPU."""
        chip = get_chip(self.plan.options.chip) if self.plan.options.chip else None
        if chip is not None and chip.platform != "gpu":
            return []
        given = {k for k, _ in self.plan.options.env}
        return [(k, v) for k, v in gpu_env(chip) if k not in given]

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

    def outcome(self, ended: Ended) -> Outcome:
        """Slurm's verdict on the attempt's job (by the id sbatch printed into the attempt log): its
        final state from sacct, read through SLURM_STATES; COMPLETED, FAILED, or no state from
        sacct: the exit code `sbatch --wait` returned (the job's: srun's, the highest of the tasks',
        128 + N for signal N). The trainer's record outranks all of this except CANCELLED
        (olmax.launch.outcome)."""
        code, job = ended.code, _job_id(ended.log)
        if job is None:
            return Outcome(from_returncode(code), "exit code (no job id in the attempt log)")
        state, line = final_state(job)
        if state == "CANCELLED":
            return cancelled(f"Slurm job {job}: {line} (scancel: stopped on purpose)")
        if state in SLURM_STATES:
            return Outcome(SLURM_STATES[state], f"Slurm job {job}: {line}")
        return Outcome(from_returncode(code), f"Slurm job {job}: {line}; exit code")


# What a final Slurm job state means for resume-until-done, read together with the trainer's record
# (RUN_DIR/exit_status.json) in olmax.launch.outcome's order. The rows that matter:
#
#   sacct state        trainer's record    row, what resume-until-done does
#   CANCELLED [by U]   any, or none        CANCELLED: not resubmitted. scancel (by anyone, root too)
#                                          sends SIGTERM, so the trainer saves and records PREEMPTED
#   PREEMPTED          PREEMPTED, or none  PREEMPTED: resubmitted, not counted (Slurm preempted it)
#   FAILED             PREEMPTED           PREEMPTED: resubmitted, not counted. The time limit's
#                                          --signal=TERM@300: the trainer saved and exited 143
#   TIMEOUT            PREEMPTED           PREEMPTED: resubmitted, not counted. The same, but the job
#                                          outlived its limit after the save (a slow shutdown)
#   TIMEOUT            none                CRASHED: counted. The trainer did not stop within
#                                          TERM_BEFORE_LIMIT_S of the SIGTERM
#   NODE_FAIL/BOOT_FAIL none               TRANSIENT: counted
#   OUT_OF_MEMORY/DEADLINE none            CRASHED: counted
#   COMPLETED/FAILED   none                the exit code's row
#   other, a record    the record          the record's row: the trainer knows why it stopped
#   not final after SACCT_TRIES, or no sacct: the record, else the exit code
#
# `scancel --signal=TERM` only signals the job: it ends FAILED with a PREEMPTED record, resubmitted.
SLURM_STATES = {
    "PREEMPTED": ExitStatus.PREEMPTED,
    "NODE_FAIL": ExitStatus.TRANSIENT,
    "BOOT_FAIL": ExitStatus.TRANSIENT,
    "TIMEOUT": ExitStatus.CRASHED,
    "OUT_OF_MEMORY": ExitStatus.CRASHED,
    "DEADLINE": ExitStatus.CRASHED,
}
# The states a job ends in (Slurm's job_state_codes); before them sacct may still show RUNNING or
# COMPLETING for a few seconds after `sbatch --wait` returned: the accounting database lags the
# controller, so sacct is asked again, SACCT_TRIES times SACCT_WAIT_S apart.
FINAL_STATES = {"CANCELLED", "COMPLETED", "FAILED", *SLURM_STATES}
SACCT_TRIES, SACCT_WAIT_S = 6, 5.0


def _node_layout(plan: LaunchPlan, gpus_per_node: int) -> str:
    """How the trainer's mesh falls on the nodes (olmax.config.mesh.node_split: tensor and fsdp within a
    node as far as they fit); a mesh that cannot follow the nodes is refused before submission."""
    from olmax.config.mesh import describe_node_split
    from olmax.errors import ConfigError

    try:
        return describe_node_split(tuple(plan.layout.mesh.values()), gpus_per_node)
    except ConfigError as e:
        raise LaunchError(f"the mesh does not fit nodes of OLMAX_SLURM_GPUS_PER_NODE={gpus_per_node}: {e}") from None


def _job_id(attempt_log: Path) -> Optional[str]:
    """The id in sbatch's last `Submitted batch job N` line of the attempt log."""
    try:
        ids = re.findall(r"Submitted batch job (\d+)", Path(attempt_log).read_text())
    except OSError:
        return None
    return ids[-1] if ids else None


def final_state(job: str) -> tuple[Optional[str], str]:
    """The job's final state word (`CANCELLED by 123` -> CANCELLED) and sacct's whole line, asking
    again while accounting has not caught up; (None, what was seen) when sacct cannot tell."""
    seen = "no state from sacct"
    for attempt in range(SACCT_TRIES):
        if attempt:
            time.sleep(SACCT_WAIT_S)
        try:
            out = subprocess.run(
                ["sacct", "-j", job, "-X", "-n", "-P", "-o", "State"], capture_output=True, text=True, timeout=60
            )
        except OSError:
            return None, "no sacct"
        except subprocess.TimeoutExpired:
            continue
        lines = out.stdout.strip().splitlines() if out.returncode == 0 else []
        if lines:
            seen = lines[0].strip()
            state = seen.split()[0].rstrip("+")
            if state in FINAL_STATES:
                return state, seen
            seen = f"still {seen} in sacct after {SACCT_TRIES} tries"
    return None, seen
