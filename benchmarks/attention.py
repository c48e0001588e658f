"""The `xla` attention backend on XLA:CPU: the plain formulation (explicit (seq, seq) scores, mask,
softmax, autodiff) against the blockwise one now in olmax.model.attention (query blocks against their
key band, flash-style custom VJP), forward and forward+backward, side by side in one process.

    .venv/bin/python benchmarks/attention.py [--runs 5 --blocks 64,128,256 --json out.json]

Shapes default to bench-small's attention (docs/performance/cpu.md): q (4, 1024, 8, 64), k and v with 8
kv heads, fp32, one CPU device, window 512 and global. The timings of the variants are interleaved
(plain, block a, block b, ..., plain, ...) so load from other jobs hits them alike; each figure is
the median of --runs calls after one compiling call. Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from olmax.model import attention as attn


def plain_attention(q, k, v, window):
    """The `xla` backend before the blockwise rewrite: the whole (seq, seq) score matrix per head,
    masked, float32 softmax, differentiated by autodiff."""
    b, t, h, d = q.shape
    kv = k.shape[2]
    g = h // kv
    q = q.reshape(b, t, kv, g, d).transpose(0, 2, 3, 1, 4).reshape(b, kv, g * t, d)
    k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    scores = jnp.einsum("bkmd,bksd->bkms", q, k, preferred_element_type=jnp.float32) * (d**-0.5)
    scores = jnp.where(jnp.tile(attn.causal_mask(t, window), (g, 1)), scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkms,bksd->bkmd", probs, v)
    return out.reshape(b, kv, g, t, d).transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)


def blockwise(block: int):
    """olmax's `xla` backend traced with XLA_BLOCK = block (the module reads it at trace time)."""

    def run(q, k, v, window):
        saved, attn.XLA_BLOCK = attn.XLA_BLOCK, block
        try:
            return attn.attention(q, k, v, window=window, backend="xla")
        finally:
            attn.XLA_BLOCK = saved

    return run


