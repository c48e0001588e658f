"""Weights in and out of olmax: HF transformers (`hf`), OLMo-core state dicts (`olmo_core`), and the
logit/per-layer comparison that proves a conversion right (`parity`).

Both PyTorch layouts hold the same tensors under different names, one tensor per layer, with
`nn.Linear` weights stored (out, in). olmax stacks the layers on a leading axis and stores matrices
(in, out) (olmax.model.olmo3.param_specs). This module holds what the formats share: how each olmax
parameter relates to its torch tensor (`LAYOUT`), a streaming safetensors reader, and the two loops
that move tensors across ONE AT A TIME (`read_params`, `torch_tensors`), so that converting the 7B
holds the olmax parameters plus one parameter's worth in memory, never a second full copy
(docs/conversion.md, "Streaming and memory").

Vocabulary padding: olmax pads the embedding rows and LM-head columns to a multiple of 128, as
OLMo-core does. A source that has only the real vocabulary (HF) gets ZERO rows/columns there, so the
padded ids embed to zero and get a logit of exactly 0; writing HF drops them again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Protocol, Sequence

import jax
import ml_dtypes
import numpy as np
from safetensors import safe_open

from olmax.config.model import ModelConfig
from olmax.model.olmo3 import ParamSpec, param_specs


class ConversionError(ValueError):
    """Input that cannot be converted; the message names the file, tensor or config field."""


# How an olmax parameter (one layer of it, for the stacked ones) relates to its torch tensor.
LINEAR = "linear"  # torch (out, in) -> olmax (in, out)
VECTOR = "vector"  # norm weights: the same in both
EMBED = "embed"  # torch (vocab, d_model) -> olmax rows padded to padded_vocab_size
LM_HEAD = "lm_head"  # torch (vocab, d_model) -> olmax (d_model, padded_vocab_size)

LAYOUT = {
    "embed": EMBED,
    "layers.q_proj": LINEAR,
    "layers.k_proj": LINEAR,
    "layers.v_proj": LINEAR,
    "layers.o_proj": LINEAR,
    "layers.q_norm": VECTOR,
    "layers.k_norm": VECTOR,
    "layers.attn_norm": VECTOR,
    "layers.gate_proj": LINEAR,
    "layers.up_proj": LINEAR,
    "layers.down_proj": LINEAR,
    "layers.mlp_norm": VECTOR,
    "final_norm": VECTOR,
    "lm_head": LM_HEAD,
}

# safetensors dtype tags and the numpy dtypes they read as (bfloat16 through ml_dtypes).
SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "BF16": "bfloat16", "F16": "float16"}


def flat_specs(cfg: ModelConfig) -> dict[str, ParamSpec]:
    """param_specs flattened to dotted keys ("embed", "layers.q_proj", ...), in declaration order."""
    specs = param_specs(cfg)
    flat = {k: v for k, v in specs.items() if k != "layers"}
    flat.update({f"layers.{k}": v for k, v in specs["layers"].items()})
    if set(flat) != set(LAYOUT):
        raise AssertionError(f"LAYOUT is out of date with param_specs: {sorted(set(flat) ^ set(LAYOUT))}")
    return flat


def require_empty_output(out: Path) -> None:
    """Conversions write into a new or empty directory, and check that before any slow reading."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConversionError(f"output {out} exists and is not an empty directory")


def numpy_dtype(name: str) -> np.dtype:
    """numpy dtype for a dtype name, bfloat16 included (numpy itself does not know it)."""
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def nest_get(tree: dict, key: str):
    group, _, name = key.rpartition(".")
    return tree[group][name] if group else tree[name]


def nest(flat: dict) -> dict:
    """{"layers.q_proj": a, "embed": b} -> {"layers": {"q_proj": a}, "embed": b}."""
    out: dict = {}
    for key, value in flat.items():
        group, _, name = key.rpartition(".")
        (out.setdefault(group, {}) if group else out)[name] = value
    return out


def source_names(cfg: ModelConfig, names: dict[str, str]) -> dict[str, list[str]]:
    """The source tensor names of each olmax key; `names` maps a key to a template with `{i}` for layers."""
    return {
        k: [names[k].format(i=i) for i in range(cfg.n_layers)] if k.startswith("layers.") else [names[k]]
        for k in flat_specs(cfg)
    }


class TensorSource(Protocol):
    """Named tensors read one at a time (a safetensors checkpoint, a torch state dict, ...)."""

    def names(self) -> list[str]: ...

    def shape(self, name: str) -> tuple[int, ...]: ...

    def dtype(self, name: str) -> str: ...

    def get(self, name: str) -> np.ndarray: ...


class SafetensorsSource:
    """Tensors spread over one or more .safetensors files. Only the headers are read up front; `get`
    opens the file, copies that one tensor out of the memory map and closes it again, so the pages
    of the file do not stay mapped (and counted) while the rest is converted."""

    def __init__(self, files: Sequence[Path]):
        self._where: dict[str, Path] = {}
        self._info: dict[str, tuple[tuple[int, ...], str]] = {}
        for path in files:
            if not Path(path).is_file():
                raise ConversionError(f"safetensors file {path} does not exist")
            with safe_open(str(path), framework="np") as handle:
                for name in handle.keys():
                    if name in self._where:
                        raise ConversionError(f"tensor {name} appears in more than one file (second: {path})")
                    info = handle.get_slice(name)
                    self._where[name] = Path(path)
                    self._info[name] = (tuple(info.get_shape()), info.get_dtype())

    def names(self) -> list[str]:
        return list(self._where)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._info[name][0]

    def dtype(self, name: str) -> str:
        tag = self._info[name][1]
        if tag not in SAFETENSORS_DTYPES:
            raise ConversionError(f"tensor {name} has dtype {tag}; only {sorted(SAFETENSORS_DTYPES)} are supported")
        return SAFETENSORS_DTYPES[tag]

    def get(self, name: str) -> np.ndarray:
        with safe_open(str(self._where[name]), framework="np") as handle:
            return handle.get_tensor(name)


