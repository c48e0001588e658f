"""Causal (optionally sliding-window) attention behind one function, with selectable backends.

A window of W lets a token see itself and the W-1 tokens before it (OLMo-core, HF `sliding_window=W`).
With segment ids (batch, seq) int32 (`segment_ids`: one id per packed document), a token also sees
only keys of its own segment: causal AND window AND same document, OLMo-core's varlen attention over
`cu_doc_lens`. Without them (None) nothing changes: the same program as before.
Inputs are already rotated: q (batch, seq, n_heads, head_dim), k and v (batch, seq, n_kv_heads,
head_dim); query head h uses kv head h // (n_heads // n_kv_heads) (grouped-query attention).
Scores are scaled by 1/sqrt(head_dim) and the softmax runs in float32.

Backends (docs/attention.md), the table BACKENDS:
  xla     plain JAX, blockwise with a flash-style custom VJP; runs anywhere, the reference.
  cudnn   jax.nn.dot_product_attention with implementation="cudnn" (NVIDIA GPU, bf16/fp16 only);
          it takes no segment ids (jax 0.10.2's public call has no document mask), so it refuses them,
          and it has no context-parallel form (its causal mask cannot start at a chunk's offset).
  splash  Pallas splash attention (TPU); on any other platform it runs in Pallas interpret mode,
          which is slow but exact, so tests can check it on CPU.
  auto    the fast kernel of the platform the step compiles for (`resolve_backend`).

Context parallelism: under a mesh whose `context` axis splits the sequence, each device keeps its
own contiguous chunk of queries and all-gathers keys, values and their segment ids over `context`
(one gather of K and one of V per layer; their gradients come back through its transpose, a
reduce-scatter). The causal, window and document masks then use the chunk's global query offset.
xla and splash do this (CONTEXT_BACKENDS); cudnn is refused, and `auto` runs xla instead of it.

Rematerialisation: every backend names attention's result `attn_context` (remat.ATTENTION_TAG) with
`checkpoint_name`, inside its shard_map where it has one (jax.checkpoint's policy sees names there
too). splash and xla name what their backward pass reads, the output in the kernel's layout and each
row's log-sum-exp (NAMED_RESIDUALS), so a policy keeping the tag does not run attention's forward
again; cudnn names only its output.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.sharding import NamedSharding, PartitionSpec

from olmax.config.model import CONTEXT_BACKENDS, MASKING_BACKENDS, SplashBlocks
from olmax.config.remat import ATTENTION_TAG
from olmax.model.sharding import logical_to_spec

log = logging.getLogger(__name__)

# `auto`: the platform the step compiles for -> its backend. Any other platform (cpu) gets xla.
AUTO_BACKENDS = {"tpu": "splash", "gpu": "cudnn", "cuda": "cudnn"}


def resolve_backend(
    backend: str, platform: str, dtype=jnp.bfloat16, *, doc_masking: bool = False, context: bool = False
) -> str:
    """The backend that runs: `auto` becomes the platform's fast kernel (xla where that kernel
    cannot take the inputs: cuDNN has no float32 kernel, no document mask and no context-parallel
    form), any other name stays; a named backend that cannot mask within documents (`doc_masking`) or
    split the sequence over the mesh's `context` axis (`context`) is an error."""
    lacks = lambda name: [
        what
        for what, needed, able in (
            ("mask attention within documents", doc_masking, MASKING_BACKENDS),
            ("split the sequence over mesh.context", context, CONTEXT_BACKENDS),
        )
        if needed and name not in able
    ]
    if backend == "auto":
        name = AUTO_BACKENDS.get(platform, "xla")
        if name == "cudnn" and jnp.dtype(dtype) not in (jnp.bfloat16, jnp.float16):
            return "xla"
        if lacks(name):
            _warn_once(f"attention: {name} cannot {' or '.join(lacks(name))}; auto runs the xla backend")
            return "xla"
        return name
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; known: auto, {', '.join(BACKENDS)}")
    if lacks(backend):
        raise ValueError(
            f"attention backend {backend!r} cannot {' or '.join(lacks(backend))} (jax's cuDNN call takes no "
            "segment ids and cannot offset its causal mask to a chunk of the sequence): use "
            f"model.attention=auto or one of {', '.join(b for b in BACKENDS if not lacks(b))}"
        )
    return backend


