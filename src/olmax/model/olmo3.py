"""The OLMo 3 transformer, top to bottom (docs/reference.md, "Model").

Parameters are a plain nested dict of arrays. Each one is declared once, in `param_specs`, with its
shape, logical axis names and initializer; `olmax.model.sharding` maps the logical axes to a device mesh.
This file knows nothing about devices: the same code runs on one CPU or sharded over a pod. (It
names the residual stream's logical axes once, for `constrain`, a no-op outside a mesh, and embeds
with `olmax.model.sharding.lookup_rows`, the plain lookup outside one.)

Layer weights are stacked along a leading "layers" axis. The forward pass scans over groups of
`global_every` (= 4) layers, so the window pattern is static inside the scanned body and the 7B
compiles one group instead of 32 layers; a final partial group (when n_layers is not a multiple of
4) runs unrolled after the scan.

Block ("reordered norm"):   h = x + attn_norm(attn(x));   out = h + mlp_norm(mlp(h))
Attention:   q, k, v = x Wq, x Wk, x Wv;  q, k = q_norm(q), k_norm(k) over the FULL projected width;
             split heads;  RoPE;  softmax(q k^T / sqrt(head_dim)) v;  Wo
MLP (SwiGLU):   down(silu(gate(x)) * up(x))
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Callable, Optional

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import Mesh

from olmax.config.model import ModelConfig
from olmax.config.remat import AUTO, RematPolicy, remat_policy_of
from olmax.model.attention import attention, document_positions
from olmax.model.rope import apply_rope, rope_tables
from olmax.model.sharding import constrain, lookup_rows, tree_shardings

ACTIVATION_AXES = ("batch", "seq", "embed")  # the residual stream


# ----------------------------------------------------------------------------------------------
# Parameters: declared once


@dataclass(frozen=True)
class ParamSpec:
    shape: tuple[int, ...]
    axes: tuple[str, ...]  # logical axis names, one per dim (see olmax.model.sharding.LOGICAL_AXIS_RULES)
    init: str  # "normal" (truncated normal, std=init_std, cut at 3 std) or "ones"


def param_specs(cfg: ModelConfig) -> dict:
    L, D, F, V = cfg.n_layers, cfg.d_model, cfg.mlp_hidden, cfg.padded_vocab_size
    Q, KV = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    return {
        "embed": ParamSpec((V, D), ("vocab", "embed"), "normal"),
        "layers": {
            "q_proj": ParamSpec((L, D, Q), ("layers", "embed", "q_heads"), "normal"),
            "k_proj": ParamSpec((L, D, KV), ("layers", "embed", "kv_heads"), "normal"),
            "v_proj": ParamSpec((L, D, KV), ("layers", "embed", "kv_heads"), "normal"),
            "o_proj": ParamSpec((L, Q, D), ("layers", "q_heads", "embed"), "normal"),
            "q_norm": ParamSpec((L, Q), ("layers", "q_heads"), "ones"),
            "k_norm": ParamSpec((L, KV), ("layers", "kv_heads"), "ones"),
            "attn_norm": ParamSpec((L, D), ("layers", "norm"), "ones"),
            "gate_proj": ParamSpec((L, D, F), ("layers", "embed", "mlp"), "normal"),
            "up_proj": ParamSpec((L, D, F), ("layers", "embed", "mlp"), "normal"),
            "down_proj": ParamSpec((L, F, D), ("layers", "mlp", "embed"), "normal"),
            "mlp_norm": ParamSpec((L, D), ("layers", "norm"), "ones"),
        },
        "final_norm": ParamSpec((D,), ("norm",), "ones"),
        "lm_head": ParamSpec((D, V), ("embed", "vocab"), "normal"),
    }


def _is_spec(x) -> bool:
    return isinstance(x, ParamSpec)


def abstract_params(cfg: ModelConfig) -> dict:
    """ShapeDtypeStructs of the parameters (no memory allocated)."""
    dtype = jnp.dtype(cfg.param_dtype)
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, dtype), param_specs(cfg), is_leaf=_is_spec)


def init_params(cfg: ModelConfig, key: jax.Array) -> dict:
    """OLMo-core's init: every matrix truncated-normal(0, init_std) cut at 3 std, norm weights 1.

    Jit this with `out_shardings` from olmax.model.sharding to create the parameters already sharded.
    """
    dtype = jnp.dtype(cfg.param_dtype)
    specs, treedef = jax.tree.flatten(param_specs(cfg), is_leaf=_is_spec)
    keys = jax.random.split(key, len(specs))

    def make(spec: ParamSpec, k):
        if spec.init == "ones":
            return jnp.ones(spec.shape, dtype)
        return (jax.random.truncated_normal(k, -3.0, 3.0, spec.shape, jnp.float32) * cfg.init_std).astype(dtype)

    return jax.tree.unflatten(treedef, [make(s, k) for s, k in zip(specs, keys)])


def count_params(cfg: ModelConfig) -> int:
    leaves = jax.tree.leaves(param_specs(cfg), is_leaf=_is_spec)
    return sum(math.prod(s.shape) for s in leaves)


# ----------------------------------------------------------------------------------------------
# Forward


@jax.custom_vjp
def dense(x, w):
    """x @ w in x's dtype: w (float32 in training) is rounded to the compute dtype first, as FSDP's
    `param_dtype=bfloat16` rounds OLMo-core's weights. The hand-written backward returns dx in x's
    dtype but computes w's gradient as a float32 dot: autodiff's would be a bf16 dot, whose partial sums
    over the sharded batch the SPMD partitioner then adds across devices in bf16, where OLMo-core's FSDP
    (`reduce_dtype=float32`) sums the gradients in float32."""
    return x @ w.astype(x.dtype)


def _dense_fwd(x, w):
    return dense(x, w), (x, w)  # w, not its rounded copy: the stored weight costs no new memory


def _dense_bwd(res, dy):
    x, w = res
    dx = dy @ w.astype(dy.dtype).T
    dw = jnp.einsum("...i,...o->io", x, dy, preferred_element_type=jnp.float32)
    return dx, dw.astype(w.dtype)


dense.defvjp(_dense_fwd, _dense_bwd)


@partial(jax.custom_vjp, nondiff_argnums=(1,))
def rounded(w, dtype):
    """w rounded to `dtype` and kept in w's dtype: how the norms see their weights (FSDP's param_dtype
    rounds them too). The gradient passes through unrounded; autodiff's would go through `dtype` and
    leave XLA a bf16 sum across devices."""
    return w.astype(dtype).astype(w.dtype)


def _rounded_fwd(w, dtype):
    return rounded(w, dtype), None


def _rounded_bwd(dtype, _, g):
    return (g,)


rounded.defvjp(_rounded_fwd, _rounded_bwd)


def rms_norm(x, weight, eps: float):
    """In float32, weight applied in float32, cast back to x's dtype (OLMo-core full precision)."""
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (xf * weight.astype(jnp.float32)).astype(x.dtype)


