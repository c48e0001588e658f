"""The HBM-bandwidth bound of decoding, for the decode benchmarks (tpu_decode.py, rollout_efficiency.py).

A decoding step must read every weight once (all layers and the output layer, in model.param_dtype; of
the embedding only its rows' entries) and, for each row that makes a token, the keys and values the
row holds: a row of prompt P at its k-th new token holds P + k positions on a full-attention layer and
min(P + k, window) on a window layer, 2 x kv_heads x head_dim values each in model.compute_dtype. The
bound of a run is its steps' weights plus its tokens' KV, read at the chip's HBM bandwidth
(olmax.fit.chips' hbm_gbps; 819 GB/s for a v5e, Cloud TPU docs): tokens / that time is the most any
decoder could make, whatever it reads beyond (a whole ring, padding, free slots, another program's
rows). What a decoder actually reads per step is its own affair: `ring_bytes` is what reading every
ring slot of every row would take (olmax.rollout.cache's rings, the sampler's until the decode kernel
read live blocks only, olmax.rollout.decode_attention).
"""

from __future__ import annotations

import numpy as np

V5E_HBM_GBPS = 819.0  # Cloud TPU v5e docs: 819 GB/s HBM bandwidth per chip


def _itemsize(dtype: str) -> int:
    import jax.numpy as jnp

    return jnp.dtype(dtype).itemsize


def weight_bytes(cfg, rows: int) -> float:
    """Bytes of weights one decoding step of `rows` rows reads."""
    from olmax.model.olmo3 import count_params

    embed = cfg.padded_vocab_size * cfg.d_model
    return (count_params(cfg) - embed + rows * cfg.d_model) * _itemsize(cfg.param_dtype)


def position_bytes(cfg) -> int:
    """Bytes of one position's keys and values on one layer."""
    return 2 * cfg.n_kv_heads * cfg.head_dim * _itemsize(cfg.compute_dtype)


def kv_bytes(cfg, prompts, lengths) -> float:
    """Bytes of keys and values read by the decoding steps of rows with these prompt lengths and numbers
    of new tokens (module doc): sum over rows, tokens k = 1 .. length and layers of min(P + k, window)."""
    prompts, lengths = np.asarray(prompts, np.int64), np.asarray(lengths, np.int64)
    total = 0
    for layer in range(cfg.n_layers):
        window = cfg.layer_window(layer)
        lo, hi = prompts + 1, prompts + lengths  # the positions held at the first and last token
        full = (lo + hi) * lengths // 2  # sum of P + k over k
        if window is not None:  # the part past the window holds `window` positions
            over = np.maximum(0, hi - np.maximum(lo, window + 1) + 1)
            start = np.maximum(lo, window + 1)
            full = full - ((start + hi) * over // 2 - window * over)
        total += int(full.sum())
    return float(total * position_bytes(cfg))


def ring_bytes(cfg, rows: int, cache_len: int) -> float:
    """Bytes a step reads that scores every slot of every row's rings (cache_len positions a full layer)."""
    from olmax.rollout.cache import slots

    return rows * position_bytes(cfg) * sum(slots(cfg, i, cache_len) for i in range(cfg.n_layers))


def bound_tokens_per_s(cfg, steps: int, rows: int, prompts, lengths, gbps: float) -> float:
    """The live-KV bound of a run (module doc): its tokens / (steps x the weights of `rows`-row steps +
    its tokens' KV) at `gbps` GB/s."""
    seconds = (steps * weight_bytes(cfg, rows) + kv_bytes(cfg, prompts, lengths)) / (gbps * 1e9)
    return float(np.sum(lengths)) / seconds


def hbm_gbps(device_kind: str, given=None) -> float:
    """The bandwidth of the bound: `given`, else the chip table's for the device, else a v5e's."""
    from olmax.fit.chips import chip_of_device_kind

    chip = chip_of_device_kind(device_kind)
    return given or getattr(chip, "hbm_gbps", None) or V5E_HBM_GBPS
