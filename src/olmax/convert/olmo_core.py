"""OLMo-core model weights -> olmax checkpoints.

An OLMo-core state dict carries no architecture, so the ModelConfig comes from the caller (a recipe
plus overrides on the command line). Three containers are read, one tensor at a time:

  *.safetensors         a saved `model.state_dict()` (no torch needed)
  *.pt / *.pth / *.bin  `torch.save(model.state_dict())`, memory-mapped by torch.load(mmap=True)
  a directory           an OLMo-core distributed (torch.distributed.checkpoint) checkpoint: the
                        `stepN` directory its trainer writes, or the `stepN/model_and_optim` in it;
                        its `model.*` entries (the optimizer state is read by `warm_start_from_olmo_core`)

`warm_start_from_olmo_core` turns such a checkpoint into an olmax warm-start checkpoint (the layout
`olmax.checkpoint.surgery.warm_start` writes) with the parameters, AdamW's moments and step counter, and the
trainer's step, so a stage-2 run can start from an OLMo-core stage-1 checkpoint.

OLMo-core keeps the embedding padded (e.g. 100352 rows for the 100278-entry dolma2 vocabulary); the
padded rows and LM-head columns are kept as they are. A state dict with exactly `vocab_size` rows is
padded with zeros, as for HF.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Optional

import jax
import ml_dtypes
import numpy as np

from olmax.checkpoint.store import save_params
from olmax.config.experiment import ExperimentConfig
from olmax.config.model import ModelConfig
from olmax.convert.hf import OLMO3_SPECIAL_TOKENS
from olmax.convert.tensors import (
    ConversionError,
    SafetensorsSource,
    TensorSource,
    read_params,
    require_empty_output,
    source_dtype,
)
from olmax.extras import require
from olmax.model.olmo3 import count_params

OLMO_CORE_NAMES = {
    "embed": "embeddings.weight",
    "layers.q_proj": "blocks.{i}.attention.w_q.weight",
    "layers.k_proj": "blocks.{i}.attention.w_k.weight",
    "layers.v_proj": "blocks.{i}.attention.w_v.weight",
    "layers.o_proj": "blocks.{i}.attention.w_out.weight",
    "layers.q_norm": "blocks.{i}.attention.q_norm.weight",
    "layers.k_norm": "blocks.{i}.attention.k_norm.weight",
    "layers.attn_norm": "blocks.{i}.attention_norm.weight",
    "layers.gate_proj": "blocks.{i}.feed_forward.w1.weight",
    "layers.down_proj": "blocks.{i}.feed_forward.w2.weight",
    "layers.up_proj": "blocks.{i}.feed_forward.w3.weight",
    "layers.mlp_norm": "blocks.{i}.feed_forward_norm.weight",
    "final_norm": "lm_head.norm.weight",
    "lm_head": "lm_head.w_out.weight",
}

TORCH_SUFFIXES = (".pt", ".pth", ".bin")
# OLMo-core's checkpointer (olmo_core/train/checkpoint.py, 3.0.0) writes a `stepN` directory holding
# the distributed checkpoint of {"model": model_state, "optim": optim_state} in `model_and_optim/`
# and the trainer's state (global_step, global_train_tokens_seen, ...) as torch.save in
# `train/rank<R>.pt`. The optimizer state is torch's, keyed by parameter name: one `step`,
# `exp_avg` and `exp_avg_sq` per parameter under `optim.state.<name>.` (flattened or not).
DCP_SUBDIR = "model_and_optim"
TRAIN_STATE = Path("train") / "rank0.pt"
DCP_MODEL_PREFIX = "model."
DCP_OPTIM_PREFIX = "optim.state."
MOMENT_KEYS = (".exp_avg", ".exp_avg_sq")  # AdamW's first and second moments: olmax's mu and nu
STEP_KEY = ".step"  # AdamW's per-parameter count of applied updates (float), olmax's AdamWState.count


def _torch():
    return require("torch", "reading a torch checkpoint")


def _to_numpy(tensor) -> np.ndarray:
    """A CPU torch tensor as numpy in the same dtype (bfloat16 through ml_dtypes, bit for bit)."""
    torch = _torch()
    tensor = tensor.detach().contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def _dtype_name(torch_dtype) -> str:
    return str(torch_dtype).removeprefix("torch.")


class TorchFileSource:
    """`torch.save(model.state_dict())`, memory-mapped: a tensor's bytes are read when it is used."""

    def __init__(self, path: Path):
        torch = _torch()
        try:
            state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        except Exception as e:  # torch raises many types for a bad file; all mean the same here
            raise ConversionError(f"cannot read {path} as a torch state dict: {e}") from None
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise ConversionError(f"{path} does not hold a flat state dict of tensors (as model.state_dict() gives)")
        self._state = state

    def names(self) -> list[str]:
        return list(self._state)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._state[name].shape)

    def dtype(self, name: str) -> str:
        return _dtype_name(self._state[name].dtype)

    def get(self, name: str) -> np.ndarray:
        return _to_numpy(self._state[name])