def weighted_norm(x, weight, eps: float):
    """The model's norms: `rms_norm` with the stored weight (float32 in training) rounded to x's dtype,
    the compute dtype, as FSDP's `param_dtype=bfloat16` rounds every weight OLMo-core's norms use. The
    block norms and the final norm alike: ai2-olmo-core 3.0.0 puts the final norm in the LM head
    (`LMHead.norm`, olmo_core/nn/lm_head.py), which `Transformer.apply_fsdp`
    (olmo_core/nn/transformer/model.py) shards with the same mixed-precision policy as the blocks."""
    return rms_norm(x, rounded(weight, x.dtype), eps)


def final_norm(params: dict, x, cfg: ModelConfig):
    """The norm on the last block's output, before the LM head (training, scoring and decoding)."""
    return weighted_norm(x, params["final_norm"], cfg.norm_eps)


def block(cfg: ModelConfig, p: dict, x, cos, sin, attend: Callable):
    """One reordered-norm block: the only one, for training, scoring and KV-cache decoding.

    p holds this layer's (unstacked) weights as stored, float32 in training: the block rounds each to x's
    dtype (the compute dtype) where it uses it (`dense`, `rounded`). cos/sin are RoPE tables of shape
    (seq, head_dim), or (batch, seq, head_dim) when rows sit at different positions (decoding).
    `attend(q, k, v)` with q (batch, seq, heads, head_dim) and k, v (batch, seq, kv_heads, head_dim)
    returns (attention output shaped like q, extra): `self_attention` attends within the sequence
    (extra None); olmax.rollout.cache's attends over a KV cache and returns the updated cache as extra.
    Returns (block output, extra).
    """
    b, t, _ = x.shape
    # checkpoint_name tags the activations a remat policy keeps (olmax.config.remat.REMAT_TAGS); outside
    # jax.checkpoint it is the identity
    norm = lambda y, name: weighted_norm(y, p[name], cfg.norm_eps)
    x = checkpoint_name(x, "layer_input")
    q = norm(checkpoint_name(dense(x, p["q_proj"]), "q_proj"), "q_norm")
    k = norm(checkpoint_name(dense(x, p["k_proj"]), "k_proj"), "k_norm")
    v = checkpoint_name(dense(x, p["v_proj"]), "v_proj")
    q = apply_rope(q.reshape(b, t, cfg.n_heads, cfg.head_dim), cos, sin)
    k = apply_rope(k.reshape(b, t, cfg.n_kv_heads, cfg.head_dim), cos, sin)
    attn, extra = attend(q, k, v.reshape(b, t, cfg.n_kv_heads, cfg.head_dim))
    # the attention backend names its own result (remat.ATTENTION_TAG): not tagged again here
    attn = attn.reshape(b, t, -1)
    h = x + norm(checkpoint_name(dense(attn, p["o_proj"]), "o_proj"), "attn_norm")
    gate = checkpoint_name(dense(h, p["gate_proj"]), "mlp_gate")
    up = checkpoint_name(dense(h, p["up_proj"]), "mlp_up")
    mlp = checkpoint_name(dense(jax.nn.silu(gate) * up, p["down_proj"]), "mlp_down")
    return h + norm(mlp, "mlp_norm"), extra


