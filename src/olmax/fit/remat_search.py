"""`model.remat=auto`: the least recompute that the target's compiler fits in device memory.

The candidates are remat.AUTO_LADDER's sets, most kept first, each in the compiler's order of the
backward pass and then the serial one (model.remat_serial), down to `full`. A candidate fits when
the compiler accepts the step and its peak is within the chip's budget (Chip.hbm_headroom of
hbm_limit_gib, compile-check's `fits`); the choice is the first that fits. The sets are nested, so
the step's memory falls down the ladder, and a bisection over the sets finds the first one that
fits in one of its orders: two or three of the six sets are compiled, a set's serial order only
where its compiler's order does not fit; a step that clearly fits keeping the most (a small model on
a large chip, TOP_FIRST) tries that set first, and one compile decides. A step the TPU compiler
refuses (out of HBM) stops at its buffer assignment, under a minute for the 7B; one it accepts runs to
the end (5-12 minutes for the 7B on a 2-core host), so a typical choice costs two or three whole
compiles (docs/performance/recipes-on-slices.md).

The choice and every candidate's figures are a record, kept in a JSON file (RECORD_FILE: in the run
directory for `olmax train`, in the cache directory for `olmax compile-check`) under a key of what
decides them (search_key): the config fields that change the step's shapes, operations or memory
(step_fields: the objective and its section, the batch, the sequence, the masks, the loss's
normalisation, the model, the mesh; not the run's length, learning rate, seeds, logging or
checkpoints), the devices, the compiler's flags, olmax's code and the versions of jax, jaxlib and the
compiler. A restart finds its record and compiles nothing more; a resume on other devices, with other
flags or other code searches again.

A step that fits under no policy is an error that names what would, with figures (no_fit_message).
The compiling itself is olmax.fit.compile_check's (choose_remat); this module decides what to compile.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import json
import os
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable, Mapping, Optional

import jax
import jax.numpy as jnp

import olmax
from olmax.config.experiment import ExperimentConfig
from olmax.config.io import apply_overrides
from olmax.config.remat import AUTO_LADDER
from olmax.errors import ConfigError
from olmax.model.sharding import make_mesh
from olmax.rundir import paths
from olmax.step.state import abstract_state, per_device_bytes
from olmax.step.train_step import batch_layout

RECORD_FILE = "remat_search.json"


@dataclass(frozen=True)
class Candidate:
    """One compiled candidate: model.remat and model.remat_serial, and what the compiler said."""

    remat: str
    serial: bool
    peak_gib: Optional[float]  # None: the compiler refused the step
    fits: bool
    compile_s: float
    refused: Optional[str] = None  # the compiler's reason, when it refused


# compile(cfg, mesh) -> the Candidate of cfg's step (cfg.model.remat and remat_serial) on mesh
Compile = Callable[[ExperimentConfig, object], Candidate]


def with_remat(cfg: ExperimentConfig, remat: str, serial: bool) -> ExperimentConfig:
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, remat=remat, remat_serial=serial))


# A step whose state and every activation the most kept set keeps take at most this fraction of the
# budget (a small model on a large chip) tries that set first: one compile where the bisection, which
# starts in the middle of the ladder, takes three. The tally leaves out what no tally sees (XLA's
# temporaries: the output layer's logits chunk, the gradient sums in flight), hence the margin; a top
# set that does not fit after all costs one compile more. The 190m shape at 2 x 8192 tokens on a v5e:
# 8.1 GiB tallied, 10.8 GiB compiled, of a 15.0 GiB budget.
TOP_FIRST = 0.6


def tallied_bytes(cfg: ExperimentConfig, mesh) -> int:
    """Per device: the train state, the float32 gradients being summed, and the block activations the
    ladder's most kept set keeps (with each block's input) for one micro-batch: a lower bound of the
    step's peak under that set."""
    model, layout = cfg.model, batch_layout(cfg, mesh)
    with jax.set_mesh(mesh):
        state = abstract_state(cfg, mesh)
    params = per_device_bytes(state.params) * 4 // jnp.dtype(model.param_dtype).itemsize  # float32 sums
    heads, tensor = model.n_heads * model.head_dim, mesh.shape["tensor"]
    widths = {
        "layer_input": model.d_model,
        "q_proj": heads // tensor,
        "k_proj": model.n_kv_heads * model.head_dim // tensor,
        "v_proj": model.n_kv_heads * model.head_dim // tensor,
        "attn_context": heads // tensor,
        "o_proj": model.d_model,
        "mlp_gate": model.mlp_hidden // tensor,
        "mlp_up": model.mlp_hidden // tensor,
        "mlp_down": model.d_model,
    }
    kept = ("layer_input", *AUTO_LADDER[0].split(","))
    rows = cfg.rows_per_step // cfg.trainer.global_batch  # a DPO pair is two rows
    tokens = layout.micro_batch * rows * cfg.data.seq_len // mesh.shape["context"]
    activations = tokens * model.n_layers * sum(widths[t] for t in kept) * jnp.dtype(model.compute_dtype).itemsize
    return per_device_bytes(state) + params + activations


