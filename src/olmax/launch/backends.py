"""The three backends by name, and the text --dry-run prints for one."""

from __future__ import annotations

from typing import Mapping

from olmax.errors import LaunchError
from olmax.launch.local import LocalBackend
from olmax.launch.plan import LaunchPlan
from olmax.launch.slurm import SlurmBackend
from olmax.launch.xpk import XpkBackend

BACKENDS = {"local": LocalBackend, "xpk": XpkBackend, "slurm": SlurmBackend}


def make_backend(name: str, plan: LaunchPlan, environ: Mapping[str, str]):
    if name not in BACKENDS:
        raise LaunchError(f"--backend {name!r} is not one of {', '.join(BACKENDS)}")
    return BACKENDS[name](plan, environ)


def dry_run(backend, plan: LaunchPlan, *, resume: bool) -> str:
    """Exactly what would run: the files that would be written, then the commands, one per line,
    quoted for a POSIX shell. With `resume`, the commands of the first attempt."""
    lines = [f"# {backend.name}: {plan.layout.describe()}"]
    if resume:
        final = plan.final()
        final = "the last step (the end of the data's epochs)" if final is None else f"step {final}"
        lines.append(f"# resume-until-done until a complete checkpoint of {final}; attempt 1 runs:")
    for path, content in backend.files().items():
        lines += [f"# file {path}:", content.rstrip("\n"), "# end of file"]
    steps = backend.attempt_steps(1) if resume else backend.launch_steps()
    return "\n".join(lines + [c.shell() for c in steps]) + "\n"