def self_attention(cfg: ModelConfig, window: Optional[int], segments: Optional[jnp.ndarray] = None) -> Callable:
    """The `attend` of a whole sequence (training and scoring): causal, with this layer's window, and
    within documents when `segments` (batch, seq) gives each token's document."""
    return lambda q, k, v: (
        attention(q, k, v, window=window, backend=cfg.attention, splash_blocks=cfg.splash_blocks, segments=segments),
        None,
    )


def checkpoint_policy(policy: RematPolicy) -> Callable:
    """The jax.checkpoint policy that keeps (or offloads) the tagged activations `policy` names."""
    cp = jax.checkpoint_policies
    if not policy.offload:
        return cp.save_only_these_names(*policy.save)
    return cp.save_and_offload_only_these_names(
        names_which_can_be_saved=list(policy.save),
        names_which_can_be_offloaded=list(policy.offload),
        offload_src="device",
        offload_dst="pinned_host",
    )


def rematerialised(fn: Callable, policy: RematPolicy, serial: bool) -> Callable:
    """fn under jax.checkpoint with `policy`. With `serial`, fn's backward pass runs as one unit: the
    forward is recomputed only once the cotangent of fn's output exists, and the cotangent of fn's
    input is released only together with all of fn's other gradients (its weight gradients).

    Data dependencies alone order a scanned group's blocks only through the activation cotangents: a
    recomputation reads nothing but kept residuals, and a weight gradient feeds nothing below. The
    TPU compiler used that freedom to recompute several blocks' forwards ahead and to put off their
    weight-gradient matmuls to the group's end, holding the activations of up to 4 blocks together
    (docs/performance/remat.md, "Serial backward"). Two optimization barriers take it away: one over the
    residuals and the incoming cotangent, one over all the gradients going out. The values are the
    same either way; only the order, and so the memory, changes (model.remat_serial)."""
    inner = jax.checkpoint(fn, policy=checkpoint_policy(policy))
    if not serial:
        return inner

    @jax.custom_vjp
    def run(*args):
        return inner(*args)

    def forward(*args):
        return jax.vjp(inner, *args)  # (output, pullback): the pullback holds the kept residuals

    def backward(pullback, cotangent):
        pullback, cotangent = jax.lax.optimization_barrier((pullback, cotangent))
        grads, tree = jax.tree.flatten(pullback(cotangent))
        # integer inputs' cotangents (float0) are not values a barrier takes
        real = [i for i, g in enumerate(grads) if g.dtype != jax.dtypes.float0]
        for i, g in zip(real, jax.lax.optimization_barrier([grads[i] for i in real])):
            grads[i] = g
        return jax.tree.unflatten(tree, grads)

    run.defvjp(forward, backward)
    return run


