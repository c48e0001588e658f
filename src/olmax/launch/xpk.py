"""The xpk backend: a TPU slice (or several) on a GKE cluster, as an xpk workload.

`xpk workload create --cluster C --workload W --tpu-type T --num-slices S --docker-image I --command
'...'` runs the command once per TPU VM in the image; each runs `olmax.cli.worker`, which lets JAX
find the slice's coordinator and its own rank (OLMAX_DISTRIBUTED=auto, passed with xpk's --env).
resume-until-done then waits with `xpk workload list --cluster C --wait-for-job-completion W`, which
exits 0 when the workload completed and non-zero otherwise (xpk: 125 failed, 124 timed out). Every
attempt is a new workload, W-a<N> (xpk refuses to reuse a name); before attempt N the launcher
deletes W-a<N-1>, so a workload whose wait was cut short cannot run next to its successor.

A workload deleted by someone (`xpk workload delete`) gives its trainers SIGTERM, so they save and
record PREEMPTED, as on a real preemption. The launcher tells the two apart by asking, after a wait
that did not end in success, whether the attempt's JobSet still exists (XpkBackend.jobset_gone): gone
means deleted, and the run is not resubmitted. What xpk's wait does meanwhile depends on the
cluster (xpk 1.13, src/xpk/core/workload.py wait_for_job_completion, waits with `kubectl wait
--for=condition=Finished` on Kueue's Workload object): where Kueue finishes an orphaned Workload
(its FinishOrphanedWorkloads feature) the wait ends at once and xpk exits non-zero, reading the
deleted JobSet's status; otherwise the Workload just disappears, and kubectl keeps waiting for a
condition on a deleted object until its timeout (xpk's default: one week). So after deleting the
workload, stop the launcher too (Ctrl-C or SIGTERM: it does not resubmit).

The run directory is a path inside the container (e.g. a bucket mounted with gcsfuse); to follow
progress, resume-until-done must see the same directory where it runs.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from typing import Mapping, Optional

from olmax.errors import LaunchError
from olmax.fit.chips import chip_of_tpu_type, libtpu_init_args
from olmax.launch.env import XPK_VARS, positive_int, read_env
from olmax.launch.outcome import Ended, Outcome, cancelled
from olmax.launch.plan import Command, LaunchPlan
from olmax.rundir.exits import ExitStatus

# `xpk workload list --wait-for-job-completion` exit codes (xpk's wait_for_job_completion)
XPK_WAIT = {125: "xpk: workload failed", 124: "xpk: the wait timed out"}
# xpk's rule for workload names: lower case letters, digits and '-', starting with a letter, at most 40.
WORKLOAD_NAME = re.compile(r"^[a-z][a-z0-9-]{0,39}$")


def slice_devices(tpu_type: str) -> Optional[int]:
    """JAX devices of one slice of `tpu_type` (v5p-256 -> 128); None for a type not in the table."""
    chip, size = chip_of_tpu_type(tpu_type), tpu_type.rpartition("-")[2]
    if chip is None or not size.isdigit():
        return None
    return int(int(size) * chip.type_unit_devices)


class XpkBackend:
    name = "xpk"

    def __init__(self, plan: LaunchPlan, environ: Mapping[str, str]):
        self.plan, self.env = plan, read_env(XPK_VARS, environ, "--backend xpk")
        self.num_slices = positive_int(self.env, "OLMAX_XPK_NUM_SLICES")
        per_slice = slice_devices(self.env["OLMAX_XPK_TPU_TYPE"])
        total = plan.layout.total_devices
        if per_slice is not None and per_slice * self.num_slices != total:
            raise LaunchError(
                f"--total-devices {total} does not match OLMAX_XPK_TPU_TYPE="
                f"{self.env['OLMAX_XPK_TPU_TYPE']} x OLMAX_XPK_NUM_SLICES={self.num_slices} "
                f"({per_slice} x {self.num_slices} = {per_slice * self.num_slices} devices)"
            )
        self.workload = self.env["OLMAX_XPK_WORKLOAD"] or plan.name[:34]
        if not WORKLOAD_NAME.match(f"{self.workload}-a999"):
            raise LaunchError(
                f"xpk workload name {self.workload!r} (OLMAX_XPK_WORKLOAD or the run directory's "
                "name) must be lower-case letters, digits and '-', start with a letter, "
                "and leave 5 of xpk's 40 characters for the attempt suffix"
            )

    def _xpk(self, *args: str) -> list[str]:
        where = []
        if self.env["OLMAX_XPK_PROJECT"]:
            where += ["--project", self.env["OLMAX_XPK_PROJECT"]]
        if self.env["OLMAX_XPK_ZONE"]:
            where += ["--zone", self.env["OLMAX_XPK_ZONE"]]
        sub, *rest = args
        return [self.env["OLMAX_XPK"], "workload", sub, "--cluster", self.env["OLMAX_XPK_CLUSTER"], *where, *rest]

    def worker_command(self) -> str:
        """The shell command each TPU VM runs (xpk --command takes one string)."""
        return shlex.join(["python3", "-m", "olmax.cli.worker", *self.plan.train_args()])

    def create(self, workload: str) -> Command:
        return Command(
            self._xpk(
                "create",
                "--workload",
                workload,
                "--tpu-type",
                self.env["OLMAX_XPK_TPU_TYPE"],
                "--num-slices",
                str(self.num_slices),
                "--docker-image",
                self.env["OLMAX_DOCKER_IMAGE"],
                *self.env_args(),
                "--command",
                self.worker_command(),
            )
        )

    def env_args(self) -> list[str]:
        """xpk's `--env KEY=VALUE`: the worker's distributed start-up, the chip's libtpu flag profile
        (olmax.fit.chips; the flags `olmax compile-check --topology` compiles with) unless the launch sets
        LIBTPU_INIT_ARGS itself, and every --env of the launch (xpk puts them into the container spec
        as they are: no shell reads them)."""
        pairs = [("OLMAX_DISTRIBUTED", "auto")]
        chip = chip_of_tpu_type(self.env["OLMAX_XPK_TPU_TYPE"])
        given = {k for k, _ in self.plan.options.env}
        if chip is not None and chip.libtpu_flags and "LIBTPU_INIT_ARGS" not in given:
            pairs.append(("LIBTPU_INIT_ARGS", libtpu_init_args(chip)))
        pairs += list(self.plan.options.env)
        return [a for k, v in pairs for a in ("--env", f"{k}={v}")]

    def launch_steps(self) -> list[Command]:
        return [self.create(self.workload)]

    def attempt_steps(self, attempt: int) -> list[Command]:
        name = f"{self.workload}-a{attempt}"
        steps = []
        if attempt > 1:
            previous = f"{self.workload}-a{attempt - 1}"  # may be gone already (xpk's TTL): may fail
            steps.append(Command(self._xpk("delete", "--workload", previous, "--force"), may_fail=True))
        return steps + [self.create(name), self.wait(name)]

    def wait(self, workload: str) -> Command:
        return Command(self._xpk("list", "--wait-for-job-completion", workload))

    def files(self) -> dict[str, str]:
        return {}

    def outcome(self, ended: Ended) -> Outcome:
        """xpk's wait only tells completed (0), failed (125) or timed out (124); the row of a failure
        comes from the trainer's RUN_DIR/exit_status.json (olmax.launch.outcome), and without one (a
        lost node, an OOM kill) it is a crash. A failed wait whose JobSet is gone means someone
        deleted the workload (`xpk workload delete`): CANCELLED, never resubmitted."""
        name = f"{self.workload}-a{ended.attempt}"
        if ended.command != self.wait(name):  # the workload was not created: nothing to ask about
            return Outcome(ExitStatus.CRASHED, f"xpk workload {ended.command.argv[2]} exited {ended.code}")
        if ended.code == 0:
            return Outcome(ExitStatus.DONE, "xpk: workload completed")
        failed = XPK_WAIT.get(ended.code, f"xpk exited {ended.code}")
        gone = self.jobset_gone(name)
        if gone is None:
            return Outcome(ExitStatus.CRASHED, f"{failed}; whether its JobSet still exists is unknown")
        if gone:
            return cancelled(f"{failed}: the JobSet {name} is gone (deleted: `xpk workload delete`)")
        return Outcome(ExitStatus.CRASHED, failed)

    def jobset_gone(self, name: str) -> Optional[bool]:
        """Whether the JobSet `name` no longer exists; None when the cluster cannot be asked.

        `xpk workload delete` is `kubectl delete jobset NAME -n default`, and the launcher deletes an
        attempt's workload only before the next one, so a JobSet missing when its wait ended was
        deleted by someone (a finished one stays for xpk's ttlSecondsAfterFinished, 12 hours by
        default).
        xpk's own listing shows Kueue's Workload objects, which can outlive their JobSet, so kubectl
        asks for the JobSet itself, right after `xpk workload list` (which points kubectl's current
        context at this cluster, as every xpk command does)."""
        try:
            listed = subprocess.run(self._xpk("list", "--filter-by-job", name), capture_output=True, timeout=600)
            if listed.returncode != 0:
                return None
            got = subprocess.run(
                ["kubectl", "get", "jobset", name, "-n", "default", "--ignore-not-found", "-o", "name"],
                capture_output=True,
                text=True,
                timeout=120,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        if got.returncode != 0:
            return None
        return not got.stdout.strip()