def _olmo_core_checkpoint():
    _torch()
    return require("olmo_core.distributed.checkpoint", "reading an OLMo-core distributed checkpoint")


def dcp_directory(path: str | Path) -> Path:
    """The distributed checkpoint of an OLMo-core checkpoint: `path/model_and_optim` when `path` is
    the `stepN` directory OLMo-core's trainer writes, else `path` itself."""
    path = Path(path)
    if not path.is_dir():
        raise ConversionError(f"OLMo-core checkpoint directory {path} does not exist")
    return path / DCP_SUBDIR if (path / DCP_SUBDIR).is_dir() else path


class DistributedCheckpointSource:
    """The tensors of an OLMo-core distributed checkpoint whose keys are `prefix + NAME + suffix`, by
    NAME: the model (`model.NAME`) or one optimizer moment (`optim.state.NAME.exp_avg`). Each `get`
    reads one key with OLMo-core's own reader (its files carry storage metadata that torch's plain
    FileSystemReader does not read)."""

    def __init__(self, path: Path, prefix: str = DCP_MODEL_PREFIX, suffix: str = ""):
        olmo_ckpt = _olmo_core_checkpoint()
        self._olmo_ckpt, self._path, self._prefix, self._suffix = olmo_ckpt, path, prefix, suffix
        try:
            metadata = olmo_ckpt.get_checkpoint_metadata(str(path))
        except Exception as e:  # a missing/corrupt .metadata file surfaces as several error types
            raise ConversionError(f"{path} is not a readable OLMo-core distributed checkpoint: {e}") from None
        self._entries = {
            k[len(prefix) : len(k) - len(suffix)]: v
            for k, v in metadata.state_dict_metadata.items()
            if k.startswith(prefix) and k.endswith(suffix) and hasattr(v, "size")
        }
        if not self._entries:
            raise ConversionError(f"{path} holds no '{prefix}*{suffix}' tensors")

    def names(self) -> list[str]:
        return list(self._entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._entries[name].size)

    def dtype(self, name: str) -> str:
        return _dtype_name(self._entries[name].properties.dtype)

    def load(self, names: list[str]) -> list:
        """The torch tensors of `names`, read in one pass."""
        keys = [self._prefix + n + self._suffix for n in names]
        from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

        try:
            return list(self._olmo_ckpt.load_keys(str(self._path), keys))
        except (Exception, CheckpointException) as e:  # a missing or truncated file: several error types
            if isinstance(e, CheckpointException):  # its message is a traceback; name the cause instead
                e = next(iter(e.failures.values()))[0]
            shown = keys[0] if len(keys) == 1 else f"{keys[0]} (and {len(keys) - 1} more)"
            raise ConversionError(
                f"cannot read {shown} from OLMo-core checkpoint {self._path}: {type(e).__name__}: {e}"
            ) from None

    def get(self, name: str) -> np.ndarray:
        return _to_numpy(self.load([name])[0])


