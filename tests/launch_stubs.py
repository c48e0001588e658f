"""What the launcher tests share: the backends' environments, an override a shell would mangle, and
stub commands (srun, scontrol, kubectl, ...) written as small Python scripts."""

import stat
import sys

# an override whose value holds spaces, both quote characters and a $ that a shell would expand
TRICKY = """data.paths=["my corpus/a b.npy", "it's \\"$HOME\\""]"""
SLURM_ENV = {"OLMAX_SLURM_PARTITION": "gpu", "OLMAX_SLURM_GPUS_PER_NODE": "4"}
XPK_ENV = {"OLMAX_XPK_CLUSTER": "c1", "OLMAX_XPK_TPU_TYPE": "v5p-16", "OLMAX_DOCKER_IMAGE": "gcr.io/p/olmax:1"}


def stub(directory, name, body):
    """An executable `name` in `directory` running the Python `body`."""
    path = directory / name
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
