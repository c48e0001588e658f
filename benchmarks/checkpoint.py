"""Checkpoint save and restore: time and bytes on disk, with olmax's own checkpoint code.

    .venv/bin/python benchmarks/checkpoint.py                          # bench-small full state, 1B params only
    .venv/bin/python benchmarks/checkpoint.py --rows bench-small --step-time 16.9 --json out.json

Rows, each in its own process (peak RSS = that process's ru_maxrss), each in a temp dir removed after:
- `bench-small`: the full run state of the `bench-small` recipe (parameters, both fp32 Adam moments,
  step, skip window, config/meta/data/experiment JSON) written by `RunCheckpoints`, the trainer's
  checkpointer: an asynchronous save. "block" is the time `save()` holds the training loop (Orbax
  copies the arrays to host, then writes in the background), "save s" until the write is committed
  (`close()`, which waits for it). A first save into another directory runs before the timed one, so
  the timed save is a steady-state one (Orbax's one-time setup is in "block cold"). Restore is
  `RunCheckpoints.restore` onto the same 1-device mesh, until the arrays are ready.
- `1b-params` / `1b-params-bf16`: an OLMo-2-1B-shaped model (d_model 2048, 16 layers, 16 heads of
  128, MLP 8192, vocab 100278; 1.48B parameters), PARAMETERS ONLY, fp32 / bf16, with `save_params` /
  `load_params` (synchronous: save returns once written). Its full state (fp32 params + 2 fp32
  moments, 12 bytes per parameter, ~18 GB) does not fit beside the other jobs on a 23 GiB machine.
  (fp32 currently fails: `save_params` bounds Orbax's bytes in flight to 1 GB, and the stacked MLP
  weights are one 1.07 GB array; docs/performance/checkpoint-and-loader.md.)
- `1b-full` (opt-in, needs ~40 GB of RAM): that model's full state, as `bench-small`.
- `warm-start`: `olmax ckpt warm-start` (olmax.checkpoint.surgery.warm_start, keeping params and moments) of
  the bench-small full state on 8 CPU devices. The source checkpoint is written first in the same
  process; then the peak-RSS mark is reset (/proc/self/clear_refs) so that "peak RSS" is the warm
  start's own. Also reported: the most any one device holds of the restored state (the state passes
  through sharded over the devices). On CPU the devices share the host's memory, so host RSS stays
  about one state; on accelerators the shards live in device memory.

Random values stand in for trained ones (Orbax skips chunks equal to the fill value and compresses
the rest, so zeros would understate the bytes): the Adam moments of `bench-small` are filled with
noise, the 1B's parameters are drawn one array at a time.

"restored ok" compares a float32 sum of every array before the save and after the restore.
"block / step" is the steady-state blocking time as a fraction of one training step: `--step-time`
seconds, by default olmax's bench-small step time from docs/performance/cpu.md's throughput table. Prints a
table; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from shapes import SHAPE_1B

RECIPE = "bench-small"
# OLMo-2-1B's shape (d_model 2048, 16 layers of 16 heads x 128, MLP 8192) with OLMo 3's vocabulary.
ONE_B = [*SHAPE_1B, "model.vocab_size=100278"]
ROWS = {
    "bench-small": ("full", []),
    "1b-params": ("params", ONE_B),
    "1b-params-bf16": ("params", ONE_B + ["model.param_dtype=bfloat16"]),
    "1b-full": ("full", ONE_B),
    "warm-start": ("warm", []),
}
WARM_DEVICES = 8
DEFAULT_ROWS = ["bench-small", "1b-params-bf16", "1b-params"]
# olmax's bench-small step on this CPU, docs/performance/cpu.md "Latest table" (2026-11-29 22:09-22:38, load ~2).
STEP_TIME_S, STEP_TIME_SOURCE = 16.86, "olmax bench-small s/step, docs/performance/cpu.md table of 2026-11-29 22:09"


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def disk_bytes(path: Path) -> int:
    """What `du -sb` says: the apparent size of every file under `path`."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def leaf_sums(tree) -> list[float]:
    """One float32 sum per array: equal before the save and after the restore iff (almost surely) the
    restored arrays are the saved ones, without keeping a second copy of a 6 GB model around."""
    import jax
    import jax.numpy as jnp

    return [float(jnp.sum(x.astype(jnp.float32))) for x in jax.tree.leaves(tree)]


def trained_moments(state):
    """`state` with random Adam moments in place of the initial zeros: Orbax does not write chunks
    that equal the fill value, so a step-0 state would measure as parameters only on disk."""
    import jax

    adam = state.opt_state.adam
    keys = iter(jax.random.split(jax.random.key(1), 2 * len(jax.tree.leaves(adam.mu))))
    noise = lambda x: 1e-3 * jax.random.normal(next(keys), x.shape, x.dtype)
    mu = jax.tree.map(noise, adam.mu)
    nu = jax.tree.map(lambda x: noise(x) ** 2, adam.nu)
    opt = state.opt_state._replace(adam=adam._replace(mu=mu, nu=nu))
    return jax.block_until_ready(state._replace(opt_state=opt))