def olmo3_transformer_config(
    *,
    d_model: int,
    vocab_size: int,
    n_layers: int,
    n_heads: int,
    n_kv_heads: int,
    window: int,
    rope_theta: float,
    norm_eps: float = 1e-6,
    global_every: int = 4,
):
    """OLMo-core's own `TransformerConfig` of an OLMo 3 model of these sizes: the reordered-norm block
    with QK-norm, `window` on the first global_every - 1 layers of every group and full attention on
    the last of each group and on the final layer, plain torch attention (CPU). OLMo-core picks the MLP
    width itself (`llama_like`). What the parity tests and the side-by-side benchmarks build to compare
    olmax against; needs the `parity` extra."""
    from olmo_core.nn.attention import AttentionBackendName, SlidingWindowAttentionConfig
    from olmo_core.nn.transformer import TransformerBlockType, TransformerConfig

    return TransformerConfig.llama_like(
        d_model=d_model,
        vocab_size=vocab_size,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        block_name=TransformerBlockType.reordered_norm,
        qk_norm=True,
        rope_theta=int(rope_theta),
        layer_norm_eps=norm_eps,
        sliding_window=SlidingWindowAttentionConfig(
            pattern=[window] * (global_every - 1) + [-1],
            force_full_attention_on_first_layer=False,
            force_full_attention_on_last_layer=True,
        ),
        attn_backend=AttentionBackendName.torch,
    )


def open_state_dict(path: str | Path) -> TensorSource:
    path = Path(path)
    if path.is_dir():
        return DistributedCheckpointSource(dcp_directory(path))
    if not path.is_file():
        raise ConversionError(f"OLMo-core checkpoint {path} does not exist")
    if path.suffix == ".safetensors":
        return SafetensorsSource([path])
    if path.suffix in TORCH_SUFFIXES:
        return TorchFileSource(path)
    raise ConversionError(
        f"{path}: expected a .safetensors file, a torch file ({', '.join(TORCH_SUFFIXES)}) "
        "or a distributed checkpoint directory"
    )


def convert_from_olmo_core(
    path: str | Path, model_cfg: ModelConfig, out: str | Path, *, special_tokens: Optional[dict] = None
) -> dict:
    """An OLMo-core model state dict with architecture `model_cfg` -> olmax checkpoint at `out`, step 0."""
    out = Path(out)
    require_empty_output(out)
    start = time.perf_counter()
    source = open_state_dict(path)
    params = read_params(
        model_cfg,
        source,
        OLMO_CORE_NAMES,
        what=f"OLMo-core checkpoint {path}",
        vocab_rows=[model_cfg.vocab_size, model_cfg.padded_vocab_size],
    )
    description = {"format": "olmo_core", "path": str(Path(path).resolve())}
    meta = {
        "source": description,
        "source_dtype": source_dtype(source),
        "special_tokens": {**OLMO3_SPECIAL_TOKENS, **(special_tokens or {})},
    }
    save_params(out, params, model_cfg, meta)
    return {
        "out": str(out),
        "params": count_params(model_cfg),
        "source": description,
        "source_dtype": meta["source_dtype"],
        "seconds": round(time.perf_counter() - start, 2),
    }


# ----------------------------------------------------------------------------------------------
# Warm start from an OLMo-core checkpoint


def adam_count(dcp: Path, names: list[str]) -> int:
    """AdamW's step counter: one per parameter in torch, one for all in olmax, so they must agree."""
    source = DistributedCheckpointSource(dcp, DCP_OPTIM_PREFIX, STEP_KEY)
    missing = sorted(set(names) - set(source.names()))
    if missing:
        raise ConversionError(
            f"OLMo-core checkpoint {dcp} has no optimizer step for {len(missing)} parameters (e.g. {missing[0]})"
        )
    steps = {n: float(t) for n, t in zip(names, source.load(names))}
    if len(set(steps.values())) != 1 or not float(next(iter(steps.values()))).is_integer():
        raise ConversionError(
            f"OLMo-core checkpoint {dcp}: the parameters' AdamW step counters differ or are "
            f"not whole ({sorted(set(steps.values()))[:4]}); olmax keeps one for all"
        )
    return int(next(iter(steps.values())))