def _group_fn(cfg: ModelConfig, first: int, n: int, collect: bool):
    """Runs layers first..first+n-1, each with its static window and RoPE kind:
    (x, stacked layer params, rope tables, segment ids or None) -> (x, outputs or None)."""
    # auto is chosen for the devices before a train step is built (make_train_step refuses it
    # unchosen); a forward pass alone, e.g. scoring a checkpoint whose config says auto, has no
    # backward pass to recompute for
    policy = None if cfg.remat == AUTO else remat_policy_of(cfg.remat)

    def layer(window: Optional[int]):
        run = lambda p, x, cos, sin, segments: block(cfg, p, x, cos, sin, self_attention(cfg, window, segments))[0]
        if policy is None:
            return run
        # per block, so a backward pass holds one block's activations at a time
        return rematerialised(run, policy, cfg.remat_serial)

    layers = [(layer(cfg.layer_window(i)), cfg.layer_rope_scaled(i)) for i in range(first, first + n)]

    def run(x, group_params, ropes, segments):
        outputs = []
        for i, (run_layer, scaled) in enumerate(layers):
            # this layer's weights as stored: the block rounds them to the compute dtype (see `dense`)
            p = jax.tree.map(lambda w: w[i], group_params)  # noqa: B023 - applied at once
            x = constrain(run_layer(p, x, *ropes[scaled], segments), ACTIVATION_AXES)
            outputs.append(x)
        return x, (jnp.stack(outputs) if collect else None)

    return run


def rope_for(cfg: ModelConfig, seq_len: int, scaled: bool, segments: Optional[jnp.ndarray] = None):
    """The (cos, sin) a forward pass rotates with: (seq, head_dim) for positions 0..seq_len-1, or with
    segments and cfg.rope_positions == "document", (batch, seq, head_dim) rows whose positions restart
    at 0 on each document (the same table entries, gathered)."""
    tables = rope_tables(cfg, seq_len, scaled)
    if segments is None or cfg.rope_positions == "absolute":
        return tables
    positions = document_positions(segments)
    return tuple(table[positions] for table in tables)


def forward_hidden(
    params: dict,
    tokens: jnp.ndarray,
    cfg: ModelConfig,
    *,
    segments: Optional[jnp.ndarray] = None,
    return_layers: bool = False,
):
    """Token ids (batch, seq) -> final-normed hidden states (batch, seq, d_model) in compute dtype.

    segments: (batch, seq) int32 document index of every token (olmax.model.attention.segment_ids of
    the batch's doc_lens), or None for one document per row. With them attention stays within each
    document, and with cfg.rope_positions == "document" each document's positions start at 0.

    With return_layers, also returns every layer's output stacked as (n_layers, batch, seq, d_model)
    (before the final norm), which is what per-layer parity checks compare.
    """
    cdt = jnp.dtype(cfg.compute_dtype)
    x = constrain(lookup_rows(params["embed"], tokens, cdt), ACTIVATION_AXES)
    ropes = {scaled: rope_for(cfg, tokens.shape[1], scaled, segments) for scaled in (False, True)}
    period, n_layers = cfg.global_every, cfg.n_layers
    n_groups, tail = divmod(n_layers, period)
    layers = params["layers"]
    per_layer = []

    if n_groups:
        grouped = jax.tree.map(lambda w: w[: n_groups * period].reshape(n_groups, period, *w.shape[1:]), layers)
        run = _group_fn(cfg, 0, period, return_layers)  # every full group has the first group's pattern
        x, outs = jax.lax.scan(lambda h, g: run(h, g, ropes, segments), x, grouped)
        if return_layers:
            per_layer.append(outs.reshape(n_groups * period, *outs.shape[2:]))
    if tail:
        start = n_groups * period
        run = _group_fn(cfg, start, tail, return_layers)
        x, outs = run(x, jax.tree.map(lambda w: w[start:], layers), ropes, segments)
        per_layer.append(outs)

    x = final_norm(params, x, cfg)
    if return_layers:
        return x, jnp.concatenate(per_layer)
    return x


def lm_head(params: dict, hidden: jnp.ndarray, cfg: ModelConfig) -> jnp.ndarray:
    """Hidden states -> float32 logits over the PADDED vocabulary (OLMo-core computes the loss over
    all padded_vocab_size logits; slice [..., :vocab_size] to compare with an unpadded model)."""
    w = params["lm_head"].astype(jnp.dtype(cfg.compute_dtype))
    return jnp.einsum("btd,dv->btv", hidden, w, preferred_element_type=jnp.float32)


def forward(params: dict, tokens: jnp.ndarray, cfg: ModelConfig, *, segments: Optional[jnp.ndarray] = None):
    """Token ids (batch, seq) -> float32 logits (batch, seq, padded_vocab_size); segments as in
    `forward_hidden`."""
    return lm_head(params, forward_hidden(params, tokens, cfg, segments=segments), cfg)


def param_shardings(model: ModelConfig, mesh: Mesh) -> dict:
    """NamedShardings of the parameters on `mesh`, by the rules table."""
    return tree_shardings(param_specs(model), mesh, is_leaf=lambda x: isinstance(x, ParamSpec))
