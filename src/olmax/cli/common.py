"""Shared pieces of the `olmax` command line: the root app, the common options, JSON output, the
decorator that ends a command on a user error with a one-line message and exit status 2, and the one
that sets up the process of a command that runs JAX (which platform, which library notices)."""

from __future__ import annotations

import ctypes
import functools
import glob
import importlib
import importlib.util
import json
import logging
import os
import pkgutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping, MutableMapping, Optional

import typer

from olmax.errors import ConfigError
from olmax.fit import compile_cache
from olmax.fit.chips import chip_names
from olmax.rundir.exits import ExitStatus

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="OLMo 3 pre- and post-training in JAX, with parity against OLMo-core built in.",
)


RecipeOpt = typer.Option(None, "--recipe", help="named preset (olmax.config.recipes)")


ConfigOpt = typer.Option(None, "--config", help="experiment YAML instead of a recipe")


OverridesArg = typer.Argument(None, help="dotted overrides, e.g. model.n_layers=4")


JsonOpt = typer.Option(None, "--json", help="also write the figures to this JSON file")


def resolve_experiment(
    recipe: Optional[str],
    config: Optional[str],
    overrides: Optional[list[str]],
    shorthands: Optional[dict[str, Any]] = None,
    *,
    need_base: bool = True,
):
    """The experiment config of a command: the one resolution path of every command that reads data or
    builds a model (olmax.config.recipes.resolve: --recipe or --config, then dotted overrides).

    `shorthands` maps dotted keys to the values of a command's shorthand flags (None = flag not given);
    each given one becomes the override `key=value` before the explicit overrides, so `--seq-len 2048`
    and `data.seq_len=2048` resolve alike, and giving one key both ways is an error. Commands whose
    base may be left out (need_base=False) start from the config defaults (olmax.config) without
    --recipe/--config. An unknown key or a value of the wrong type raises ConfigError naming it."""
    from olmax.config.experiment import ExperimentConfig
    from olmax.config.io import apply_overrides
    from olmax.config.recipes import resolve
    from olmax.errors import ConfigError

    overrides = list(overrides or [])
    given = {k: str(v) if isinstance(v, Path) else v for k, v in (shorthands or {}).items() if v is not None}
    both = sorted(set(given) & {o.split("=", 1)[0].strip() for o in overrides})
    if both:
        raise ConfigError(f"{both[0]} is given both by its flag and as an override; give it once")
    # JSON values are YAML too, and quoting keeps paths such as gs://b/x or demo:heldout strings.
    flags = [f"{k}={json.dumps(list(v) if isinstance(v, (list, tuple)) else v)}" for k, v in given.items()]
    if recipe is None and config is None and not need_base:
        return apply_overrides(ExperimentConfig(), flags + overrides)
    return resolve(recipe, config, flags + overrides)


@app.callback()
def _root() -> None:
    """OLMo 3 pre- and post-training in JAX, with parity against OLMo-core built in."""


# Options that several commands take, declared once so a flag means one thing with one help and one
# type everywhere (tests/cli/test_cli_options.py walks every command and holds them to it). Shorthands
# for one config field, named in their help, resolve through `resolve_experiment`.
SeqLenOpt = typer.Option(None, "--seq-len", help="data.seq_len")


WorkDirOpt = typer.Option(
    None,
    "--work-dir",
    help="data.work_dir: cache of order memmaps and tokenized text (default $OLMAX_CACHE or ~/.cache/olmax)",
)


EvalDataOpt = typer.Option(
    None,
    "--data",
    help="eval.data: token shards, tokenize dirs, globs, mix files, demo:heldout, or .jsonl(.gz) text; repeatable",
)


CkptOpt = typer.Option(..., "--ckpt", help="olmax checkpoint directory (local or gs://)")


StepOpt = typer.Option(None, "--step", help="checkpoint step (default: the latest)")