def compiled(fn, window, cotangent):
    """(forward, forward+backward) jitted; the backward takes the gradients of q, k and v."""
    fwd = jax.jit(lambda q, k, v: fn(q, k, v, window))
    loss = lambda q, k, v: jnp.sum(cotangent * fn(q, k, v, window))
    return fwd, jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def time_call(fn, args) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def model_rows(runs: int) -> list[dict]:
    """bench-small's layers forward+backward and its whole train step, with the `xla` backend as it
    is (blockwise) and with `plain_attention` as the table's `xla` entry at trace time; the two alternate, and both
    steps advance one shared train state (the step donates it)."""
    from olmax.config.recipes import resolve
    from olmax.model.olmo3 import forward_hidden, init_params
    from olmax.model.sharding import make_mesh
    from olmax.step.state import init_train_state
    from olmax.step.train_step import batch_sharding, make_train_step

    cfg = resolve("bench-small", None, [])
    m = cfg.model
    ids = np.random.default_rng(0).integers(0, m.vocab_size, (cfg.trainer.global_batch, cfg.data.seq_len), np.int32)
    blockwise_fn = attn.BACKENDS["xla"]

    def traced_with(fn, build):
        """build() with the backend table's `xla` entry set to fn while it traces."""
        jax.clear_caches()  # jax.checkpoint caches the traced block by function: retrace it with fn
        attn.BACKENDS["xla"] = fn
        try:
            return build()
        finally:
            attn.BACKENDS["xla"] = blockwise_fn

    params = jax.jit(init_params, static_argnums=0)(m, jax.random.key(0))

    def layers(p):
        out, vjp = jax.vjp(lambda p: forward_hidden(p, jnp.asarray(ids), m), p)
        return vjp(jnp.ones_like(out))

    mesh = make_mesh(cfg.mesh, jax.devices()[:1])
    with jax.set_mesh(mesh):
        state = {"s": init_train_state(cfg, mesh, jax.random.key(0))}
        batch = {"input_ids": jax.device_put(ids, batch_sharding(cfg, mesh))}
        pieces = {}
        for name, fn in (("plain", plain_attention), ("blockwise", blockwise_fn)):
            lay = traced_with(fn, lambda: jax.jit(layers).lower(params).compile())
            step = traced_with(fn, lambda: make_train_step(cfg, mesh).lower(state["s"], batch).compile())
            pieces[name] = (lay, step)

        def run_step(step):
            state["s"], metrics = step(state["s"], batch)
            float(metrics["loss"])

        times = {name: ([], []) for name in pieces}
        for i in range(runs + 1):  # the first round warms up
            for name, (lay, step) in pieces.items():
                t_layers = time_call(lay, (params,))
                t0 = time.perf_counter()
                run_step(step)
                if i:
                    times[name][0].append(t_layers)
                    times[name][1].append(time.perf_counter() - t0)
    print(f"bench-small, {cfg.trainer.global_batch} x {cfg.data.seq_len} tokens, median of {runs} after 1, alternating")
    print(f"{'variant':<10} {'layers fwd+bwd s':>17} {'train step s':>13}")
    rows = []
    for name, (lay, stp) in times.items():
        rows.append({"variant": name, "layers_fwd_bwd_s": statistics.median(lay), "step_s": statistics.median(stp)})
        print(f"{name:<10} {rows[-1]['layers_fwd_bwd_s']:17.2f} {rows[-1]['step_s']:13.2f}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--windows", default="512,none", help="comma-separated; 'none' = global")
    parser.add_argument("--blocks", default=str(attn.XLA_BLOCK), help="block sizes of the blockwise rows")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--model",
        action="store_true",
        help="instead: bench-small's layers fwd+bwd and whole train step, plain vs blockwise",
    )
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    if args.model:
        rows = model_rows(args.runs)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"recipe": "bench-small", "runs": args.runs, "rows": rows}, f, indent=2)
        return

    rng = np.random.default_rng(0)
    shape = lambda n: (args.batch, args.seq, n, args.head_dim)
    q, k, v, cot = (
        jnp.asarray(rng.standard_normal(shape(n), np.float32))
        for n in (args.heads, args.kv_heads, args.kv_heads, args.heads)
    )
    variants = {"plain": plain_attention}
    variants.update({f"blockwise {b}": blockwise(int(b)) for b in args.blocks.split(",")})
    windows = [None if w == "none" else int(w) for w in args.windows.split(",")]

    print(
        f"attention q {shape(args.heads)}, kv heads {args.kv_heads}, fp32, {jax.device_count()} "
        f"{jax.default_backend()} device(s); median of {args.runs} after 1 compiling call"
    )
    print(f"{'window':>7} {'variant':<15} {'fwd s':>8} {'fwd+bwd s':>10} {'fwd+bwd vs plain':>17}")
    rows = []
    for window in windows:
        fns = {name: compiled(fn, window, cot) for name, fn in variants.items()}
        times = {name: ([], []) for name in fns}
        for fwd, both in fns.values():  # compile
            time_call(fwd, (q, k, v)), time_call(both, (q, k, v))
        for _ in range(args.runs):
            for name, (fwd, both) in fns.items():
                times[name][0].append(time_call(fwd, (q, k, v)))
                times[name][1].append(time_call(both, (q, k, v)))
        plain_both = statistics.median(times["plain"][1])
        for name, (f, fb) in times.items():
            row = {"window": window, "variant": name, "fwd_s": statistics.median(f), "fwd_bwd_s": statistics.median(fb)}
            rows.append(row)
            print(
                f"{str(window):>7} {name:<15} {row['fwd_s']:8.3f} {row['fwd_bwd_s']:10.3f} "
                f"{plain_both / row['fwd_bwd_s']:16.2f}x"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"shape": shape(args.heads), "kv_heads": args.kv_heads, "runs": args.runs, "rows": rows}, f, indent=2
            )


if __name__ == "__main__":
    main()
