"""Seconds per step, tokens/s, TFLOP/s and MFU of olmax's train step on ONE GPU (H100/H200/B200).

    bash benchmarks/gpu_mfu.sh                     # makes a venv, installs .[gpu], runs this
    python benchmarks/gpu_mfu.py [--rows 7b-4l --rows 7b --steps 10 --warmup 3 --json out.json]
    python benchmarks/gpu_mfu.py --dry-run         # the same code path on CPU at a tiny size

Each row builds the step that `olmax compile-check --topology h200:1x1` compiles
(olmax.step.train_step.make_train_step on a 1-device mesh, the state of olmax.step.state.init_train_state:
fp32 parameters and Adam moments, bf16 compute, skip-step AdamW, clipping, z-loss, the fused output
layer + loss), runs --warmup untimed steps (the first compiles) and then --steps timed ones, each
ended by block_until_ready on its metrics. Every row runs in a process of its own, so each starts
with the GPU's memory empty, its peak memory is its own, and a row that runs out of memory cannot
disturb the next. Rows (docs/performance/gpu.md):
- `7b-4l`: the OLMo 3 7B's layer shape (d_model 4096, 32 heads of 128, MLP 11008, vocab 100278
  padded to 100352) with 4 layers (3 windowed of 4096 + 1 global, as layers 0-3 of the 7B), one
  instance of 8192 tokens per step, no rematerialization.
- `7b-4l-b2`: the same with 2 x 8192 tokens, OLMo-core's per-rank micro-batch for the 7B stage 1
  (`rank_microbatch_size=2 * 8192` in OLMo-3-1025-7B-pretrain-1.py).
- `7b`: the whole 7B (32 layers, 7.30B parameters), one instance of 8192 tokens, every block
  recomputed in the backward pass (model.remat=full): its fp32 parameters, gradients and two Adam
  moments alone take 109 GiB, so on one GPU only an H200 (or larger) holds it at all, and only with
  the activations of one layer at a time and 95% of the GPU's memory for XLA (ROW_ENV).
- `190m`: OLMo-core's `TransformerConfig.olmo3_190M` shape (d_model 768, 12 layers, 12 heads of 64,
  MLP 3072, the 7B's vocabulary and window pattern), 2 x 8192 tokens (its script's rank micro-batch).
Attention is `model.attention=auto`, which on a GPU in bf16 is cuDNN's fused kernel with the 4096
window (olmax.model.attention.resolve_backend). The process runs with the chip's GPU profile from
olmax.fit.chips (XLA_FLAGS, the memory fraction and NCCL variables the Slurm launcher exports; flags
already in XLA_FLAGS come after the profile's and win). MFU is given by both FLOP conventions of
olmax.fit.flops (MaxText's and the exact count) against the chip's dense bf16 peak in olmax.fit.chips (the
chip the GPU reports, else --chip). Prints a table; asserts nothing.

--dry-run shrinks every row (d_model 64, 4 heads of 16, MLP 192, 256 tokens, window 128; the rows'
layer counts, batches and remat and the real vocabulary), runs 1 warm-up + 2 timed steps unless
told, and runs `auto` on the CPU, i.e. the xla backend, since cuDNN needs a GPU: it proves the
script runs end to end (the profile's flags included), its figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # olmax from this checkout

from shapes import SHAPE_190M, TINY_SHAPE  # noqa: E402

from olmax.fit.chips import CHIPS, get_chip, gpu_env  # noqa: E402 - plain Python, no jax import

# name -> (overrides on top of olmo3_7b_stage1, instances per step). seq_len 8192 everywhere.
SHAPE_7B_4L = ["model.n_layers=4"]
ROWS = {
    "7b-4l": (SHAPE_7B_4L, 1),
    "7b-4l-b2": (SHAPE_7B_4L, 2),
    "7b": (["model.remat=full"], 1),
    "190m": (SHAPE_190M, 2),
}
# A row's own environment, over the profile's. The whole 7B's step peaks at 127.84 GiB (`olmax
# compile-check --topology h200:1x1`, these overrides): 0.7 GiB over the profile's 90% of an H200's
# 141.0 GiB, within 95% (133.9 GiB), which leaves 7 GiB for CUDA, cuDNN and cuBLAS.
ROW_ENV = {"7b": {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.95"}}
DEFAULT_ROWS = ("7b-4l", "7b-4l-b2", "7b", "190m")
# What every row runs with (a row's own overrides come after and win): `auto` attention (cuDNN on
# the GPU), no rematerialisation (the 4-layer 7B at 2 x 8192 needs 26 GB for parameters, gradients
# and Adam, and its activations stay under ~35 GiB by the XLA:CPU compile of the 7B
# (docs/performance/gpu.md): within an H100's 80 GB), the output layer in chunks of 2048 positions
# (0.8 GB of fp32 logits per chunk), one device.
COMMON = [
    "model.attention=auto",
    "model.remat=none",
    "trainer.loss_chunk=2048",
    "trainer.micro_batch_size=null",
    "data.seq_len=8192",
    "mesh.data=1",
    "mesh.fsdp=-1",
    "mesh.tensor=1",
]
# The rows' layer counts stay (190m: 3 scanned groups of 4 layers; 7b-4l: one; 7b: eight).
DRY_RUN = [*TINY_SHAPE, "trainer.loss_chunk=128"]


def row_config(name: str, dry_run: bool, extra: list[str]):
    from olmax.config.recipes import resolve

    shape, batch = ROWS[name]
    overrides = COMMON + shape + [f"trainer.global_batch={batch}"] + (DRY_RUN if dry_run else []) + extra
    return resolve("olmo3_7b_stage1", None, overrides), overrides


def profile_env(chip_name: str, environ) -> dict[str, str]:
    """The chip's GPU profile as this process's environment: its XLA_FLAGS before any already set
    (XLA takes the last value of a flag, so the caller's win), its other variables unless set."""
    env = dict(gpu_env(get_chip(chip_name)))
    flags = env.pop("XLA_FLAGS")
    out = {k: environ.get(k, v) for k, v in env.items()}
    out["XLA_FLAGS"] = f"{flags} {environ['XLA_FLAGS']}" if environ.get("XLA_FLAGS") else flags
    return out


def timed_steps(step, state, batch, n: int):
    """`n` calls of the compiled `step` on one batch: (state, seconds per call, loss per call)."""
    import jax

    times, losses = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - t0)
        losses.append(float(metrics["loss"]))
    return state, times, losses


