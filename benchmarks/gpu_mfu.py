"""Seconds per step, tokens/s, TFLOP/s and MFU of olmax's train step on ONE GPU (H100/H200).

    bash benchmarks/gpu_mfu.sh                     # makes a venv, installs .[gpu], runs this
    python benchmarks/gpu_mfu.py [--rows 7b-4l --rows 190m --steps 10 --warmup 3 --json out.json]
    python benchmarks/gpu_mfu.py --dry-run         # the same code path on CPU at a tiny size

Each row builds the real step (olmax.train_step.make_train_step and olmax.state.init_train_state on a 1-device
mesh: fp32 parameters and Adam moments, bf16 compute, skip-step AdamW, clipping, z-loss, the fused
output layer + loss), runs --warmup untimed steps (the first compiles) and then --steps timed ones,
each ended by block_until_ready on its metrics. Rows (docs/performance.md):
- `7b-4l`: the OLMo 3 7B's layer shape (d_model 4096, 32 heads of 128, MLP 11008, vocab 100278
  padded to 100352) with 4 layers (3 windowed of 4096 + 1 global, as layers 0-3 of the 7B), one
  instance of 8192 tokens per step.
- `7b-4l-b2`: the same with 2 x 8192 tokens, OLMo-core's per-rank micro-batch for the 7B stage 1
  (`rank_microbatch_size=2 * 8192` in OLMo-3-1025-7B-pretrain-1.py).
- `190m`: OLMo-core's `TransformerConfig.olmo3_190M` shape (d_model 768, 12 layers, 12 heads of 64,
  MLP 3072, the 7B's vocabulary and window pattern), 2 x 8192 tokens (its script's rank micro-batch).
Attention is `model.attention=auto`, which on a GPU in bf16 is cuDNN's fused kernel with the 4096
window (olmax.model.attention.resolve_backend). MFU is given by both
FLOP conventions of olmax.flops (MaxText's and the exact count) against --peak (989 TFLOP/s, the
H100/H200 SXM dense bf16 datasheet figure). Prints a table; asserts nothing.

--dry-run shrinks every row (d_model 64, 4 heads of 16, MLP 192, 256 tokens, window 128; the rows'
layer counts and batches and the real vocabulary), runs 1 warm-up + 2 timed steps unless told, and
runs `auto` on the CPU, i.e. the xla backend, since cuDNN needs a GPU: it proves the script runs end to end, its
figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

PEAK_TFLOPS = 989.0  # H100 / H200 SXM, dense bf16 (olmax.chips.CHIPS)

# name -> (overrides on top of olmo3_7b_stage1, instances per step). seq_len 8192 everywhere.
SHAPE_7B_4L = ["model.n_layers=4"]
SHAPE_190M = [
    "model.d_model=768",
    "model.n_layers=12",
    "model.n_heads=12",
    "model.n_kv_heads=12",
    "model.head_dim=64",
    "model.mlp_hidden=3072",
]
ROWS = {
    "7b-4l": (SHAPE_7B_4L, 1),
    "190m": (SHAPE_190M, 2),
    "7b-4l-b2": (SHAPE_7B_4L, 2),
}
DEFAULT_ROWS = ("7b-4l", "190m", "7b-4l-b2")
# What every row runs with: `auto` attention (cuDNN on the GPU), no rematerialisation (the 4-layer 7B at 2 x 8192 needs
# 26 GB for parameters, gradients and Adam, and its activations stay under ~35 GiB by the XLA:CPU
# compile of the 7B (docs/performance.md): within an H100's 80 GB), the output layer in chunks of
# 2048 positions (0.8 GB of fp32 logits per chunk).
COMMON = [
    "model.attention=auto",
    "model.remat=none",
    "trainer.loss_chunk=2048",
    "trainer.micro_batch_size=null",
    "data.seq_len=8192",
]
# The rows' layer counts stay (190m: 3 scanned groups of 4 layers; 7b-4l: one).
DRY_RUN = [
    "model.d_model=64",
    "model.n_heads=4",
    "model.n_kv_heads=4",
    "model.head_dim=16",
    "model.mlp_hidden=192",
    "model.sliding_window=128",
    "model.max_position=256",
    "data.seq_len=256",
    "trainer.loss_chunk=128",
]


def row_config(name: str, dry_run: bool, extra: list[str]):
    from olmax.recipes import resolve

    shape, batch = ROWS[name]
    overrides = shape + COMMON + [f"trainer.global_batch={batch}"] + (DRY_RUN if dry_run else []) + extra
    return resolve("olmo3_7b_stage1", None, overrides), overrides


def peak_memory_gib(device) -> float | None:
    stats = device.memory_stats() or {}  # None on CPU
    peak = stats.get("peak_bytes_in_use")
    return None if peak is None else peak / 2**30


def run_row(name: str, args) -> dict:
    import jax
    import numpy as np

    from olmax.flops import flops_report
    from olmax.sharding import make_mesh
    from olmax.state import init_train_state
    from olmax.train_step import batch_sharding, make_train_step

    cfg, overrides = row_config(name, args.dry_run, args.set)
    device = jax.devices()[0]
    mesh = make_mesh(cfg.mesh, [device])
    step = make_train_step(cfg, mesh)
    tokens = np.random.default_rng(0).integers(
        0, cfg.model.vocab_size, (cfg.trainer.global_batch, cfg.data.seq_len), dtype=np.int32
    )
    batch = {"input_ids": jax.device_put(tokens, batch_sharding(cfg, mesh))}
    with jax.set_mesh(mesh):
        state = init_train_state(cfg, mesh, jax.random.key(0))
    jax.block_until_ready(state)

    times, losses = [], []
    for _ in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - t0)
        losses.append(float(metrics["loss"]))
    timed = times[args.warmup :]
    s_per_step = statistics.median(timed)
    report = flops_report(
        cfg.model,
        seq_len=cfg.data.seq_len,
        per_device_batch=cfg.trainer.global_batch,
        devices=1,
        peak_tflops=args.peak,
        step_time=s_per_step,
    )
    del state, batch
    return {
        "row": name,
        "overrides": overrides,
        "first_step_s": times[0],
        "step_times_s": timed,
        "s_per_step": s_per_step,
        "min_s_per_step": min(timed),
        "losses": losses,
        "loss_finite": all(np.isfinite(losses)),
        "peak_memory_gib": peak_memory_gib(device),
        "flops": report,
    }


def table(rows: list[dict], peak: float) -> str:
    head = (
        f"{'row':10s} {'tokens':>7s} {'params':>8s} {'1st step s':>10s} {'s/step':>8s} {'tokens/s':>9s} "
        f"{'TFLOP/s mt':>10s} {'TFLOP/s ex':>10s} {'MFU mt':>7s} {'MFU ex':>7s} {'peak GiB':>8s}"
    )
    lines = [head]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['row']:10s} FAILED: {r['error']}")
            continue
        f = r["flops"]
        mem = "-" if r["peak_memory_gib"] is None else f"{r['peak_memory_gib']:.1f}"
        lines.append(
            f"{r['row']:10s} {f['tokens_per_step']:>7d} {f['params'] / 1e9:>7.3f}B {r['first_step_s']:>10.1f} "
            f"{r['s_per_step']:>8.4f} {f['tokens_per_s']:>9.0f} {f['tflops_per_device_per_s_maxtext']:>10.2f} "
            f"{f['tflops_per_device_per_s_exact']:>10.2f} {100 * f['mfu_maxtext']:>6.2f}% "
            f"{100 * f['mfu_exact']:>6.2f}% "
            f"{mem:>8s}" + ("" if r["loss_finite"] else "  (loss not finite!)")
        )
    lines.append(
        f"MFU against {peak:g} TFLOP/s per device; mt = MaxText's FLOP convention (vocab 100278, every "
        f"layer global), ex = the exact count (padded vocab, windowed pairs); s/step = median"
    )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", action="append", choices=sorted(ROWS), help=f"default: {' '.join(DEFAULT_ROWS)}")
    p.add_argument("--steps", type=int, help="timed steps per row (default 10; dry run 2)")
    p.add_argument("--warmup", type=int, help="untimed steps first, the first compiles (default 3; dry run 1)")
    p.add_argument("--peak", type=float, default=PEAK_TFLOPS, help="peak TFLOP/s per device for MFU")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra config overrides for every row (e.g. model.remat=save_dots)",
    )
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU, xla attention")
    p.add_argument("--json", help="write the rows and the environment here")
    args = p.parse_args(argv)
    args.steps = args.steps or (2 if args.dry_run else 10)
    args.warmup = args.warmup or (1 if args.dry_run else 3)
    if args.steps < 1 or args.warmup < 1:
        p.error("--steps and --warmup must be at least 1 (the first warm-up step compiles)")
    if args.dry_run:
        os.environ["JAX_PLATFORMS"] = "cpu"

    import jax

    backend = jax.default_backend()
    if not args.dry_run and backend != "gpu":
        print(
            f"gpu_mfu: JAX sees no GPU (backend {backend!r}, devices {jax.devices()}); install jax with CUDA "
            "(benchmarks/gpu_mfu.sh does) or run with --dry-run",
            file=sys.stderr,
        )
        return 2
    device = jax.devices()[0]
    env = {
        "device": device.device_kind,
        "backend": backend,
        "jax": jax.__version__,
        "python": platform.python_version(),
        "dry_run": args.dry_run,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "steps": args.steps,
        "warmup": args.warmup,
    }
    print(
        f"gpu_mfu: {env['device']} ({backend}), jax {env['jax']}, {args.warmup} warm-up + {args.steps} timed steps"
        + ("  [DRY RUN: tiny shapes on CPU, figures meaningless]" if args.dry_run else ""),
        flush=True,
    )

    rows = []
    for name in args.rows or DEFAULT_ROWS:
        t0 = time.perf_counter()
        try:
            row = run_row(name, args)
        except Exception as e:  # one row failing (e.g. out of memory) must not lose the others' figures
            row = {"row": name, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
        row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
        print(
            f"  {name}: "
            + (
                row["error"]
                if "error" in row
                else f"{row['s_per_step']:.4f} s/step, first step {row['first_step_s']:.1f} s, "
                f"losses {row['losses'][0]:.3f} -> {row['losses'][-1]:.3f}"
            )
            + f" ({row['wall_s']:.0f} s)",
            flush=True,
        )
        jax.clear_caches()

    print(table(rows, args.peak))
    if args.json:
        Path(args.json).write_text(json.dumps({"env": env, "peak_tflops": args.peak, "rows": rows}, indent=2))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