def source_dtype(source: TensorSource) -> str:
    """The dtype the source's tensors are stored in (the widest one if they are mixed): `torch_tensors`
    writes this back, so a round trip reproduces the original bytes."""
    dtypes = sorted({source.dtype(n) for n in source.names()})
    return max(dtypes, key=lambda d: numpy_dtype(d).itemsize)


def _check_names(cfg: ModelConfig, source: TensorSource, names: dict[str, str], what: str) -> None:
    wanted = {n for group in source_names(cfg, names).values() for n in group}
    have = set(source.names())
    missing, unexpected = sorted(wanted - have), sorted(have - wanted)
    if missing or unexpected:

        def listing(xs):
            return ", ".join(xs[:8]) + (f" (+{len(xs) - 8} more)" if len(xs) > 8 else "")

        parts = ([f"missing {len(missing)} tensors: {listing(missing)}"] if missing else []) + (
            [f"{len(unexpected)} unexpected tensors: {listing(unexpected)}"] if unexpected else []
        )
        raise ConversionError(f"{what} does not match the model config ({cfg.n_layers} layers): " + "; ".join(parts))


def _source_shape(kind: str, olmax_shape: tuple[int, ...], vocab_rows: int) -> tuple[int, ...]:
    if kind == LINEAR:
        return olmax_shape[::-1]
    if kind == EMBED:
        return (vocab_rows, olmax_shape[1])
    if kind == LM_HEAD:
        return (vocab_rows, olmax_shape[0])
    return olmax_shape


def _to_olmax(kind: str, tensor: np.ndarray, out: np.ndarray) -> None:
    """Write one source tensor into its (preallocated, per-layer) olmax slot; padding stays zero."""
    if kind == LINEAR:
        out[...] = tensor.T
    elif kind == EMBED:
        out[: tensor.shape[0]] = tensor
    elif kind == LM_HEAD:
        out[:, : tensor.shape[0]] = tensor.T
    else:
        out[...] = tensor


def read_params(
    cfg: ModelConfig, source: TensorSource, names: dict[str, str], *, vocab_rows: Sequence[int], what: str
) -> dict:
    """Build the olmax parameter tree (jax arrays on the host CPU, `cfg.param_dtype`) from `source`,
    one tensor at a time.

    `names` maps each olmax key (see LAYOUT) to the source tensor name, `{i}` standing for the layer.
    `vocab_rows` lists the embedding row counts accepted (the real vocabulary, and for sources that
    keep it, the padded one). Every source tensor must be used and every olmax parameter found.
    """
    _check_names(cfg, source, names, what)
    dtype = numpy_dtype(cfg.param_dtype)
    cpu = jax.devices("cpu")[0]
    embed_rows = source.shape(names["embed"])[0]
    if embed_rows not in vocab_rows:
        raise ConversionError(
            f"{what}: {names['embed']} has {embed_rows} rows; the model config's vocabulary "
            f"needs {' or '.join(map(str, sorted(set(vocab_rows))))}"
        )
    flat = {}
    all_names = source_names(cfg, names)
    for key, spec in flat_specs(cfg).items():
        kind = LAYOUT[key]
        layered = key.startswith("layers.")
        # Zeros, not empty: the vocabulary padding must read as zero.
        out = np.zeros(spec.shape, dtype)
        for i, name in enumerate(all_names[key]):
            slot = out[i] if layered else out
            expected = _source_shape(kind, slot.shape, embed_rows)
            if source.shape(name) != expected:
                raise ConversionError(
                    f"{what}: tensor {name} has shape {source.shape(name)}, the model config needs {expected}"
                )
            _to_olmax(kind, source.get(name), slot)
        # Handed over as a jax array on the host CPU: Orbax saves jax arrays without the extra
        # full-size copy it makes of numpy leaves (docs/conversion.md, "Streaming and memory"), and
        # the numpy buffer is freed here, so the peak is the parameters plus one leaf.
        flat[key] = jax.device_put(out, cpu)
        del out
    return nest(flat)


def torch_tensors(
    params: dict, cfg: ModelConfig, names: dict[str, str], dtype: str
) -> Iterator[tuple[str, np.ndarray]]:
    """The inverse of `read_params`: (source name, contiguous array in `dtype`) one tensor at a time,
    embedding first, then layer by layer, with the vocabulary padding dropped.

    `params` may hold numpy or jax arrays; jax arrays on one CPU device are read without a copy.
    """
    out_dtype = numpy_dtype(dtype)
    arrays = {key: np.asarray(nest_get(params, key)) for key in flat_specs(cfg)}

    def convert(key: str, a: np.ndarray) -> np.ndarray:
        kind = LAYOUT[key]
        if kind == LINEAR:
            a = a.T
        elif kind == EMBED:
            a = a[: cfg.vocab_size]
        elif kind == LM_HEAD:
            a = a[:, : cfg.vocab_size].T
        return np.ascontiguousarray(a, dtype=out_dtype)

    layer_keys = [k for k in arrays if k.startswith("layers.")]
    yield names["embed"], convert("embed", arrays["embed"])
    for i in range(cfg.n_layers):
        for key in layer_keys:
            yield names[key].format(i=i), convert(key, arrays[key][i])
    for key in ("final_norm", "lm_head"):
        yield names[key], convert(key, arrays[key])