# ----------------------------------------------------------------------------------------------
# Rows (each runs in a child process)


def full_state(cfg, tmp: Path) -> dict:
    """Async save of the whole TrainState with RunCheckpoints, then restore it (module doc)."""
    import jax

    from olmax.checkpoint.store import RunCheckpoints
    from olmax.model.sharding import make_mesh
    from olmax.step.state import abstract_state, init_train_state

    mesh = make_mesh(cfg.mesh, jax.devices()[:1])
    with jax.set_mesh(mesh):
        state = trained_moments(init_train_state(cfg, mesh, jax.random.key(0)))
        nbytes = sum(x.nbytes for x in jax.tree.leaves(state))
        sums = leaf_sums(state)
        peaks = {"init": peak_rss_gib()}
        data_state = {"batches_processed": 1}  # what the loader's state() stands for in a real run

        cold = RunCheckpoints(tmp / "cold", cfg)
        t0 = time.perf_counter()
        cold.save(1, state, data_state, mesh)
        block_cold = time.perf_counter() - t0
        cold.close()
        shutil.rmtree(tmp / "cold")

        ckpt = RunCheckpoints(tmp / "run", cfg)
        t0 = time.perf_counter()
        ckpt.save(1, state, data_state, mesh)
        block = time.perf_counter() - t0
        ckpt.close()
        total = time.perf_counter() - t0
        peaks["save"] = peak_rss_gib()
        del state

        reader = RunCheckpoints(tmp / "run", cfg)
        t0 = time.perf_counter()
        restored, _ = jax.block_until_ready(reader.restore(1, abstract_state(cfg, mesh)))
        restore = time.perf_counter() - t0
        reader.close()
        peaks["restore"] = peak_rss_gib()
        ok = leaf_sums(restored) == sums
    return {
        "what": "full state",
        "state_bytes": nbytes,
        "disk_bytes": disk_bytes(tmp / "run" / "1"),
        "block_cold_s": block_cold,
        "block_s": block,
        "save_s": total,
        "restore_s": restore,
        "restored_ok": ok,
        "peak_rss_gib_after": peaks,
    }


def params_only(cfg, tmp: Path) -> dict:
    """save_params (synchronous) and load_params of random parameters. They are drawn one array at a
    time (N(0, 0.02) in the parameter dtype): `init_params` jits the whole tree at once and its
    temporaries (~10 bytes per parameter) would set the peak RSS instead of the checkpoint code."""
    import jax

    from olmax.checkpoint.store import load_params, save_params
    from olmax.model.olmo3 import abstract_params

    abstract = abstract_params(cfg.model)
    keys = iter(jax.random.split(jax.random.key(0), len(jax.tree.leaves(abstract))))
    draw = jax.jit(lambda key, a: 0.02 * jax.random.normal(key, a.shape, a.dtype), static_argnums=1)
    params = jax.tree.map(lambda a: jax.block_until_ready(draw(next(keys), a)), abstract)
    nbytes = sum(x.nbytes for x in jax.tree.leaves(params))
    sums = leaf_sums(params)
    peaks = {"init": peak_rss_gib()}
    t0 = time.perf_counter()
    save_params(tmp / "params", params, cfg.model, {"source": "benchmark"})
    save = time.perf_counter() - t0
    peaks["save"] = peak_rss_gib()
    del params
    t0 = time.perf_counter()
    restored, _, _ = jax.block_until_ready(load_params(tmp / "params"))
    restore = time.perf_counter() - t0
    peaks["restore"] = peak_rss_gib()
    return {
        "what": "params only",
        "state_bytes": nbytes,
        "disk_bytes": disk_bytes(tmp / "params" / "0"),
        "block_s": save,
        "save_s": save,
        "restore_s": restore,
        "restored_ok": leaf_sums(restored) == sums,
        "peak_rss_gib_after": peaks,
    }


def _proc_status_gib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 2**20  # kB
    raise KeyError(field)


def warm(cfg, tmp: Path) -> dict:
    """warm_start of a saved full state on WARM_DEVICES devices (module doc)."""
    import gc

    import jax

    from olmax.checkpoint.store import RunCheckpoints
    from olmax.checkpoint.surgery import restore_state, warm_start
    from olmax.model.sharding import make_mesh
    from olmax.step.state import init_train_state

    mesh = make_mesh(cfg.mesh, jax.devices()[:1])
    with jax.set_mesh(mesh):
        state = trained_moments(init_train_state(cfg, mesh, jax.random.key(0)))
        nbytes = sum(x.nbytes for x in jax.tree.leaves(state))
        ckpt = RunCheckpoints(tmp / "run", cfg)
        ckpt.save(1, state, {"batches_processed": 1}, mesh)
        ckpt.close()
    del state
    gc.collect()
    jax.clear_caches()
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM (the peak RSS) to the current RSS
    before = _proc_status_gib("VmRSS")
    t0 = time.perf_counter()
    warm_start(tmp / "run", tmp / "warm", keep=("params", "moments"), reset_step=True)
    seconds = time.perf_counter() - t0
    peak = _proc_status_gib("VmHWM")
    restored = restore_state(tmp / "run", 1, cfg)
    per_device = {}
    for leaf in jax.tree.leaves(restored):
        for shard in leaf.addressable_shards:
            per_device[shard.device.id] = per_device.get(shard.device.id, 0) + shard.data.nbytes
    return {
        "what": "warm start",
        "state_bytes": nbytes,
        "devices": jax.device_count(),
        "seconds": seconds,
        "rss_before_gib": before,
        "peak_rss_gib_during": peak,
        "max_device_bytes": max(per_device.values()),
    }