def run_row(name: str, args) -> dict:
    """One row, in this process (a child of main)."""
    import jax
    import numpy as np

    from olmax.model.sharding import make_mesh
    from olmax.step.state import init_train_state
    from olmax.step.train_step import batch_sharding, make_train_step

    backend, device = jax.default_backend(), jax.devices()[0]
    about = {
        "row": name,
        "device": device.device_kind,
        "backend": backend,
        "jax": jax.__version__,
        # what this row's XLA ran with
        "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
        "XLA_PYTHON_CLIENT_MEM_FRACTION": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"),
    }
    if not args.dry_run and backend != "gpu":
        return {**about, "no_gpu": True, "error": f"JAX sees no GPU (backend {backend!r}, devices {jax.devices()})"}
    cfg, overrides = row_config(name, args.dry_run, args.set)
    mesh = make_mesh(cfg.mesh, [device])
    step = make_train_step(cfg, mesh)
    tokens = np.random.default_rng(0).integers(
        0, cfg.model.vocab_size, (cfg.trainer.global_batch, cfg.data.seq_len), dtype=np.int32
    )
    batch = {"input_ids": jax.device_put(tokens, batch_sharding(cfg, mesh))}
    with jax.set_mesh(mesh):
        state = init_train_state(cfg, mesh, jax.random.key(0))
    jax.block_until_ready(state)

    state, times, losses = timed_steps(step, state, batch, args.warmup + args.steps)
    stats = device.memory_stats() or {}  # None on CPU
    peak = stats.get("peak_bytes_in_use")
    return {
        **about,
        "overrides": overrides,
        "tokens_per_step": cfg.trainer.global_batch * cfg.data.seq_len,
        "first_step_s": times[0],
        "step_times_s": times[args.warmup :],
        "losses": losses,
        "peak_memory_gib": None if peak is None else peak / 2**30,
    }


def summarize(row: dict, fallback: str, dry_run: bool) -> dict:
    """Median step time and the FLOP figures of olmax.fit.flops for a child's raw row, MFU against the peak
    of the chip the row ran on (`fallback` when olmax.fit.chips does not know its device kind)."""
    import numpy as np

    from olmax.fit.chips import chip_of_device_kind
    from olmax.fit.flops import flops_report

    chip = chip_of_device_kind(row["device"]) or get_chip(fallback)
    row["chip"], row["peak_tflops"] = chip.name, chip.peak_tflops

    cfg, _ = row_config(row["row"], dry_run, row["extra"])
    s_per_step = statistics.median(row["step_times_s"])
    row["s_per_step"] = s_per_step
    row["min_s_per_step"] = min(row["step_times_s"])
    row["loss_finite"] = bool(np.all(np.isfinite(row["losses"])))
    row["flops"] = flops_report(
        cfg.model,
        seq_len=cfg.data.seq_len,
        per_device_batch=cfg.trainer.global_batch,
        devices=1,
        peak_tflops=chip.peak_tflops,
        step_time=s_per_step,
    )
    return row