@functools.cache
def _warn_once(message: str) -> None:
    """resolve_backend runs at every trace of the step (each of model.remat=auto's candidate compiles,
    then the run's): the notice is said once per process."""
    log.warning(message)


def segment_ids(doc_lens: jnp.ndarray) -> jnp.ndarray:
    """doc_lens (batch, seq) int32, each row the lengths of its segments in order then zeros (the
    loader's `doc_lens`: documents, then one segment for the padding) -> (batch, seq) int32: the index
    of the segment each token is in. Token t is in segment #{segments ending at or before t}."""
    ends = jnp.cumsum(doc_lens, axis=1)  # non-decreasing: trailing zeros repeat the total
    positions = jnp.arange(doc_lens.shape[1], dtype=ends.dtype)
    return jax.vmap(lambda e: jnp.searchsorted(e, positions, side="right"))(ends).astype(jnp.int32)


def document_positions(segments: jnp.ndarray) -> jnp.ndarray:
    """segment ids (batch, seq) -> (batch, seq) int32: each token's offset from the start of its segment
    (positions restarting at 0 on every document)."""
    pos = jnp.arange(segments.shape[1], dtype=jnp.int32)
    starts = jnp.concatenate([jnp.ones_like(segments[:, :1], bool), segments[:, 1:] != segments[:, :-1]], axis=1)
    return pos - jax.lax.cummax(jnp.where(starts, pos, 0), axis=1)


def target_platform() -> str:
    """The platform of the mesh the step is being built under (`jax.set_mesh`), which for an
    ahead-of-time compile is the target topology's, not the host's; without a mesh, the default
    backend's."""
    device = jax.sharding.get_abstract_mesh().abstract_device
    return device.platform if device is not None else jax.default_backend()


def attention(
    q,
    k,
    v,
    *,
    window: Optional[int],
    backend: str = "xla",
    splash_blocks: Optional[SplashBlocks] = None,
    segments: Optional[jnp.ndarray] = None,
):
    """backend: a BACKENDS name or `auto`. splash_blocks: the splash kernel's tiles (default
    SplashBlocks()). segments: (batch, seq) int32 segment ids (`segment_ids`), or None (no document mask)."""
    layout = _mesh_layout(q, k)
    context = layout is not None and layout.context
    name = resolve_backend(backend, target_platform(), q.dtype, doc_masking=segments is not None, context=context)
    if name == "splash":
        return _splash_attention(q, k, v, window, splash_blocks or SplashBlocks(), segments)
    if name == "xla":
        return _xla_attention(q, k, v, window, segments)
    return BACKENDS[name](q, k, v, window)


def window_mask(i, j, window: Optional[int]):
    """Boolean, broadcasting query positions i against key positions j: may query i see key j?"""
    mask = j <= i
    return mask if window is None else mask & (i - j < window)


def causal_mask(seq_len: int, window: Optional[int]) -> jnp.ndarray:
    """(seq, seq) boolean: query i may attend to key j."""
    return window_mask(jnp.arange(seq_len)[:, None], jnp.arange(seq_len)[None, :], window)


# Query positions per block of the `xla` backend. 128 ran bench-small's attention (seq 1024,
# window 512) fwd+bwd faster than 64 or 256 on XLA:CPU (benchmarks/attention.py, docs/performance/cpu.md).
XLA_BLOCK = 128
# Most band widths one attention call's plan may hold. Blocks of one width run as one loop
# (`jax.lax.scan`), so this bounds what XLA compiles per call whatever the sequence length; a plan
# with more widths widens some bands (docs/attention.md, "xla details": the extra work it costs).
XLA_BAND_WIDTHS = 8