def read_trainer_state(path: Path) -> Optional[dict]:
    """The trainer state OLMo-core keeps beside the distributed checkpoint (`stepN/train/rank0.pt`),
    or None when `path` has none. It holds numpy RNG states, so torch.load may unpickle numeric numpy
    arrays and nothing else."""
    file = path / TRAIN_STATE
    if not file.is_file():
        return None
    torch = _torch()
    from numpy._core.multiarray import _reconstruct

    numeric = [
        type(np.dtype(t))
        for t in (
            "bool",
            "int8",
            "int16",
            "int32",
            "int64",
            "uint8",
            "uint16",
            "uint32",
            "uint64",
            "float16",
            "float32",
            "float64",
        )
    ]
    try:
        with torch.serialization.safe_globals([np.ndarray, np.dtype, _reconstruct, *numeric]):
            state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a bad file; all mean the same here
        raise ConversionError(f"cannot read OLMo-core trainer state {file}: {e}") from None
    if not isinstance(state, dict) or not isinstance(state.get("global_step"), int):
        raise ConversionError(f"OLMo-core trainer state {file} has no integer global_step")
    return state


def warm_start_from_olmo_core(
    path: str | Path,
    dst: str | os.PathLike,
    cfg: ExperimentConfig,
    *,
    keep: tuple[str, ...] = ("params", "moments"),
    reset_step: bool = True,
) -> dict:
    """Write the warm-start checkpoint DST (for `checkpoint.init_from`, as `olmax.checkpoint.surgery.warm_start`
    writes it) from the OLMo-core checkpoint `path` (a `stepN` directory, or its `model_and_optim`)
    for the experiment `cfg` (its model must be the checkpoint's).

    "moments" takes AdamW's exp_avg / exp_avg_sq (float32, olmax's mu / nu) and its step counter
    (olmax's bias-correction count); the skip-step window starts empty either way, because OLMo-core
    keeps it in memory only. Without reset_step the step and tokens seen are the trainer's
    (`train/rank0.pt`); the data position is not taken over (stage 2 reads its own data)."""
    from olmax.checkpoint.store import olmax_version
    from olmax.checkpoint.surgery import WARM_START, check_keep, require_new_output, write_warm_start
    from olmax.step.optim import AdamWState, OptState, skip_window_init

    check_keep(keep)
    require_new_output(dst)
    start = time.perf_counter()
    dcp = dcp_directory(path)
    trainer = read_trainer_state(Path(path))
    if not reset_step and trainer is None:
        raise ConversionError(
            f"{path} holds no OLMo-core trainer state ({TRAIN_STATE}) to take the step from: "
            f"give the stepN directory OLMo-core wrote, or reset the step"
        )
    what = f"OLMo-core checkpoint {path}"
    vocab_rows = [cfg.model.vocab_size, cfg.model.padded_vocab_size]
    model_source = DistributedCheckpointSource(dcp)
    params = read_params(cfg.model, model_source, OLMO_CORE_NAMES, what=what, vocab_rows=vocab_rows)
    if "moments" in keep:
        try:
            sources = [DistributedCheckpointSource(dcp, DCP_OPTIM_PREFIX, key) for key in MOMENT_KEYS]
        except ConversionError as e:
            raise ConversionError(f"{e}: it holds no AdamW state to keep; keep the parameters only") from None
        moment_cfg = dataclasses.replace(cfg.model, param_dtype="float32")
        mu, nu = (
            read_params(moment_cfg, source, OLMO_CORE_NAMES, what=f"{what} ({key[1:]})", vocab_rows=vocab_rows)
            for source, key in zip(sources, MOMENT_KEYS)
        )
        count = adam_count(dcp, model_source.names())
    else:
        mu = nu = jax.tree.map(lambda p: np.zeros(p.shape, np.float32), params)
        count = 0
    step = 0 if reset_step else trainer["global_step"]
    meta = {
        "olmax_version": olmax_version(),
        "step": step,
        "tokens_seen": 0 if reset_step else trainer.get("global_train_tokens_seen"),
        WARM_START: {
            "from": str(Path(path).resolve()),
            "format": "olmo_core",
            "from_step": trainer["global_step"] if trainer else None,
            "keep": sorted(keep),
            "reset_step": reset_step,
        },
    }
    opt = OptState(AdamWState(np.int32(count), mu, nu), skip_window_init(cfg.optimizer.skip_window))
    write_warm_start(dst, step, params, opt, cfg.model, meta, None, dataclasses.asdict(cfg))
    return {
        "source": str(path),
        "source_step": meta[WARM_START]["from_step"],
        "destination": os.fspath(dst),
        "step": step,
        "keep": sorted(keep),
        "reset_step": reset_step,
        "adam_count": count,
        "seconds": round(time.perf_counter() - start, 2),
    }