def table(rows: list[dict]) -> str:
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
    peaks = sorted({f"{r['peak_tflops']:g} TFLOP/s ({r['chip']})" for r in rows if "error" not in r})
    lines.append(
        f"MFU against {', '.join(peaks) or '-'} per device; mt = MaxText's FLOP convention (vocab 100278, every "
        f"layer global), ex = the exact count (padded vocab, windowed pairs); s/step = median"
    )
    return "\n".join(lines)


def _child(args) -> int:
    """`--child ROW --child-out FILE`: run one row here and write its raw figures (or its error)."""
    try:
        row = run_row(args.child, args)
    except Exception as e:  # the parent reports it in the table; the other rows still run
        row = {"row": args.child, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
    Path(args.child_out).write_text(json.dumps(row))
    return 0


def _run_child(name: str, args, env: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="gpu_mfu-") as tmp:
        out = Path(tmp) / "row.json"
        argv = [sys.executable, __file__, "--child", name, "--child-out", str(out)]
        argv += ["--steps", str(args.steps), "--warmup", str(args.warmup)] + [f"--set={s}" for s in args.set]
        argv += ["--dry-run"] if args.dry_run else []
        code = subprocess.run(argv, env={**env, **ROW_ENV.get(name, {})}).returncode
        if not out.exists():  # killed (e.g. by the host's OOM killer) before it could write
            return {"row": name, "error": f"the row's process ended with exit status {code} and no result"}
        row = json.loads(out.read_text())
    row["extra"] = args.set
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", action="append", choices=sorted(ROWS), help=f"default: {' '.join(DEFAULT_ROWS)}")
    p.add_argument("--steps", type=int, help="timed steps per row (default 10; dry run 2)")
    p.add_argument("--warmup", type=int, help="untimed steps first, the first compiles (default 3; dry run 1)")
    gpus = [name for name, c in CHIPS.items() if c.platform == "gpu"]
    p.add_argument(
        "--chip",
        choices=gpus,
        default="h200",
        help="GPU profile and peak when the GPU's device kind is not in olmax.fit.chips (default h200)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra config overrides for every row (e.g. model.remat=save_dots)",
    )
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU, xla attention")
    p.add_argument("--json", help="write the rows and the environment here")
    p.add_argument("--child", choices=sorted(ROWS), help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.steps = args.steps or (2 if args.dry_run else 10)
    args.warmup = args.warmup or (1 if args.dry_run else 3)
    if args.steps < 1 or args.warmup < 1:
        p.error("--steps and --warmup must be at least 1 (the first warm-up step compiles)")
    if args.dry_run:
        os.environ["JAX_PLATFORMS"] = "cpu"
    if args.child:
        return _child(args)

    # the chip's profile, before JAX starts in any row's process; this one never starts JAX (on a GPU
    # it would take the memory the rows need)
    os.environ.update(profile_env(args.chip, os.environ))
    env = {
        "python": platform.python_version(),
        "dry_run": args.dry_run,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "steps": args.steps,
        "warmup": args.warmup,
        "XLA_FLAGS": os.environ["XLA_FLAGS"],
    }
    print(
        f"gpu_mfu: {args.warmup} warm-up + {args.steps} timed steps per row, one process per row, the GPU profile "
        f"of olmax.fit.chips (XLA_FLAGS={os.environ['XLA_FLAGS']})"
        + ("  [DRY RUN: tiny shapes on CPU, figures meaningless]" if args.dry_run else ""),
        flush=True,
    )

    rows = []
    for name in args.rows or DEFAULT_ROWS:
        t0 = time.perf_counter()
        row = _run_child(name, args, dict(os.environ))
        if row.get("no_gpu"):
            print(f"gpu_mfu: {row['error']}; install jax with CUDA (benchmarks/gpu_mfu.sh does) or run with --dry-run")
            return 2
        if "error" not in row:
            row = summarize(row, args.chip, args.dry_run)
            env.update({k: row[k] for k in ("device", "backend", "jax")})
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

    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"env": env, "rows": rows}, indent=2))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