def _blocks(q_len: int, k_len: int, window: Optional[int], block: int, offset):
    """Static plan: (first query, end query, first key, keys) per query block of `block` rows. The keys
    a block needs form one band, [first query - window + 1, end query) in global positions, so its
    scores are computed for a band only: the fully masked rest (the future, and beyond the window)
    is never touched. `offset` is the position of the first query among the keys: None for 0 (the
    whole sequence), or a traced value (one context chunk, whose place is known only on its device):
    then each block needs the width the last chunk needs and its band has a traced start.
    A band ends just after the block's last query, shifted to start no earlier than key 0 and end no
    later than the last key. With at most XLA_BAND_WIDTHS widths in the plan each block's band is what
    it needs; beyond, `_band_widths` widens some bands to a neighbour's width (the extra keys masked)."""
    starts = range(0, q_len, block)
    ends = [min(start + block, q_len) for start in starts]
    if offset is None:
        need = [end if window is None else end - max(0, start - window + 1) for start, end in zip(starts, ends)]
    else:
        need = [
            k_len - q_len + end if window is None else min(k_len, end - start + window - 1)
            for start, end in zip(starts, ends)
        ]
    widths = _band_widths([end - start for start, end in zip(starts, ends)], need, XLA_BAND_WIDTHS)
    plan = []
    for start, end, width in zip(starts, ends, widths):
        if offset is None:
            lo = min(max(0, end - width), k_len - width)
        else:
            lo = jnp.clip(offset + end - width, 0, k_len - width)
        plan.append((start, end, lo, width))
    return plan


def _band_widths(rows: list[int], need: list[int], limit: int) -> list[int]:
    """Each block's band width: what it needs, while the blocks form at most `limit` runs of one
    (rows, width). Beyond, neighbouring runs of equal rows merge, taking the wider width, the merge
    that adds the fewest computed scores first, until `limit` runs remain (on a causal ramp of
    widths: runs of equal length)."""
    runs = []  # [rows per block, width, blocks]
    for r, w in zip(rows, need):
        if runs and runs[-1][:2] == [r, w]:
            runs[-1][2] += 1
        else:
            runs.append([r, w, 1])
    while len(runs) > limit:
        extra = lambda a, b: a[0] * (a[2] * (max(a[1], b[1]) - a[1]) + b[2] * (max(a[1], b[1]) - b[1]))
        merges = [(extra(a, b), i) for i, (a, b) in enumerate(zip(runs, runs[1:])) if a[0] == b[0]]
        if not merges:
            break
        _, i = min(merges)
        a, b = runs[i], runs.pop(i + 1)
        runs[i] = [a[0], max(a[1], b[1]), a[2] + b[2]]
    return [width for _, width, n in runs for _ in range(n)]


def _over_blocks(step, carry, plan):
    """Runs `step(carry, start, lo, rows, width) -> (carry, outputs)` over the plan's blocks in order
    and returns the last carry and each output (a pytree of (batch, kv, rows * group, ...) arrays)
    joined along axis 2. Consecutive blocks of one (rows, width) run as one `jax.lax.scan` over their
    starts and band starts, so XLA compiles one block per width however many blocks there are; a
    block alone runs directly, with static slices where its band start is static."""
    pieces = []
    for (rows, width), run in itertools.groupby(plan, key=lambda b: (b[1] - b[0], b[3])):
        run = list(run)
        if len(run) == 1:
            carry, out = step(carry, run[0][0], run[0][2], rows, width)
        else:
            starts = jnp.array([b[0] for b in run], jnp.int32)
            los = jnp.stack([jnp.asarray(b[2], jnp.int32) for b in run])
            carry, out = jax.lax.scan(lambda c, x, shape=(rows, width): step(c, *x, *shape), carry, (starts, los))
            # (blocks, batch, kv, rows * group, ...) -> (batch, kv, blocks * rows * group, ...)
            out = jax.tree.map(lambda y: jnp.moveaxis(y, 0, 2).reshape(*y.shape[1:3], -1, *y.shape[4:]), out)
        pieces.append(out)
    return carry, jax.tree.map(lambda *p: jnp.concatenate(p, axis=2), *pieces)


def _band(x, lo, width: int, axis: int):
    """x's slice [lo, lo + width) along `axis`; lo a Python int (static) or traced."""
    if isinstance(lo, int):
        return jax.lax.slice_in_dim(x, lo, lo + width, axis=axis)
    return jax.lax.dynamic_slice_in_dim(x, lo, width, axis=axis)


def _band_add(x, lo, update, axis: int):
    """x with `update` added to its slice [lo, lo + update width) along `axis`."""
    if isinstance(lo, int):
        index = [slice(None)] * x.ndim
        index[axis] = slice(lo, lo + update.shape[axis])
        return x.at[tuple(index)].add(update)
    width = update.shape[axis]
    return jax.lax.dynamic_update_slice_in_dim(x, _band(x, lo, width, axis) + update, lo, axis=axis)