def bisect(
    cfg: ExperimentConfig, mesh, compile: Compile, *, top_first: bool = False
) -> tuple[Optional[Candidate], list[Candidate]]:
    """(the first candidate of the ladder that fits, or None; every candidate compiled, in order).
    Each probe of a set compiles the compiler's order and, if that does not fit, the serial one: the
    two orders of one set are not ordered by memory (the 7B's seeds' set on Ironwood fits in the
    compiler's order only, on v5p in the serial order only), the sets are. `top_first`: probe the most
    kept set before bisecting the rest (TOP_FIRST)."""
    tried: list[Candidate] = []

    def first_fitting_order(remat: str) -> Optional[Candidate]:
        for serial in (False, True):
            tried.append(compile(with_remat(cfg, remat, serial), mesh))
            if tried[-1].fits:
                return tried[-1]
        return None

    lo, hi, best = 0, len(AUTO_LADDER), None  # hi: the most kept set known to fit (none yet)
    if top_first:
        best = first_fitting_order(AUTO_LADDER[0])
        if best is not None:
            return best, tried
        lo = 1
    while lo < hi:
        mid = (lo + hi) // 2
        fitting = first_fitting_order(AUTO_LADDER[mid])
        if fitting is None:
            lo = mid + 1
        else:
            hi, best = mid, fitting
    return best, tried


# What a record is keyed by (search_key): what changes the compiled step's shapes, operations or memory,
# and nothing else, so that a record is never read for a step it does not describe (an LM record for a
# DPO step of twice the rows would not fit) and a run that changes only what the step never sees
# (its length, learning rate, seeds, logging, checkpoints) reads its record instead of searching again.
# Every field of the sections the step is built from (olmax.step.train_step) is keyed, and the objective's
# own section, but for UNKEYED: a field added to those sections later is keyed until it is listed here.
STEP_SECTIONS = ("model", "data", "optimizer", "trainer", "mesh")
UNKEYED = frozenset(
    {
        "model.remat",  # what the search chooses
        "model.remat_serial",
        "model.init_std",  # the init's, not the step's
        # scalars the step only multiplies by: no shape, operation or buffer depends on them (the learning
        # rate and its schedule, a section unkeyed as a whole, are of this kind too)
        "optimizer.lr",
        "optimizer.b1",
        "optimizer.b2",
        "optimizer.eps",
        "optimizer.weight_decay",
        "optimizer.max_grad_norm",  # always > 0: the clipping is in every step
        "optimizer.skip_sigma",
        # the run's length, logging and seeds
        "trainer.max_steps",
        "trainer.log_every",
        "trainer.seed",
        # where the data comes from and how the loader reads it: the step sees (global_batch, seq_len) rows
        # and the masks the keyed data fields make
        "data.paths",
        "data.max_target_seq_len",
        "data.seed",
        "data.tokenizer",
        "data.vocab_size",
        "data.eos_token_id",
        "data.bos_token_id",
        "data.mix_base",
        "data.mix_tokenizer_dir",
        "data.work_dir",
        "data.num_workers",
        "data.source_group_size",
        "data.source_permutation_seed",
        "data.long_doc_strategy",
        "data.use_array_if_local",
    }
)
# The compiler's flags: XLA's and libtpu's (the chip profile olmax.cli.common.tpu_profile_env sets)
COMPILER_FLAGS = ("XLA_FLAGS", "LIBTPU_INIT_ARGS")


def objective_section(cfg: ExperimentConfig):
    """trainer.objective's config section (cfg.dpo, cfg.grpo, a plug-in's), None for one without (lm)."""
    return cfg.objective_config


def step_fields(cfg: ExperimentConfig) -> dict:
    """The config fields the compiled step depends on (STEP_SECTIONS' but UNKEYED, the objective's
    section), as plain values."""
    fields = {
        section: {
            name: value
            for name, value in dataclasses.asdict(getattr(cfg, section)).items()
            if f"{section}.{name}" not in UNKEYED
        }
        for section in STEP_SECTIONS
    }
    section = objective_section(cfg)
    fields["objective"] = None if section is None else dataclasses.asdict(section)
    return fields


def step_fingerprint(cfg: ExperimentConfig) -> str:
    """A digest of step_fields."""
    return hashlib.sha256(json.dumps(step_fields(cfg), sort_keys=True).encode()).hexdigest()[:16]


