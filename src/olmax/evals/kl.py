"""Token-level KL between two checkpoints on identical inputs (docs/verification.md).

For every position of the fixed held-out instances (olmax.evals.heldout.load_instances), both
models' next-token distributions over the real vocabulary are compared:

  KL(A || B) = sum_v p_A(v) (log p_A(v) - log p_B(v))     in nats; A is the reference
  top-1 agreement = argmax p_A == argmax p_B

and reported as mean, median, p90, p99 and max over all positions, overall and per position bucket
(attention changes character with position: the first tokens see almost no context, and positions
beyond the sliding window see only part of it). Each model's CE loss on the same tokens comes along,
so a KL can be read against the loss gap it produces.

The KL is computed in float32 on the devices, `chunk` sequence positions at a time (default
OUTPUT_CHUNK; olmax.evals.scoring.map_seq_chunks), so the two models' (batch, seq, vocab) logits are
never held whole and the memory does not grow with the sequence length; the figures are those of
one unchunked pass. The per-token values come to the host;
the statistics are computed there in float64. A checkpoint against itself gives exactly 0: both
sides run the identical computation on identical inputs. Numbers to calibrate against
(docs/reference.md, "The MaxText reproduction"): the MaxText write-up measured 1.5e-3 for a
converted checkpoint in bf16 at 8192 tokens (the framework noise floor) and 0.389 nats between two
independently trained runs.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from olmax.checkpoint.inference import eval_mesh, load_checkpoint
from olmax.config.data import DataConfig
from olmax.config.model import ModelConfig
from olmax.evals.heldout import labels_for, load_instances
from olmax.evals.scoring import OUTPUT_CHUNK, eval_seq_len, map_seq_chunks, pad_rows, per_token_nll
from olmax.model.olmo3 import forward_hidden, lm_head
from olmax.model.sharding import logical_to_spec

ARCHITECTURE_FIELDS = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "mlp_hidden")


def default_buckets(seq_len: int) -> list[int]:
    """Bucket starts 0, 16, 64, 256, ... (x4) below seq_len."""
    edges, e = [0], 16
    while e < seq_len:
        edges.append(e)
        e *= 4
    return edges


def _pair_stats(params_a, params_b, tokens, labels, *, cfg_a: ModelConfig, cfg_b: ModelConfig, chunk: int):
    vocab = cfg_a.vocab_size
    ha, hb = forward_hidden(params_a, tokens, cfg_a), forward_hidden(params_b, tokens, cfg_b)

    def head(ha, hb, y):
        la = lm_head(params_a, ha, cfg_a)[..., :vocab]
        lb = lm_head(params_b, hb, cfg_b)[..., :vocab]
        log_a, log_b = jax.nn.log_softmax(la, axis=-1), jax.nn.log_softmax(lb, axis=-1)
        kl = jnp.sum(jnp.exp(log_a) * (log_a - log_b), axis=-1)
        agree = jnp.argmax(la, axis=-1) == jnp.argmax(lb, axis=-1)
        return kl, agree, per_token_nll(la, y), per_token_nll(lb, y)

    return map_seq_chunks(head, chunk, ha, hb, labels)


def summarize(kl: np.ndarray, agree: np.ndarray) -> dict:
    """mean / median / p90 / p99 / max of the per-token KL (float64) and the top-1 agreement."""
    kl = np.maximum(kl.astype(np.float64), 0.0)  # KL >= 0; float32 rounding can give -1e-9
    p50, p90, p99 = np.percentile(kl, [50, 90, 99])
    return {
        "tokens": int(kl.size),
        "kl_mean": float(kl.mean()),
        "kl_median": float(p50),
        "kl_p90": float(p90),
        "kl_p99": float(p99),
        "kl_max": float(kl.max()),
        "top1_agreement": float(agree.mean()),
    }


def token_kl(
    params_a: dict,
    cfg_a: ModelConfig,
    params_b: dict,
    cfg_b: ModelConfig,
    instances: np.ndarray,
    *,
    batch: int,
    mesh: Mesh,
    buckets: Optional[Sequence[int]] = None,
    chunk: int = OUTPUT_CHUNK,
) -> dict:
    """KL(A || B), top-1 agreement and both losses over `instances` (see the module doc)."""
    differ = [
        f"{f}: A {getattr(cfg_a, f)}, B {getattr(cfg_b, f)}"
        for f in ARCHITECTURE_FIELDS
        if getattr(cfg_a, f) != getattr(cfg_b, f)
    ]
    if differ:
        raise ValueError("the two checkpoints are different architectures: " + "; ".join(differ))
    seq_len = instances.shape[1]
    buckets = sorted(set(buckets if buckets is not None else default_buckets(seq_len)))
    if not buckets or buckets[0] != 0 or buckets[-1] >= seq_len:
        raise ValueError(f"position buckets {buckets} must start at 0 and lie below seq_len={seq_len}")
    # outputs replicated, so that every process of a multi-host run can read them whole
    fn = jax.jit(
        functools.partial(_pair_stats, cfg_a=cfg_a, cfg_b=cfg_b, chunk=chunk),
        out_shardings=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()),
    )
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    kls, agrees, nll_a, nll_b = [], [], [], []
    for start in range(0, instances.shape[0], batch):
        tokens = instances[start : start + batch]
        rows = tokens.shape[0]
        padded = pad_rows(tokens, shards, 0)
        sharding = jax.sharding.NamedSharding(mesh, logical_to_spec(("batch", "seq"), padded.shape, mesh))
        out = fn(params_a, params_b, jax.device_put(padded, sharding), jax.device_put(labels_for(padded), sharding))
        kl, agree, la, lb = (np.asarray(o)[:rows] for o in out)
        kls.append(kl), agrees.append(agree), nll_a.append(la), nll_b.append(lb)
    kl, agree = np.concatenate(kls), np.concatenate(agrees)
    scored = kl.shape[0] * (seq_len - 1)
    edges = buckets + [seq_len]
    return {
        **summarize(kl, agree),
        "loss_a": float(np.concatenate(nll_a).sum(dtype=np.float64) / scored),
        "loss_b": float(np.concatenate(nll_b).sum(dtype=np.float64) / scored),
        "by_position": [
            {"positions": f"{lo}-{hi - 1}", **summarize(kl[:, lo:hi], agree[:, lo:hi])}
            for lo, hi in zip(edges, edges[1:])
        ],
    }


def eval_kl(
    ckpt_a: str,
    ckpt_b: str,
    specs: Sequence[str],
    *,
    seq_len: Optional[int],
    batch: int,
    max_batches: Optional[int],
    buckets: Optional[Sequence[int]] = None,
    data_cfg: Optional[DataConfig] = None,
    step_a: Optional[int] = None,
    step_b: Optional[int] = None,
    compute_dtype: Optional[str] = None,
    loss_chunk: int = OUTPUT_CHUNK,
    mesh: Optional[Mesh] = None,
) -> dict:
    """`olmax eval kl`: token-level KL(A || B) of two olmax checkpoints on the same held-out tokens.
    seq_len None: A's training length (olmax.evals.scoring.eval_seq_len); it must suit B too."""
    mesh = mesh or eval_mesh()
    params_a, cfg_a, meta_a = load_checkpoint(ckpt_a, mesh, step=step_a, compute_dtype=compute_dtype)
    params_b, cfg_b, meta_b = load_checkpoint(ckpt_b, mesh, step=step_b, compute_dtype=compute_dtype)
    seq_len = eval_seq_len(seq_len, ckpt_a, meta_a["step"], cfg_a)
    eval_seq_len(seq_len, ckpt_b, meta_b["step"], cfg_b)
    data_cfg = replace(data_cfg or DataConfig(), seq_len=seq_len)
    instances = load_instances(list(specs), data_cfg, batch=batch, max_batches=max_batches)
    report = token_kl(
        params_a, cfg_a, params_b, cfg_b, instances, batch=batch, mesh=mesh, buckets=buckets, chunk=loss_chunk
    )
    return {
        "ckpt_a": str(ckpt_a),
        "step_a": meta_a["step"],
        "ckpt_b": str(ckpt_b),
        "step_b": meta_b["step"],
        "data": list(specs),
        "seq_len": seq_len,
        "instances": int(instances.shape[0]),
        "compute_dtype": {"a": cfg_a.compute_dtype, "b": cfg_b.compute_dtype},
        **report,
    }


def format_kl(report: dict) -> str:
    head = (
        "| positions | tokens | KL mean | median | p90 | p99 | max | top-1 |\n|---|---:|---:|---:|---:|---:|---:|---:|"
    )
    row = lambda name, r: (
        f"| {name} | {r['tokens']} | {r['kl_mean']:.3e} | {r['kl_median']:.3e} | "
        f"{r['kl_p90']:.3e} | {r['kl_p99']:.3e} | {r['kl_max']:.3e} | {r['top1_agreement']:.4f} |"
    )
    lines = [head] + [row(b["positions"], b) for b in report["by_position"]] + [row("**all**", report)]
    lines.append(f"\nCE loss on the same tokens: A {report['loss_a']:.4f}, B {report['loss_b']:.4f}")
    return "\n".join(lines)