DtypeOpt = typer.Option(None, "--dtype", help="compute dtype (default: the checkpoint config's)")


TokenizerOpt = typer.Option("dolma2", "--tokenizer", help="dolma2 or a HF tokenizer.json")


def batch_option(default: int):
    return typer.Option(default, "--batch", help="sequences per batch (the same whatever the device count)")


def max_batches_option(default: Optional[int]):
    return typer.Option(default, "--max-batches", help="at most this many batches per data spec")


ChipOpt = typer.Option(
    None, "--chip", help=f"{', '.join(chip_names())} (olmax.fit.chips): the per-device peak, for MFU"
)


TotalDevicesOpt = typer.Option(
    ..., "--total-devices", help="JAX devices of the whole run; the recipe's global batch is kept"
)


# The options `olmax launch` passes on to `olmax train`.
RunDirOpt = typer.Option(..., "--run-dir", help="logs, config and checkpoints (a path or gs://...); rerun to resume")


StopAtOpt = typer.Option(
    None, "--stop-at", help="end after this step (with a checkpoint); the schedule's horizon is unchanged"
)


AllowDataChangeOpt = typer.Option(False, "--allow-data-change", help="resume even though the data fingerprint changed")


AllowConfigChangeOpt = typer.Option(
    False, "--allow-config-change", help="resume even though the global batch or sequence length changed"
)


# `eval tasks` / `eval domains` and `verify`, which runs them.
TaskDataDirOpt = typer.Option(
    None, "--data-dir", help="offline task data: DIR/<task>/<split>/*.arrow (MMLU: DIR/mmlu/<subject>/...)"
)


LimitOpt = typer.Option(None, "--limit", help="at most this many documents per task (a smoke run)")


IncludePathOpt = typer.Option(None, "--include-path", help="directory of your own lm-eval task YAMLs; repeatable")


# `eval loss` and `eval kl` (olmax.evals.scoring.OUTPUT_CHUNK is the default).
LossChunkOpt = typer.Option(
    None,
    "--loss-chunk",
    help="sequence positions per output-layer chunk, bounding the logits' memory (default 256; 0 = all at once)",
)


DomainsByOpt = typer.Option(
    "auto", "--by", help="domains: auto (the `domain` field if present, else the file), field or file"
)


MaxDocsOpt = typer.Option(None, "--max-docs", help="at most this many documents per domain")


def exits_on(label: str, errors: Callable[[], tuple[type[Exception], ...]]):
    """Decorator: the user errors `errors()` lists end the command with `label: message` (the message
    names the file or field) and exit status 2 (USER_ERROR, olmax.rundir.exits), not a traceback. `errors`
    imports them only when one is raised, so commands stay quick to start."""

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except errors() as e:
                typer.echo(f"{label}: {e}", err=True)
                raise typer.Exit(ExitStatus.USER_ERROR) from None

        return wrapper

    return decorate


def write_json(path: Optional[Path], payload: Any) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")


def checkpoint_errors():
    from olmax.checkpoint.store import CheckpointError
    from olmax.convert.tensors import ConversionError

    return (ConversionError, CheckpointError, ConfigError)


def data_errors():
    from olmax.data.order import OrderError
    from olmax.data.sources import DataSourceError
    from olmax.data.tokenize import TokenizeError
    from olmax.data.tokenizer import TokenizerError

    return (DataSourceError, TokenizeError, TokenizerError, OrderError)


def eval_errors():
    # CheckpointError and the data errors are ValueErrors
    return (ValueError, FileNotFoundError)


# A process reaches an accelerator through its device files: libtpu opens a TPU chip as /dev/accel<N>
# (TPU v4 and older) or as a VFIO group /dev/vfio/<N> (later TPUs; /dev/vfio/vfio is only the control
# node), CUDA a GPU as /dev/nvidia<N>, ROCm through /dev/kfd, WSL2 through /dev/dxg.
ACCELERATOR_FILES = ("accel[0-9]*", "vfio/[0-9]*", "nvidia[0-9]*", "kfd", "dxg")


