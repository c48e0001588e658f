"""Logit parity: olmax against a reference implementation on the same random tokens.

`compare` takes both sides' logits and per-layer hidden states and reports, over the UNPADDED
vocabulary (the first `vocab_size` logits; olmax's padded ids have no counterpart):

  kl_mean, kl_max       KL(reference || olmax) per token, in nats (float64 from float32 logits)
  top1_agreement        fraction of tokens whose argmax agrees
  top10_overlap         mean fraction of the reference's top-10 ids that are also in olmax's top 10
  max_abs_logit_diff    the largest |logit difference| anywhere
  layer_max_abs_diff    per layer, max |h_ref - h_olmax| over the layer's output (the residual stream)
  layer_rel_diff        per layer, RMS(h_ref - h_olmax) / RMS(h_ref)
  first_divergent_layer the first layer whose layer_rel_diff exceeds the tolerance, or None

The tolerance of the per-layer check (`ParityBounds.layer_tol`) is relative to the layer's RMS, so it does
not depend on the scale of the residual stream. Measured (docs/conversion.md): a correct conversion
gives layer_rel_diff <= 1e-6 in float32 on the 5-layer test models at 64 tokens and 1.2e-5 on an
8-layer d_model=512 model at 4096 tokens (it grows with position: the RoPE inverse frequencies
differ from torch's in the last bit), and <= 1.6e-2 in bfloat16. Structural bugs give >= 0.29 from
the first wrong layer on (swapped attention/MLP norms 0.41, swapped gate/up 0.51, a window one token
too wide 0.29, one layer's weights replaced by another's 0.78); a 1% wrong RoPE theta gives 5.6e-4
rising to 1.4e-3 by layer 4. Hence 1e-3 in float32 (~100x above the rounding seen at 4096 tokens,
~300x below the smallest structural bug) and 0.1 in bfloat16 (6x above rounding, 3x below it).
Deep models accumulate more bfloat16 rounding; the float32 run is the one that locates a bug
(`--layer-tol` overrides).

The verdict (`PARITY_BOUNDS`, `judge`) is PASS when every figure is within the bounds of a correct
conversion in the run's dtype, FAIL otherwise; docs/conversion.md ("The verdict") gives the figures
each bound rests on.

`run_hf_parity` runs transformers' Olmo3ForCausalLM (torch, CPU, eager attention) first, frees it,
then olmax, so the peak host memory is one model plus the outputs, not two models.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Optional

import jax
import numpy as np

from olmax.checkpoint.store import load_params, read_config
from olmax.config.model import ModelConfig
from olmax.convert.hf import model_config_from_hf, read_hf_config
from olmax.convert.tensors import ConversionError
from olmax.model.olmo3 import forward_hidden, lm_head


@dataclass(frozen=True)
class ParityBounds:
    """What a correct conversion meets; a run outside any of them is a FAIL."""

    max_kl_mean: float  # kl_mean at most this (nats)
    min_top1: float  # top1_agreement at least this
    max_logit_diff: Optional[float]  # max_abs_logit_diff at most this; None: not judged
    layer_tol: float  # every layer's layer_rel_diff at most this (the per-layer tolerance)

    def describe(self) -> str:
        judged = [f"kl_mean <= {self.max_kl_mean:g}", f"top1_agreement >= {self.min_top1:g}"]
        if self.max_logit_diff is not None:
            judged.append(f"max_abs_logit_diff <= {self.max_logit_diff:g}")
        return ", ".join(judged + [f"layer_rel_diff <= {self.layer_tol:g}"])


# Per dtype, from the measured figures of docs/conversion.md ("The verdict" says why each value).
# float32: a correct conversion gives kl_mean <= 2.7e-10, top-1 1.0, max |dlogit| <= 5.4e-4 (d_model 512,
# 4096 tokens; it grows with depth and length), layer_rel_diff <= 1.5e-5; a 1% wrong RoPE theta gives
# kl_mean 3.3e-6, structural bugs far more. bfloat16: rounding alone gives kl_mean <= 3.7e-4 and top-1
# >= 0.95 on random models (their near-tied logits flip), AI2's 7B KL ~1.5e-3 and top-1 98.75%; logit
# differences of 0.2 are rounding there, so only the distribution is judged.
PARITY_BOUNDS = {
    "float32": ParityBounds(max_kl_mean=1e-6, min_top1=0.999, max_logit_diff=1e-2, layer_tol=1e-3),
    "bfloat16": ParityBounds(max_kl_mean=5e-3, min_top1=0.9, max_logit_diff=None, layer_tol=1e-1),
}
PARITY_DTYPES = tuple(PARITY_BOUNDS)
# `olmax parity`'s exit status on FAIL: neither 1 (a crash, olmax.rundir.exits) nor 2 (bad input), so a script
# can tell a model that differs from a run that failed
PARITY_FAIL_EXIT = 3
_TOKENS_PER_CHUNK = 256  # metric chunks: bounds the float64 temporaries at 256 x vocab


def random_tokens(vocab_size: int, batch: int, seq_len: int, seed: int) -> np.ndarray:
    """Uniform random token ids (batch, seq_len), int32: the same for both sides, given the seed."""
    return np.random.default_rng(seed).integers(0, vocab_size, size=(batch, seq_len), dtype=np.int32)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def logit_metrics(ref: np.ndarray, ours: np.ndarray, vocab_size: int) -> dict:
    """KL, top-1, top-10 and max-abs figures over the first `vocab_size` logits (see module doc)."""
    ref = ref[..., :vocab_size].reshape(-1, vocab_size)
    ours = ours[..., :vocab_size].reshape(-1, vocab_size)
    k = min(10, vocab_size)
    kl, top1, overlap, max_abs = [], [], [], 0.0
    for s in range(0, ref.shape[0], _TOKENS_PER_CHUNK):
        r = ref[s : s + _TOKENS_PER_CHUNK].astype(np.float64)
        o = ours[s : s + _TOKENS_PER_CHUNK].astype(np.float64)
        log_r, log_o = _log_softmax(r), _log_softmax(o)
        kl.append((np.exp(log_r) * (log_r - log_o)).sum(-1))
        top1.append(r.argmax(-1) == o.argmax(-1))
        top_r = np.argpartition(-r, k - 1, axis=-1)[:, :k]
        top_o = np.argpartition(-o, k - 1, axis=-1)[:, :k]
        overlap.append((top_r[:, :, None] == top_o[:, None, :]).any(-1).sum(-1) / k)
        max_abs = float(np.maximum(max_abs, np.abs(r - o).max()))  # np.maximum: a NaN stays NaN, and fails its bound
    kl_all = np.maximum(np.concatenate(kl), 0.0)  # KL >= 0; float64 rounding can give -1e-17
    return {
        "kl_mean": float(kl_all.mean()),
        "kl_max": float(kl_all.max()),
        "top1_agreement": float(np.concatenate(top1).mean()),
        "top10_overlap": float(np.concatenate(overlap).mean()),
        "max_abs_logit_diff": max_abs,
    }


def layer_metrics(ref_layers: np.ndarray, our_layers: np.ndarray, tolerance: float) -> dict:
    """Per-layer differences of the layer outputs (n_layers, ...) and the first layer beyond tolerance."""
    if ref_layers.shape != our_layers.shape:
        raise ValueError(f"per-layer outputs differ in shape: reference {ref_layers.shape}, olmax {our_layers.shape}")
    max_abs, rel = [], []
    for r, o in zip(ref_layers, our_layers):
        r, o = r.astype(np.float64), o.astype(np.float64)
        max_abs.append(float(np.abs(r - o).max()))
        rel.append(float(np.sqrt(np.mean((r - o) ** 2)) / max(np.sqrt(np.mean(r * r)), 1e-30)))
    first = next((i for i, x in enumerate(rel) if not x <= tolerance), None)  # `not <=` also catches NaN
    return {
        "first_divergent_layer": first,
        "layer_tolerance": tolerance,
        "layer_max_abs_diff": max_abs,
        "layer_rel_diff": rel,
    }


def compare(ref_logits, our_logits, ref_layers, our_layers, *, vocab_size: int, tolerance: float) -> dict:
    """Every parity figure for one run; inputs are numpy arrays, logits (..., >= vocab_size)."""
    return {
        **logit_metrics(np.asarray(ref_logits), np.asarray(our_logits), vocab_size),
        **layer_metrics(np.asarray(ref_layers), np.asarray(our_layers), tolerance),
    }


def judge(report: dict, bounds: ParityBounds) -> list[str]:
    """The bounds `report` breaks, each as "figure value vs bound"; none: PASS. A NaN breaks its bound."""
    broken = []
    if not report["kl_mean"] <= bounds.max_kl_mean:
        broken.append(f"kl_mean {report['kl_mean']:.3g} > {bounds.max_kl_mean:g}")
    if not report["top1_agreement"] >= bounds.min_top1:
        broken.append(f"top1_agreement {report['top1_agreement']:.4g} < {bounds.min_top1:g}")
    if bounds.max_logit_diff is not None and not report["max_abs_logit_diff"] <= bounds.max_logit_diff:
        broken.append(f"max_abs_logit_diff {report['max_abs_logit_diff']:.3g} > {bounds.max_logit_diff:g}")
    first = report["first_divergent_layer"]
    if first is not None:
        broken.append(f"layer {first} layer_rel_diff {report['layer_rel_diff'][first]:.3g} > {bounds.layer_tol:g}")
    return broken


def olmax_outputs(params: dict, cfg: ModelConfig, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """olmax's float32 logits over the padded vocabulary and every layer's output (n_layers, B, T, D)."""

    @jax.jit
    def run(params, tokens):
        hidden, layers = forward_hidden(params, tokens, cfg, return_layers=True)
        return lm_head(params, hidden, cfg), layers

    logits, layers = run(params, tokens)
    return np.asarray(logits), np.asarray(layers.astype(np.float32))


def hf_outputs(hf_dir: str, tokens: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """transformers' Olmo3ForCausalLM on CPU, weights and compute in `dtype`, eager attention.

    Layer outputs are taken with forward hooks on the decoder layers: transformers 5 replaces the last
    entry of `hidden_states` with the final-normed state, so it would not give the last layer's output.
    """
    import torch
    from transformers import Olmo3ForCausalLM

    model = Olmo3ForCausalLM.from_pretrained(hf_dir, dtype=getattr(torch, dtype))
    model.config._attn_implementation = "eager"  # the plain reference: explicit mask, float32 softmax
    model.eval()
    layers: list = []
    hooks = [layer.register_forward_hook(lambda _m, _a, out: layers.append(out)) for layer in model.model.layers]
    try:
        with torch.no_grad():
            logits = model(input_ids=torch.from_numpy(tokens).long(), use_cache=False).logits
    finally:
        for hook in hooks:
            hook.remove()
    return logits.float().numpy(), torch.stack(layers).float().numpy()


ARCHITECTURE_FIELDS = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "mlp_hidden")


def run_hf_parity(
    hf_dir: str,
    ckpt: str,
    *,
    dtype: str = "float32",
    seq_len: int = 512,
    batch: int = 1,
    seed: int = 0,
    bounds: Optional[ParityBounds] = None,
) -> dict:
    """Parity of an olmax checkpoint against a HF directory on `batch` x `seq_len` random tokens, with its
    verdict against `bounds` (default: PARITY_BOUNDS[dtype]): `verdict` PASS or FAIL, `broken` the
    bounds a FAIL breaks.

    In bfloat16 both sides compute in bfloat16: transformers with its weights cast to bfloat16, olmax
    with compute_dtype=bfloat16 and its float32 parameters (cast to bfloat16 per layer in the forward,
    which rounds them exactly as transformers' cast does). That is how olmax trains, so this measures
    the model that training uses.
    """
    if dtype not in PARITY_DTYPES:
        raise ValueError(f"dtype={dtype!r} is not one of {', '.join(PARITY_DTYPES)}")
    cfg, _ = read_config(ckpt)
    hf_cfg = model_config_from_hf(read_hf_config(Path(hf_dir)), where=f"{hf_dir}/config.json")
    differ = [
        f"{f}: HF {getattr(hf_cfg, f)}, olmax {getattr(cfg, f)}"
        for f in ARCHITECTURE_FIELDS
        if getattr(hf_cfg, f) != getattr(cfg, f)
    ]
    if differ:
        raise ConversionError(f"{hf_dir} and {ckpt} are different architectures: " + "; ".join(differ))
    bounds = PARITY_BOUNDS[dtype] if bounds is None else bounds
    tokens = random_tokens(cfg.vocab_size, batch, seq_len, seed)

    start = time.perf_counter()
    ref_logits, ref_layers = hf_outputs(hf_dir, tokens, dtype)
    hf_seconds = time.perf_counter() - start
    params, cfg, _ = load_params(ckpt)
    start = time.perf_counter()
    our_logits, our_layers = olmax_outputs(params, replace(cfg, compute_dtype=dtype), tokens)
    olmax_seconds = time.perf_counter() - start
    report = compare(
        ref_logits, our_logits, ref_layers, our_layers, vocab_size=cfg.vocab_size, tolerance=bounds.layer_tol
    )
    broken = judge(report, bounds)
    return {
        **report,
        "verdict": "FAIL" if broken else "PASS",
        "broken": broken,
        "bounds": asdict(bounds),
        "dtype": dtype,
        "seq_len": seq_len,
        "batch": batch,
        "seed": seed,
        "vocab_size": cfg.vocab_size,
        "reference": "transformers Olmo3ForCausalLM (torch CPU, eager)",
        "hf_dir": str(hf_dir),
        "ckpt": str(ckpt),
        "seconds": {"reference": round(hf_seconds, 2), "olmax": round(olmax_seconds, 2)},
    }