def run_row(row: str, tmp: Path) -> dict:
    from olmax.config.recipes import resolve
    from olmax.model.olmo3 import count_params

    kind, overrides = ROWS[row]
    cfg = resolve(RECIPE, None, overrides)
    out = {"full": full_state, "params": params_only, "warm": warm}[kind](cfg, tmp)
    return {
        **out,
        "params": count_params(cfg.model),
        "param_dtype": cfg.model.param_dtype,
        "peak_rss_gib": peak_rss_gib(),
    }


# ----------------------------------------------------------------------------------------------
# Parent: run the rows, print the table


def run_child(row: str, tmp_root: str | None) -> dict:
    tmp = tempfile.mkdtemp(prefix=f"olmax-ckpt-bench-{row}-", dir=tmp_root)
    env = dict(os.environ)
    if ROWS[row][0] == "warm":
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={WARM_DEVICES}"
    try:
        proc = subprocess.run(
            [sys.executable, __file__, "--child", row, "--tmp", tmp], capture_output=True, text=True, env=env
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if proc.returncode:
        lines = proc.stderr.strip().splitlines()
        return {"error": lines[-1] if lines else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def print_table(results: dict, step_time: float, step_source: str) -> None:
    gb = 1e9
    print(
        f"{'row':14s} {'what':12s} {'params':>7s} {'in RAM GB':>9s} {'disk GB':>8s} {'block cold':>10s} "
        f"{'block s':>8s} {'save s':>7s} {'save GB/s':>9s} {'restore s':>9s} {'rest GB/s':>9s} "
        f"{'block/step':>10s} {'peak RSS GiB init/save/restore':>30s} {'restored ok':>11s}"
    )
    for row, r in results.items():
        if "error" in r:
            print(f"{row:14s} failed: {r['error']}")
            continue
        if r["what"] == "warm start":
            continue
        disk = r["disk_bytes"] / gb
        cold = f"{r['block_cold_s']:10.2f}" if "block_cold_s" in r else f"{'-':>10s}"
        peaks = "/".join(f"{v:.2f}" for v in r["peak_rss_gib_after"].values())
        frac = f"{r['block_s'] / step_time:10.1%}" if r["what"] == "full state" else f"{'(sync)':>10s}"
        print(
            f"{row:14s} {r['what']:12s} {r['params'] / 1e9:6.2f}B {r['state_bytes'] / gb:9.2f} {disk:8.2f} {cold} "
            f"{r['block_s']:8.2f} {r['save_s']:7.2f} {disk / r['save_s']:9.2f} {r['restore_s']:9.2f} "
            f"{disk / r['restore_s']:9.2f} {frac} {peaks:>30s} {str(r['restored_ok']):>11s}"
        )
    print(f"block/step: against {step_time:.2f} s/step ({step_source})")
    for row, r in results.items():
        if r.get("what") == "warm start":
            print(
                f"{row}: state {r['state_bytes'] / gb:.2f} GB over {r['devices']} devices, "
                f"{r['seconds']:.1f} s; most on one device {r['max_device_bytes'] / gb:.3f} GB "
                f"({r['max_device_bytes'] / r['state_bytes']:.1%} of the state); host RSS "
                f"{r['rss_before_gib']:.2f} GiB before, peak {r['peak_rss_gib_during']:.2f} GiB during"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", nargs="+", choices=list(ROWS), default=DEFAULT_ROWS)
    p.add_argument(
        "--step-time",
        type=float,
        help=f"seconds per training step for block/step (default {STEP_TIME_S}: {STEP_TIME_SOURCE})",
    )
    p.add_argument("--tmp", help="where the checkpoints are written (default: the system temp dir)")
    p.add_argument("--json", help="also write the results to this file")
    p.add_argument("--child", choices=list(ROWS), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(run_row(args.child, Path(args.tmp))))
        return
    if args.step_time is not None and args.step_time <= 0:
        p.error(f"--step-time must be positive, got {args.step_time}")
    step_time, source = STEP_TIME_S, STEP_TIME_SOURCE
    if args.step_time:
        step_time, source = args.step_time, "given with --step-time"
    results = {row: run_child(row, args.tmp) for row in args.rows}
    print_table(results, step_time, source)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"step_time_s": step_time, "step_time_source": source, "rows": results}, indent=1)
        )


if __name__ == "__main__":
    main()
