"""The local backend: `olmax train` as a child process of the launcher, on this machine.

On CPU the launcher makes `--total-devices` fake devices (XLA's host-platform device count), so
resizing and the fault tests run anywhere; on a GPU or TPU host the trainer uses the accelerators and
the flag has no effect (`--total-devices` must then be the host's device count).
"""

from __future__ import annotations

import re
import sys
from typing import Mapping

from olmax.launch.env import LOCAL_VARS, read_env
from olmax.launch.outcome import Ended, Outcome, from_exit_code
from olmax.launch.plan import Command, LaunchPlan

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


class LocalBackend:
    name = "local"

    def __init__(self, plan: LaunchPlan, environ: Mapping[str, str]):
        env = read_env(LOCAL_VARS, environ, "--backend local")
        self.plan, self.environ = plan, dict(environ)
        self.python = env["OLMAX_PYTHON"] or sys.executable

    def trainer(self) -> Command:
        # --env XLA_FLAGS=... else the inherited flags, with one device-count flag (XLA would take the last)
        env = self.plan.env
        flags = re.sub(rf"{DEVICE_COUNT_FLAG}=\S*", "", env.get("XLA_FLAGS", self.environ.get("XLA_FLAGS", ""))).split()
        env["XLA_FLAGS"] = " ".join([*flags, f"{DEVICE_COUNT_FLAG}={self.plan.layout.total_devices}"])
        return Command([self.python, "-m", "olmax.cli", *self.plan.train_args()], env)

    def outcome(self, ended: Ended) -> Outcome:
        """The trainer is the child: its exit code is the row (a signal: -N)."""
        return from_exit_code(ended.code)

    def launch_steps(self) -> list[Command]:
        """One run of the trainer, in the foreground."""
        return [self.trainer()]

    def attempt_steps(self, attempt: int) -> list[Command]:
        """resume-until-done: the trainer again; it resumes from the newest complete checkpoint."""
        return [self.trainer()]

    def files(self) -> dict[str, str]:
        return {}