_f32_einsum = functools.partial(jnp.einsum, preferred_element_type=jnp.float32)


def _block_scores(q, k, start, lo, window, group, segments, offset):
    """Scaled, masked float32 scores of one block: rows ordered (position, group), keys from lo. The
    mask comes from iotas, which XLA fuses into the same loop as the scaling (no mask constants); with
    segment ids (q's, the keys'), a key of another segment is masked too (every row keeps at least its
    own token). Query rows sit at `offset` (None: 0) + start among the keys."""
    s = _f32_einsum("bkmd,bksd->bkms", q, k) * q.shape[-1] ** -0.5
    i = start + jnp.arange(q.shape[2])[:, None] // group
    if offset is not None:
        i = i + offset
    j = lo + jnp.arange(k.shape[2])[None, :]
    mask = window_mask(i, j, window)
    if segments is not None:
        q_seg, kv_seg = segments
        seg_q = jnp.repeat(_band(q_seg, start, q.shape[2] // group, 1), group, axis=1)
        mask = mask & (seg_q[:, None, :, None] == _band(kv_seg, lo, k.shape[2], 1)[:, None, None, :])
    return jnp.where(mask, s, jnp.finfo(jnp.float32).min)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _banded_attention(q, k, v, segments, offset, window, group):
    return _banded_forward(q, k, v, segments, offset, window, group)[0]


def _banded_forward(q, k, v, segments, offset, window, group):
    """q (batch, kv, q_len * group, d), rows ordered (position, group); k, v (batch, kv, k_len, d);
    segments None or (q's (batch, q_len), the keys' (batch, k_len)); offset None or q's first position
    (traced). Per query block: scores over its key band, a float32 softmax, and its log-sum-exp,
    which is all the backward pass keeps of the probabilities."""

    def block(carry, start, lo, rows, width):
        qb = _band(q, start * group, rows * group, 2)
        s = _block_scores(qb, _band(k, lo, width, 2), start, lo, window, group, segments, offset)
        m = jnp.max(s, axis=-1, keepdims=True)
        p = jnp.exp(s - m)
        total = jnp.sum(p, axis=-1, keepdims=True)
        # Normalising the (rows, d) output rather than the (rows, keys) probabilities: one pass less.
        out = _f32_einsum("bkms,bksd->bkmd", p.astype(v.dtype), _band(v, lo, width, 2))
        return carry, ((out / total).astype(v.dtype), m + jnp.log(total))

    _, (out, lse) = _over_blocks(block, None, _blocks(q.shape[2] // group, k.shape[2], window, XLA_BLOCK, offset))
    # the residuals a policy keeping ATTENTION_TAG saves, so that the backward pass needs no forward
    out, lse = checkpoint_name(out, ATTENTION_TAG), checkpoint_name(lse, ATTENTION_TAG)
    return out, (q, k, v, segments, offset, out, lse)


def _banded_backward(window, group, residuals, dout):
    """Flash-attention's backward, block by block: the probabilities are recomputed from q, k and the
    saved log-sum-exp with one exponential, and with D = rowsum(dout * out),
    dS = P * (dout V^T - D); dq = dS K, dk = dS^T q, dv = P^T dout (scale folded into dq and dk)."""
    q, k, v, segments, offset, out, lse = residuals
    scale = q.shape[-1] ** -0.5
    delta = jnp.sum(dout.astype(jnp.float32) * out.astype(jnp.float32), axis=-1, keepdims=True)

    def block(carry, start, lo, rows, width):
        dk, dv = carry
        qb, do = (_band(x, start * group, rows * group, 2) for x in (q, dout))
        kb, vb = _band(k, lo, width, 2), _band(v, lo, width, 2)
        row_lse, row_delta = (_band(x, start * group, rows * group, 2) for x in (lse, delta))
        p = jnp.exp(_block_scores(qb, kb, start, lo, window, group, segments, offset) - row_lse)
        dp = _f32_einsum("bkmd,bksd->bkms", do, vb)
        ds = p * (dp - row_delta) * scale
        dk = _band_add(dk, lo, _f32_einsum("bkms,bkmd->bksd", ds.astype(q.dtype), qb), 2)
        dv = _band_add(dv, lo, _f32_einsum("bkms,bkmd->bksd", p.astype(do.dtype), do), 2)
        return (dk, dv), _f32_einsum("bkms,bksd->bkmd", ds.astype(k.dtype), kb)

    zeros = (jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32))
    plan = _blocks(q.shape[2] // group, k.shape[2], window, XLA_BLOCK, offset)
    (dk, dv), dq = _over_blocks(block, zeros, plan)
    # segment ids and the offset are integers: no cotangent (None)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None


_banded_attention.defvjp(_banded_forward, _banded_backward)


def _xla_attention(q, k, v, window, segments=None):
    """Plain JAX, any device: blockwise over queries, each block against only the keys its causal
    window allows, with a flash-style custom VJP (`_banded_backward`). On XLA:CPU the time went into
    elementwise passes over the (seq, seq) float32 scores; this skips the masked part (more than
    half of it on a window-512 layer of 1024 tokens) and its backward takes one exponential pass
    instead of re-running and differentiating the softmax. Under a context-parallel mesh it runs per
    chunk of queries against the keys gathered over `context`."""
    if window is not None and window < 1:
        raise ValueError(f"attention window must be at least 1, got {window}")
    layout = _mesh_layout(q, k)
    if layout is not None and layout.context:

        def chunk(q, k, v, *segments):
            offset = jax.lax.axis_index(CONTEXT) * q.shape[1]
            k, v = _gather_context(k), _gather_context(v)
            segs = (segments[0], _gather_context(segments[0])) if segments else None
            return _xla_local(q, k, v, window, segs, offset)

        return _per_shard(layout, chunk, q, k, v, segments)
    return _xla_local(q, k, v, window, None if segments is None else (segments, segments), None)


def _xla_local(q, k, v, window, segments, offset):
    """Layout: (batch, kv head) x (position * group, d) 4-D batched matmuls, the query heads sharing a
    kv head stacked along the rows, which XLA:CPU runs faster than positions-first or 5-D einsums."""
    b, t, h, d = q.shape
    kv = k.shape[2]
    g = h // kv
    q = q.reshape(b, t, kv, g, d).transpose(0, 2, 1, 3, 4).reshape(b, kv, t * g, d)
    k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    out = _banded_attention(q, k, v, segments, offset, window, g)
    return out.reshape(b, kv, t, g, d).transpose(0, 2, 1, 3, 4).reshape(b, t, h, d)


# ----------------------------------------------------------------------------------------------
# Under a device mesh: which axes split q, k and v, and context parallelism

CONTEXT = "context"  # the mesh axis that splits sequences (olmax.config.mesh.MESH_AXES)


class _Layout(NamedTuple):
    q: PartitionSpec  # (batch, seq, heads, head_dim) of q and of the output
    kv: PartitionSpec  # the same for k and v
    segments: PartitionSpec  # (batch, seq)
    context: bool  # whether the sequence is split over `context` (then seq is that axis in each spec)


def _mesh_layout(q, k) -> Optional[_Layout]:
    """How the rules table splits q, k and v under the current mesh (None without one): batch as
    "batch", the sequence as "seq" (over `context`), heads over `tensor` when both the query and
    the kv head counts divide by it (every shard keeps whole GQA groups), otherwise heads unsplit."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return None
    q_spec = logical_to_spec(("batch", "seq", "q_heads", "head_dim"), q.shape, mesh)
    kv_spec = logical_to_spec(("batch", "seq", "kv_heads", "head_dim"), k.shape, mesh)
    if q_spec[2] != kv_spec[2]:  # GQA groups must stay whole on a shard: keep heads unsplit
        q_spec = kv_spec = PartitionSpec(q_spec[0], q_spec[1], None, None)
    return _Layout(q_spec, kv_spec, PartitionSpec(*q_spec[:2]), q_spec[1] == CONTEXT)


def _gather_context(x):
    """Inside a context-parallel shard_map: the whole sequence (axis 1) from every device's chunk."""
    return jax.lax.all_gather(x, CONTEXT, axis=1, tiled=True)


def _per_shard(layout: _Layout, fn: Callable, q, k, v, segments, *extra, extra_specs=()):
    """Runs `fn(*extra, q, k, v[, segments])` per device in a shard_map, every argument split as
    `layout` says (with context parallelism, the sequence over `context`), and returns its output
    split as q. `check_vma=False`: the kernels' outputs carry no varying-axes annotation. Under
    context parallelism the transpose of the all-gathers inside `fn` sends each chunk's share of
    dK/dV back to its owner (a reduce-scatter)."""
    mesh = jax.sharding.get_abstract_mesh()
    args = (*extra, q, k, v) + (() if segments is None else (segments,))
    specs = (*extra_specs, layout.q, layout.kv, layout.kv, layout.segments)[: len(args)]
    return jax.shard_map(fn, mesh=mesh, in_specs=specs, out_specs=layout.q, check_vma=False)(*args)


def dot_product_attention(q, k, v, window: Optional[int], implementation: str):
    """jax.nn.dot_product_attention with OLMo 3's causal window. The `cudnn` backend is this with
    implementation="cudnn"; tests run the identical call with implementation="xla" on CPU.

    `local_window_size=(W-1, 0)`: W-1 keys to the left plus the token itself, none to the right.
    GQA needs no repeat: the function groups query head h onto kv head h // (n_heads // n_kv_heads).
    """
    return jax.nn.dot_product_attention(
        q,
        k,
        v,
        is_causal=True,
        local_window_size=None if window is None else (window - 1, 0),
        implementation=implementation,
    )


@contextlib.contextmanager
def cudnn_target(compute_capability: str):
    """Within: jax's cuDNN attention checks take the GPU generation to be `compute_capability`
    ("9.0"), the target's when the step is compiled ahead of time for a GPU this host lacks.

    jax 0.10.2 (jax/_src/cudnn/fused_attention_stablehlo.py, check_compute_capability and
    is_cuda_compute_capability_equal) asks the host's default backend for the capability; on a CPU
    host that is no GPU at all, so the checks treat the target as older than Hopper and refuse
    head_dim 256 ("The head dim must be <= 128"), which an H100 runs. Only these two checks change,
    and only while a step is traced for the target (olmax.fit.compile_check)."""
    from jax._src.cudnn import fused_attention_stablehlo as cudnn_checks

    current = tuple(int(x) for x in compute_capability.split("."))
    at_least = lambda capability: current >= tuple(int(x) for x in capability.split("."))
    equal = lambda capability: current == tuple(int(x) for x in capability.split("."))
    saved = cudnn_checks.check_compute_capability, cudnn_checks.is_cuda_compute_capability_equal
    cudnn_checks.check_compute_capability, cudnn_checks.is_cuda_compute_capability_equal = at_least, equal
    try:
        yield
    finally:
        cudnn_checks.check_compute_capability, cudnn_checks.is_cuda_compute_capability_equal = saved


def _cudnn_attention(q, k, v, window):
    """cuDNN's fused flash attention (GPU). cuDNN has no float32 kernel."""
    if q.dtype not in (jnp.bfloat16, jnp.float16):
        raise ValueError(
            f"attention backend 'cudnn' needs bfloat16 or float16 inputs, got {q.dtype}; "
            "set model.compute_dtype=bfloat16 or use model.attention=xla"
        )
    # jax's call names none of its residuals: keeping its output still reruns the forward
    return checkpoint_name(dot_product_attention(q, k, v, window, "cudnn"), ATTENTION_TAG)


# Splash attention tiles the (query, key) plane into blocks and skips blocks the mask empties, so a
# window layer does ~seq*W work instead of seq^2/2. The tiles are config (model.splash_blocks); a
# sequence shorter than a tile uses the sequence as the tile.


def _splash_kernel(
    seq_len: int,
    window: Optional[int],
    n_heads: int,
    blocks: SplashBlocks,
    interpret: bool,
    head_shards: int = 1,
    q_seq_shards: int = 1,
):
    """The kernel for one shape, made inside the trace that calls it: its block-sparsity tables
    (numpy) enter that trace as constants, so nothing is placed on the host's default device (which
    an ahead-of-time compile for a TPU topology cannot use) and no tracer outlives its trace. The
    expensive part, walking the mask block by block, is cached by splash itself (its
    `_process_mask` keeps the last 12 masks), so every layer and step after the first reuses it.
    With `q_seq_shards` > 1 (context parallelism) the mask is the whole (seq, seq) one and its
    tables are cut into that many chunks of query blocks, one per device (`manual_sharding_spec`).
    """
    q_block, kv_block, kv_compute = blocks.tiles(seq_len, q_seq_shards)
    shape = (seq_len, seq_len)
    if window is None:
        mask = splash.CausalMask(shape)
    else:
        # LocalMask keeps key j for query i when i - left <= j <= i + right.
        mask = splash.LocalMask(shape, window_size=(window - 1, 0), offset=0)
    sizes = splash.BlockSizes(
        block_q=q_block,
        block_kv=kv_block,
        block_kv_compute=kv_compute,
        # backward blocks (they enable jax.grad): the forward's tiles
        block_q_dkv=q_block,
        block_kv_dkv=kv_block,
        block_kv_dkv_compute=kv_compute,
        block_q_dq=q_block,
        block_kv_dq=kv_block,
    )
    return splash.make_splash_mha(
        splash.MultiHeadMask([mask] * n_heads),
        block_sizes=sizes,
        head_shards=head_shards,
        q_seq_shards=q_seq_shards,
        # the kernel's output and log-sum-exp, what its backward pass reads, heads first
        residual_checkpoint_name=ATTENTION_TAG,
        interpret=interpret,
    )


def _splash_call(kernel, q, k, v, segments):
    """The kernel over a batch: (batch, seq, heads, d) in and out, vmapped over the batch; segments
    None or (q's ids, the keys' ids)."""
    heads_first = lambda x: x.transpose(0, 2, 1, 3)
    q, k, v = heads_first(q), heads_first(k), heads_first(v)
    if segments is None:
        return heads_first(jax.vmap(kernel)(q, k, v))
    one = lambda q, k, v, sq, skv: kernel(q, k, v, segment_ids=splash.SegmentIds(sq, skv))
    return heads_first(jax.vmap(one)(q, k, v, *segments))


def _splash_attention(q, k, v, window, blocks: SplashBlocks, segments=None):
    """Pallas splash attention, vmapped over batch. The kernel takes (heads, seq, head_dim), groups
    query head h onto kv head h // (n_heads // n_kv_heads) itself, and does not scale q. Segment ids
    go in as its `SegmentIds(q, kv)`, which the kernel AND-s with the causal/local mask.

    XLA cannot partition a Mosaic kernel, so under a device mesh (`jax.set_mesh`) the kernel runs
    per shard in a shard_map, split as `_mesh_layout` says. With the sequence split over `context`,
    the kernel is made once for the whole (seq, seq) mask with its tables cut over the query chunks
    (`q_seq_shards`) and passed into the shard_map split so; each device runs its chunk of queries
    against the keys and values all-gathered over `context`.
    """
    if window is not None and window < 1:
        raise ValueError(f"attention window must be at least 1, got {window}")
    _, t, h, d = q.shape
    q = q * jnp.asarray(d**-0.5, q.dtype)
    interpret = target_platform() != "tpu"
    both = None if segments is None else (segments, segments)
    layout = _mesh_layout(q, k)
    if layout is None:
        return _splash_call(_splash_kernel(t, window, h, blocks, interpret), q, k, v, both)
    mesh = jax.sharding.get_abstract_mesh()
    if not layout.context:

        def shard(q, k, v, *segments):
            kernel = _splash_kernel(t, window, q.shape[2], blocks, interpret)
            return _splash_call(kernel, q, k, v, (segments[0], segments[0]) if segments else None)

        return _per_shard(layout, shard, q, k, v, segments)
    head_axis = layout.q[2]
    kernel = _splash_kernel(
        t, window, h, blocks, interpret, mesh.shape[head_axis] if head_axis else 1, mesh.shape[CONTEXT]
    )
    kernel_spec = kernel.manual_sharding_spec(NamedSharding(mesh, PartitionSpec(head_axis, CONTEXT)))

    def chunk(kernel, q, k, v, *segments):
        segs = (segments[0], _gather_context(segments[0])) if segments else None
        return _splash_call(kernel, q, _gather_context(k), _gather_context(v), segs)

    return _per_shard(layout, chunk, q, k, v, segments, kernel, extra_specs=(kernel_spec,))


# The backends whose ATTENTION_TAG names everything their backward pass reads of the forward
# (output and log-sum-exp): keeping the tag spares the forward (olmax.fit.flops.recompute_flops).
NAMED_RESIDUALS = frozenset({"xla", "splash"})

BACKENDS: dict[str, Callable] = {
    "xla": _xla_attention,
    "cudnn": _cudnn_attention,
    "splash": _splash_attention,
}