def host_has_accelerator(environ: Mapping[str, str] = os.environ, dev: str = "/dev") -> bool:
    """Whether this host has a TPU or GPU a process could open. Looks at files only: starting the TPU
    runtime to find out is what prints libtpu's start-up errors on a host without one."""
    if "JAX_FORCE_TPU_INIT" in environ:  # JAX's own switch for a TPU it cannot see (jax/_src/cloud_tpu_init.py)
        return True
    return any(glob.glob(os.path.join(dev, pattern)) for pattern in ACCELERATOR_FILES)


def jax_platforms(needs_accelerator: bool, environ: Mapping[str, str] = os.environ, dev: str = "/dev") -> Optional[str]:
    """The JAX_PLATFORMS a command sets before JAX starts (None: leave it as it is). The user's own
    JAX_PLATFORMS stands, even empty; a command that needs only the CPU runs on it (so it never waits
    for, or takes, the accelerator a training run is using); a command that runs the model leaves JAX
    to choose the host's TPU or GPU if it has one, and runs on the CPU otherwise. Left to choose on a
    host without a TPU, JAX tries every backend installed, and libtpu (the `tpu` extra) reports its
    failure to find one as errors."""
    if "JAX_PLATFORMS" in environ:
        return None
    if needs_accelerator and host_has_accelerator(environ, dev):
        return None
    return "cpu"


# What orbax logs (through absl, as WARNING) whenever a CheckpointManager is opened read-only, as olmax
# opens one to read a checkpoint (orbax-checkpoint 0.12.8, checkpoint_manager.py): it restates the
# options olmax chose and reports nothing wrong. Every other absl and orbax warning still shows.
ORBAX_READ_ONLY_NOTICES = frozenset(
    {
        "Given directory is read only=%s",
        "CheckpointManagerOptions.read_only=True, setting save_interval_steps=0.",
        "CheckpointManagerOptions.read_only=True, setting max_to_keep=None.",
    }
)


def _not_a_read_only_notice(record: logging.LogRecord) -> bool:
    return record.msg not in ORBAX_READ_ONLY_NOTICES


# What each shared library of the CUDA plugin (jax-cuda12-plugin 0.10.2: the `gpu-compile` extra, and
# `gpu`) writes on stderr as it loads on a host without an NVIDIA driver, through its own copy of absl,
# before any log set-up could reach it (TF_CPP_MIN_LOG_LEVEL does not silence it): `import jax` loads
# three of them, JAX's backend start-up the PJRT plugin. It reports only that there is no GPU.
CUDA_STUB_NOTICES = (
    b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    b"cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.",
)
GPU_FILES = "nvidia[0-9]*"  # ACCELERATOR_FILES' NVIDIA GPUs


def _installed(name: str):
    """The module spec of `name`, or None where it (or, for a dotted name, its parent package) is not
    installed: `importlib.util.find_spec` raises for a dotted name whose parent is missing."""
    try:
        return importlib.util.find_spec(name)
    except ModuleNotFoundError:
        return None


def load_cuda_plugin_quietly(dev: str = "/dev") -> bool:
    """On a host without an NVIDIA GPU, load the CUDA plugin's libraries (when installed) before JAX
    does, with stderr caught: what they print other than CUDA_STUB_NOTICES is passed on. JAX then finds
    them loaded and nothing is printed again. Returns whether it loaded them."""
    if glob.glob(os.path.join(dev, GPU_FILES)) or "jax" in sys.modules:
        return False
    plugin, pjrt = _installed("jax_cuda12_plugin"), _installed("jax_plugins.xla_cuda12")
    if plugin is None or pjrt is None:
        return False
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            for module in pkgutil.iter_modules(plugin.submodule_search_locations):
                if not module.name.startswith("lib"):  # libmosaic_gpu_runtime: a C library, not a module
                    importlib.import_module(f"jax_cuda12_plugin.{module.name}")
            # the PJRT plugin, as JAX's start-up will open it (dlopen gives both the same handle)
            ctypes.CDLL(os.path.join(next(iter(pjrt.submodule_search_locations)), "xla_cuda_plugin.so"))
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            rest = [
                line
                for line in caught.read().splitlines(keepends=True)
                if not line.rstrip().endswith(CUDA_STUB_NOTICES)
            ]
            if rest:
                sys.stderr.buffer.write(b"".join(rest))
                sys.stderr.flush()
    return True


