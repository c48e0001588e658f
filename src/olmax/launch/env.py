"""Every environment variable the launcher reads, in one table, read in one place.

Like MaxText's launcher, the cluster a run goes to is configured by the environment (a shell profile
per cluster), the run itself by the command line. docs/launcher.md lists the same table; `olmax
launch --help-env` prints it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from olmax.errors import LaunchError


@dataclass(frozen=True)
class Var:
    name: str
    help: str
    default: Optional[str] = None  # None: required by the backends that list it


# resume-until-done (every backend); the --max-retries / --retry-backoff options win over these
RETRY_VARS = (
    Var("OLMAX_MAX_RETRIES", "resubmissions after the first attempt before giving up", "10"),
    Var("OLMAX_RETRY_BACKOFF_SECONDS", "seconds to wait before each resubmission", "300"),
    Var(
        "OLMAX_LAUNCH_DIR",
        "local directory for the lock and logs of gs:// run directories (default ~/.cache/olmax/launch)",
        "",
    ),
)

LOCAL_VARS = (Var("OLMAX_PYTHON", "Python that runs the trainer (default: the launcher's own)", ""),)

XPK_VARS = (
    Var("OLMAX_XPK_CLUSTER", "GKE cluster created with `xpk cluster create` (xpk --cluster)"),
    Var("OLMAX_XPK_TPU_TYPE", "TPU slice type, e.g. v5p-256 or v6e-256 (xpk --tpu-type)"),
    Var("OLMAX_DOCKER_IMAGE", "image with olmax installed that the workload runs (xpk --docker-image)"),
    Var("OLMAX_XPK_NUM_SLICES", "number of slices (xpk --num-slices)", "1"),
    Var("OLMAX_XPK_PROJECT", "GCP project (xpk --project; default: gcloud's)", ""),
    Var("OLMAX_XPK_ZONE", "GCP zone (xpk --zone; default: gcloud's)", ""),
    Var("OLMAX_XPK_WORKLOAD", "workload name prefix (default: olmax-<run dir name>); attempts add -a<N>", ""),
    Var("OLMAX_XPK", "the xpk executable", "xpk"),
)

SLURM_VARS = (
    Var("OLMAX_SLURM_PARTITION", "partition (sbatch --partition)"),
    Var("OLMAX_SLURM_GPUS_PER_NODE", "GPUs per node = JAX devices per host; nodes = total devices / this"),
    Var("OLMAX_SLURM_ACCOUNT", "account to charge (sbatch --account)", ""),
    Var("OLMAX_SLURM_TIME", "time limit of one attempt, e.g. 48:00:00 (sbatch --time)", ""),
    Var(
        "OLMAX_SLURM_SETUP",
        "shell line run on the batch host before srun, e.g. `source ~/olmax/.venv/bin/activate`",
        "",
    ),
    Var("OLMAX_SLURM_PYTHON", "Python on the compute nodes", "python3"),
    Var("OLMAX_COORDINATOR_PORT", "TCP port of the jax.distributed coordinator on the first node", "12355"),
)

BACKEND_VARS = {"local": LOCAL_VARS, "xpk": XPK_VARS, "slurm": SLURM_VARS}


def read_env(variables: tuple[Var, ...], environ: Mapping[str, str], what: str) -> dict[str, str]:
    """{name: value} for `variables`, defaults filled in; one LaunchError lists every missing one."""
    missing = [v for v in variables if v.default is None and not environ.get(v.name)]
    if missing:
        lines = "\n".join(f"  {v.name}: {v.help}" for v in missing)
        raise LaunchError(f"{what} needs these environment variables, which are not set:\n{lines}")
    return {v.name: environ.get(v.name) or v.default for v in variables}


def positive_int(env: Mapping[str, str], name: str, *, allow_zero: bool = False) -> int:
    """An integer variable; the error names it and its value."""
    value = env[name]
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0 or (number == 0 and not allow_zero):
        raise LaunchError(f"{name}={value!r} must be a {'non-negative' if allow_zero else 'positive'} integer")
    return number


def describe(variables: tuple[Var, ...]) -> str:
    """One line per variable, for --help-env."""

    def note(v: Var) -> str:
        return "required" if v.default is None else "optional" if v.default == "" else f"default {v.default}"

    return "\n".join(f"  {v.name} ({note(v)}): {v.help}" for v in variables)