def compiler_flags(environ: Mapping[str, str] = os.environ) -> dict[str, list[str]]:
    """COMPILER_FLAGS' flags, each variable's sorted (their order does not matter to XLA)."""
    return {name: sorted(environ.get(name, "").split()) for name in COMPILER_FLAGS}


@functools.cache
def source_digest() -> str:
    """A digest of olmax's own code: its modules' paths and contents. olmax's version number stays
    0.1.0 through every change, and an installed olmax has no git commit to read (nor does a commit
    say what a work tree changed), so the code itself is hashed: 150 files, about 20 ms, once a process."""
    return tree_digest(Path(olmax.__file__).parent)


def tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(f"{path.relative_to(root).as_posix()}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def describe_devices(devices) -> str:
    """What a step is compiled for, the same for a TPU topology's abstract devices and a slice's own:
    how many of which kind, the chips' grid, and the slices (TPU) or processes (GPU nodes)."""
    first = devices[0]
    words = [f"{len(devices)} x {first.device_kind}"]
    coords = [getattr(d, "coords", None) for d in devices]
    if all(c is not None for c in coords):
        words.append("x".join(str(max(c[i] for c in coords) + 1) for i in range(len(coords[0]))))
    slices = len({getattr(d, "slice_index", 0) or 0 for d in devices})
    if slices > 1:
        words.append(f"{slices} slices")
    if first.platform == "gpu":
        words.append(f"{len({d.process_index for d in devices})} nodes")
    return ", ".join(words)


def _version(package: str) -> Optional[str]:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def search_key(cfg: ExperimentConfig, mesh) -> dict:
    """What decides a search's outcome: the step (step_fields), the devices and their mesh, the
    compiler's flags, olmax's code (source_digest) and the versions of jax, jaxlib and the compiler's
    library (libtpu on a TPU, the CUDA plugin on a GPU)."""
    devices = list(mesh.devices.flat)
    packages = ["jax", "jaxlib", *{"tpu": ["libtpu"], "gpu": ["jax-cuda12-plugin"]}.get(devices[0].platform, [])]
    return {
        "step": step_fingerprint(cfg),
        "devices": describe_devices(devices),
        "mesh": dict(mesh.shape),
        "flags": compiler_flags(),
        "versions": {"olmax": source_digest(), **{p: _version(p) for p in packages}},
    }


def _key_id(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _records(directory: str, file: str) -> dict:
    text = paths.read_text(directory, file)
    return json.loads(text) if text else {}


def cached(directory: Optional[str], key: dict, file: str = RECORD_FILE) -> Optional[dict]:
    """The record of an earlier search with this key in DIRECTORY/FILE, or None."""
    if directory is None:
        return None
    record = _records(directory, file).get(_key_id(key))
    return record if record is not None and record["key"] == key else None


def store(directory: Optional[str], record: dict, file: str = RECORD_FILE) -> None:
    """Add the record to DIRECTORY/FILE (one entry per key: a later search replaces it)."""
    if directory is None:
        return
    records = _records(directory, file)
    records[_key_id(record["key"])] = record
    paths.makedirs(directory)
    paths.write_text(directory, file, json.dumps(records, indent=2, sort_keys=True) + "\n")


def new_record(key: dict, best: Candidate, tried: list[Candidate], budget_gib: float, search_s: float) -> dict:
    return {
        "key": key,
        "remat": best.remat,
        "remat_serial": best.serial,
        "candidates": [dataclasses.asdict(c) for c in tried],
        "budget_gib": budget_gib,
        "search_s": search_s,
        "searched": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _order(serial: bool) -> str:
    return "serial" if serial else "compiler's order"


def _figure(c: Candidate) -> str:
    if c.peak_gib is None:
        return f"refused by the compiler ({c.refused})"
    return f"peak {c.peak_gib:.2f} GiB, {'fits' if c.fits else 'over the budget'}"


def format_candidate(c: Candidate) -> str:
    return f"  {c.remat}, {_order(c.serial)}: {_figure(c)} [{c.compile_s:.0f} s]"


def format_choice(record: dict, source: Optional[str] = None) -> str:
    """The choice in one line; `source` names the file a cached record was read from."""
    head = (
        f"model.remat=auto on {record['key']['devices']} (budget {record['budget_gib']:.2f} GiB per device): "
        f"{record['remat']}, {_order(record['remat_serial'])}"
    )
    if source is not None:
        return f"{head}, as searched on {record['searched']} ({source})"
    return f"{head}; {len(record['candidates'])} compiles in {record['search_s']:.0f} s"


def format_search(record: dict, source: Optional[str] = None) -> list[str]:
    """The choice and every candidate's figures."""
    return [format_choice(record, source)] + [format_candidate(Candidate(**c)) for c in record["candidates"]]


def _smaller_divisor(n: int, below: int) -> int:
    """The largest divisor of n below `below`."""
    return max(d for d in range(1, below) if n % d == 0)


def no_fit_message(
    cfg: ExperimentConfig, mesh, where: str, tried: list[Candidate], budget: float, compile: Compile
) -> str:
    """Why no policy fits (the leanest candidate's figures) and what would, with figures: a smaller
    micro-batch (gradient accumulation keeps the global batch), a context or tensor axis, more
    devices. The first suggestion that runs on these devices is compiled (recomputing whole blocks,
    in the order that was leaner without it) and its figure given; the others are estimated: the
    parameters and optimizer state per device exactly, the rest of the peak in proportion to the
    tokens a device holds at a time."""
    devices = list(mesh.devices.flat)
    layout = batch_layout(cfg, mesh)
    # tokens of one instance of the global batch (a DPO pair is two rows)
    seq, context = cfg.data.seq_len * cfg.rows_per_step // cfg.trainer.global_batch, mesh.shape["context"]

    def state_gib(c: ExperimentConfig, m) -> float:
        with jax.set_mesh(m):
            return per_device_bytes(abstract_state(c, m)) / 2**30

    state = state_gib(cfg, mesh)
    full = [c for c in tried if c.remat == AUTO_LADDER[-1] and c.peak_gib is not None]
    least = min(full, key=lambda c: c.peak_gib) if full else None
    tokens = layout.micro_batch * seq // context  # per device per forward/backward

    def estimate(state_after: float, tokens_after: int) -> str:
        if least is None:
            return ""
        return f"; about {state_after + (least.peak_gib - state) * tokens_after / tokens:.1f} GiB"

    options: list[tuple[str, str]] = []  # (override, what it changes), each on these devices
    if layout.micro_batch > 1:
        m = _smaller_divisor(layout.per_device, layout.micro_batch)
        options.append(
            (
                f"trainer.micro_batch_size={m}",
                f"{layout.per_device // m} micro-batches of {m} per device instead of {layout.accum_steps} of "
                f"{layout.micro_batch}, accumulated (the global batch stays {cfg.trainer.global_batch}): "
                f"{m * seq // context} tokens per device at a time{estimate(state, m * seq // context)}",
            )
        )
    fsdp = mesh.shape["fsdp"]
    for axis in ("context", "tensor"):
        size = mesh.shape[axis] * 2
        # with no -1 axis to give up the devices (e.g. mesh.data=3 mesh.fsdp=32), fsdp gives them
        tries = [[f"mesh.{axis}={size}"]]
        if cfg.mesh.fsdp > 1 and fsdp % 2 == 0:
            tries.append([f"mesh.{axis}={size}", f"mesh.fsdp={fsdp // 2}"])
        for overrides in tries:
            try:
                changed = apply_overrides(cfg, overrides)
                changed_mesh = make_mesh(changed.mesh, devices)
                micro = batch_layout(changed, changed_mesh).micro_batch
                state_after = state_gib(changed, changed_mesh)
                break
            except ConfigError:  # the axis does not divide the devices, the heads, the sequence or its chunks
                continue
        else:
            continue
        if axis == "context" and micro * seq // size < tokens:
            after = micro * seq // size
            what = f"each sequence over {size} devices, {after} tokens per device at a time"
            options.append((" ".join(overrides), what + estimate(state_after, after)))
        elif axis == "tensor":
            what = (
                f"heads and MLP over {size} devices ({cfg.model.n_heads // size} heads each); parameters and "
                f"optimizer state {state_after:.2f} GiB per device"
            )
            options.append((" ".join(overrides), what))
    figure = (
        "the compiler refused it"
        if least is None
        else f"peak {least.peak_gib:.2f} GiB ({_order(least.serial)}) > the budget of {budget:.2f} GiB per device"
    )
    lines = [
        f"{cfg.name} does not fit on {where} under any remat policy, down to recomputing whole blocks (full): "
        f"{figure}; "
        f"parameters and optimizer state take {state:.2f} GiB per device. What would fit:"
    ]
    for i, (override, what) in enumerate(options):
        lines.append(f"- {override}: {what}")
        if i == 0:
            serial = least is not None and least.serial
            checked = with_remat(apply_overrides(cfg, override.split()), AUTO_LADDER[-1], serial)
            c = compile(checked, make_mesh(checked.mesh, devices))
            lines[-1] += f"; checked with model.remat=full ({_order(serial)}): {_figure(c)}"
    if cfg.trainer.global_batch % (2 * layout.batch_shards) == 0:
        per_device = layout.per_device // 2
        after = min(layout.micro_batch, per_device) * seq // context
        lines.append(
            f"- {2 * len(devices)} devices instead of {len(devices)}: {per_device} instances per device, "
            f"parameters and optimizer state {state / 2:.2f} GiB per device{estimate(state / 2, after)}"
        )
    return "\n".join(lines)