def introduce_libtpu(topology: str, dev: str = "/dev") -> None:
    """Before libtpu loads to compile for the TPU `topology` on a host without a TPU: tell it the
    slice and the one worker it runs for, as a TPU VM's environment would. Without them libtpu
    reports at start-up, as errors, that it could not find the accelerator type
    (TPU_ACCELERATOR_TYPE) nor the worker hostnames (TPU_WORKER_HOSTNAMES). The compiled program
    does not depend on them (the same HLO and memory for tpu7x, v5p and v6e slices whichever type
    is given). The user's own values stand."""
    from olmax.fit.chips import tpu_type

    slice_type = tpu_type(topology)
    if slice_type is None or host_has_accelerator(dev=dev):
        return
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", slice_type)
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")


def tpu_profile_env(environ: MutableMapping[str, str] = os.environ, sysfs: str = "/sys") -> Optional[str]:
    """On a host with a TPU that JAX may use, put the chip's flag profile (olmax.fit.chips) into
    LIBTPU_INIT_ARGS before libtpu starts, keeping any flag the user set. Returns the chip's name, or None
    where nothing was done (no TPU in the chip table, or JAX_PLATFORMS leaves the TPU out)."""
    from olmax.fit.chips import chip_of_host, with_libtpu_flags

    platforms = environ.get("JAX_PLATFORMS", "")
    if platforms and "tpu" not in platforms.split(","):
        return None
    chip = chip_of_host(environ, sysfs)
    if chip is None or not chip.libtpu_flags:
        return None
    environ["LIBTPU_INIT_ARGS"] = with_libtpu_flags(environ.get("LIBTPU_INIT_ARGS", ""), chip)
    return chip.name


def runs_on(where: str):
    """Decorator of every command but `olmax launch` (whose trainers decide for themselves, on their
    own hosts), applied before the command's body imports JAX: `"cpu"` for a command that needs only
    the CPU, `"accelerator"` for one that runs the model (on the host's TPU or GPU if it has one).
    Sets JAX_PLATFORMS (`jax_platforms`), the host's TPU flag profile (`tpu_profile_env`), the
    persistent compilation cache (olmax.fit.compile_cache), drops orbax's read-only notices and, on a
    host without a GPU, the CUDA plugin's (`load_cuda_plugin_quietly`)."""
    if where not in ("cpu", "accelerator"):
        raise ValueError(f"runs_on: where must be 'cpu' or 'accelerator', got {where!r}")

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            platforms = jax_platforms(where == "accelerator")
            if platforms is not None:
                os.environ["JAX_PLATFORMS"] = platforms  # read once, when jax is first imported
            if where == "accelerator" and host_has_accelerator():
                tpu_profile_env()
            # XLA's C++ INFO log (the GPU compiler's notes on a compile without a GPU, the latency-hiding
            # scheduler's memory figures): warnings and errors still show
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
            compile_cache.enable()  # compiled programs kept for the next run on this host
            load_cuda_plugin_quietly()
            from absl import logging as absl_logging

            absl_logger = absl_logging.get_absl_logger()
            if _not_a_read_only_notice not in absl_logger.filters:
                absl_logger.addFilter(_not_a_read_only_notice)
            return fn(*args, **kwargs)

        wrapper.runs_on = where
        return wrapper

    return decorate
