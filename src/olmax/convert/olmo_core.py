"""OLMo-core model weights -> olmax checkpoints.

An OLMo-core state dict carries no architecture, so the ModelConfig comes from the caller (a recipe
plus overrides on the command line). Three containers are read, one tensor at a time:

  *.safetensors         a saved `model.state_dict()` (no torch needed)
  *.pt / *.pth / *.bin  `torch.save(model.state_dict())`, memory-mapped by torch.load(mmap=True)
  a directory           an OLMo-core distributed (torch.distributed.checkpoint) checkpoint, e.g.
                        `stepN/model_and_optim`: its `model.*` entries; the optimizer state is ignored

OLMo-core keeps the embedding padded (e.g. 100352 rows for the 100278-entry dolma2 vocabulary); the
padded rows and LM-head columns are kept as they are. A state dict with exactly `vocab_size` rows is
padded with zeros, as for HF.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import ml_dtypes
import numpy as np

from olmax.checkpoint import save_params
from olmax.config import ModelConfig
from olmax.convert import (
    ConversionError,
    SafetensorsSource,
    TensorSource,
    read_params,
    require_empty_output,
    source_dtype,
)
from olmax.convert.hf import OLMO3_SPECIAL_TOKENS
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
DCP_MODEL_PREFIX = "model."  # OLMo-core saves {"model": model_state, "optim": optim_state}


def _torch():
    try:
        import torch
    except ImportError:
        raise ConversionError("reading a torch checkpoint needs torch: install the `parity` extra") from None
    return torch


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


class DistributedCheckpointSource:
    """The model entries of an OLMo-core distributed checkpoint, read one key per call with OLMo-core's
    own reader (its files carry storage metadata that torch's plain FileSystemReader does not read)."""

    def __init__(self, path: Path):
        _torch()
        try:
            from olmo_core.distributed import checkpoint as olmo_ckpt
        except ImportError:
            raise ConversionError("reading an OLMo-core distributed checkpoint needs ai2-olmo-core: "
                                  "install the `parity` extra") from None
        self._olmo_ckpt, self._path = olmo_ckpt, path
        try:
            metadata = olmo_ckpt.get_checkpoint_metadata(str(path))
        except Exception as e:  # a missing/corrupt .metadata file surfaces as several error types
            raise ConversionError(f"{path} is not a readable OLMo-core distributed checkpoint: {e}") from None
        self._entries = {k[len(DCP_MODEL_PREFIX):]: v for k, v in metadata.state_dict_metadata.items()
                         if k.startswith(DCP_MODEL_PREFIX) and hasattr(v, "size")}
        if not self._entries:
            raise ConversionError(f"{path} holds no '{DCP_MODEL_PREFIX}*' tensors")

    def names(self) -> list[str]:
        return list(self._entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._entries[name].size)

    def dtype(self, name: str) -> str:
        return _dtype_name(self._entries[name].properties.dtype)

    def get(self, name: str) -> np.ndarray:
        (tensor,) = self._olmo_ckpt.load_keys(str(self._path), [DCP_MODEL_PREFIX + name])
        return _to_numpy(tensor)


def olmo3_transformer_config(*, d_model: int, vocab_size: int, n_layers: int, n_heads: int, n_kv_heads: int,
                             window: int, rope_theta: float, norm_eps: float = 1e-6, global_every: int = 4):
    """OLMo-core's own `TransformerConfig` of an OLMo 3 model of these sizes: the reordered-norm block
    with QK-norm, `window` on the first global_every - 1 layers of every group and full attention on
    the last of each group and on the final layer, plain torch attention (CPU). OLMo-core picks the MLP
    width itself (`llama_like`). What the parity tests and the side-by-side benchmarks build to compare
    olmax against; needs the `parity` extra."""
    from olmo_core.nn.attention import AttentionBackendName, SlidingWindowAttentionConfig
    from olmo_core.nn.transformer import TransformerBlockType, TransformerConfig

    return TransformerConfig.llama_like(
        d_model=d_model, vocab_size=vocab_size, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
        block_name=TransformerBlockType.reordered_norm, qk_norm=True, rope_theta=int(rope_theta),
        layer_norm_eps=norm_eps,
        sliding_window=SlidingWindowAttentionConfig(pattern=[window] * (global_every - 1) + [-1],
                                                    force_full_attention_on_first_layer=False,
                                                    force_full_attention_on_last_layer=True),
        attn_backend=AttentionBackendName.torch)


def open_state_dict(path: str | Path) -> TensorSource:
    path = Path(path)
    if path.is_dir():
        return DistributedCheckpointSource(path)
    if not path.is_file():
        raise ConversionError(f"OLMo-core checkpoint {path} does not exist")
    if path.suffix == ".safetensors":
        return SafetensorsSource([path])
    if path.suffix in TORCH_SUFFIXES:
        return TorchFileSource(path)
    raise ConversionError(f"{path}: expected a .safetensors file, a torch file ({', '.join(TORCH_SUFFIXES)}) "
                          "or a distributed checkpoint directory")


def convert_from_olmo_core(path: str | Path, model_cfg: ModelConfig, out: str | Path, *,
                           special_tokens: Optional[dict] = None) -> dict:
    """An OLMo-core model state dict with architecture `model_cfg` -> olmax checkpoint at `out`, step 0."""
    out = Path(out)
    require_empty_output(out)
    start = time.perf_counter()
    source = open_state_dict(path)
    params = read_params(model_cfg, source, OLMO_CORE_NAMES, what=f"OLMo-core checkpoint {path}",
                         vocab_rows=[model_cfg.vocab_size, model_cfg.padded_vocab_size])
    description = {"format": "olmo_core", "path": str(Path(path).resolve())}
    meta = {"source": description, "source_dtype": source_dtype(source),
            "special_tokens": {**OLMO3_SPECIAL_TOKENS, **(special_tokens or {})}}
    save_params(out, params, model_cfg, meta)
    return {"out": str(out), "params": count_params(model_cfg), "source": description,
            "source_dtype": meta["source_dtype"], "seconds": round(time.perf_counter() - start, 2)}
