"""Training throughput of olmax's step on ONE TPU chip (v5e: "TPU v5 lite"), every row in this one
process (one process at a time may hold the chip), with the configuration that fits chosen by the
compiler.

    python benchmarks/tpu_throughput.py [--only 7b-layers --only 190m --fit 1b:7:float32:full --json out.json]
    python benchmarks/tpu_throughput.py --smoke     # the same code path on CPU at tiny shapes
    python benchmarks/tpu_throughput.py --only 190m --profile DIR   # + device time by op (tpu_profile.py)
    python benchmarks/tpu_throughput.py --only 190m --chip-holds    # + the HBM the step takes on the chip

Rows (ROWS), each the `olmo3_7b` recipe with dotted overrides, attention `auto` (splash on a TPU), the
recipe's loss_chunk and AdamW with skip-step, olmax.step.state.init_train_state's state and
olmax.step.train_step.make_train_step's step: `matmul` (a bf16 8192^3 matmul, the reference for "% of
matmul rate"), `7b-layers` (OLMo 3 7B's layer shape and full vocabulary, as many layers as fit, fp32 or
bf16 parameters, whichever fits more), `7b-layers-v8k` (the same, vocabulary 8192), `190m` (OLMo-core
3.0.0's olmo3_190M shape, 2 x 8192 tokens a step) and `1b` (olmo3_1B's shape, layers cut to fit).

How a row's configuration is chosen, before anything is allocated: each candidate's step is compiled
from abstract arrays (olmax.fit.compiler.compile_step) and fits when the compiler takes it with its peak
within the chip's budget, as model.remat=auto decides (olmax.fit.remat). Shapes go most layers (largest
micro-batch) first, per parameter dtype; a shape whose parameter, Adam and gradient bytes alone exceed
the budget is not compiled. Each shape is compiled keeping the most (the first set of
olmax.config.remat.AUTO_LADDER) and, if that does not fit, recomputing whole blocks (`full`); for the
first shape that fits only with `full`, auto's bisection over the ladder picks the least recompute.
--fit ROW:LAYERS:DTYPE:REMAT:MICRO fixes what it names of a row (a remat given is compiled alone);
--compile-cache DIR keeps every compiled program for the next run on the same host. The rows' shapes and
the fits found on a v5e: docs/performance/tpu-v5e.md.

Per row: --warmup untimed steps, then --steps timed ones, each ended by block_until_ready on its
metrics; s/step is their median. TFLOP/s and MFU by both conventions of olmax.fit.flops (mt: MaxText's,
ex: the exact count) against the chip's peak (olmax.fit.chips, else --peak, default 197 TFLOP/s: Cloud
TPU v5e docs) and against this run's matmul rate. HBM: `xla peak` is the compiler's peak of the step
program (memory_analysis); `hbm peak` is memory_stats' peak_bytes_in_use after the row, the process's
high-water mark so far (run a row alone with --only for its own). compile-check's figure of what the
chip holds (the TPU compiler's heap + code, olmax.fit.compiler.memory_of's hbm_gib) is printed under
the table; --chip-holds measures what the step takes on the chip after the timed steps (chip_holds:
a filler bisection, a second or two per try) and prints it beside. A row that fails (out of memory,
nothing fits) prints its error and the next one runs; --stop-after S starts no row after S seconds
(those are reported as not started), and --json is rewritten after every row, so a run cut short
keeps what it measured. Prints a table; asserts nothing.

--smoke: tiny shapes on the CPU (d_model 64, 256 tokens, vocabulary 2048, at most 4 layers, a 0.05 GiB
"HBM" budget so the search runs), 1 warm-up and 2 timed steps: it proves the script runs end to end,
its figures mean nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # olmax from this checkout

from chip_memory import FILLER_BLOCK, chip_holds  # noqa: E402 - the chip's measure of a step's HBM
from gpu_mfu import timed_steps  # noqa: E402 - this folder's GPU table: plain Python, no jax import
from shapes import SHAPE_1B, SHAPE_190M, TINY_SHAPE  # noqa: E402
from tpu_profile import PROFILE_STEPS, side_by_side  # noqa: E402 - a trace's device time by op
from tpu_profile import read as read_profile  # noqa: E402

GIB = 2**30
V5E_PEAK_TFLOPS = 197.0  # Cloud TPU v5e docs: 197 TFLOP/s bf16 per chip (one JAX device)
RECIPE = "olmo3_7b"
COMMON = [
    "data.seq_len=8192",
    "model.attention=auto",
    "trainer.micro_batch_size=null",
    "mesh.data=1",
    "mesh.fsdp=-1",
    "mesh.context=1",
    "mesh.tensor=1",
]
SMOKE = [*TINY_SHAPE, "model.vocab_size=2048", "trainer.loss_chunk=128"]
SMOKE_MAX_LAYERS = 4
SMOKE_HBM_GIB = 0.05


class Row(NamedTuple):
    overrides: list[str]
    batch: int  # instances of data.seq_len per step
    search: str  # "layers": the most layers that fit, up to the shape's; "micro": the largest micro-batch
    dtypes: tuple[str, ...]  # model.param_dtype candidates, preferred first


ROWS = {
    "7b-layers": Row([], 1, "layers", ("float32", "bfloat16")),
    "7b-layers-v8k": Row(["model.vocab_size=8192"], 1, "layers", ("float32",)),
    "190m": Row(SHAPE_190M, 2, "micro", ("float32",)),
    "1b": Row(SHAPE_1B, 1, "layers", ("float32", "bfloat16")),
}
ALL_ROWS = ("matmul", *ROWS)


def log(line: str) -> None:
    print(line, flush=True)


def row_config(name: str, args, extra: list[str]):
    from olmax.config.recipes import resolve

    row = ROWS[name]
    overrides = [*COMMON, *row.overrides, f"trainer.global_batch={row.batch}", *(SMOKE if args.smoke else [])]
    return resolve(RECIPE, None, [*overrides, *args.set, *extra])


def the_chip(device, args):
    """(chip for the compiler's budget or None, peak TFLOP/s, where the HBM limit came from). The chip
    table's entry for this device kind (olmax.fit.chips), else one made from memory_stats' bytes_limit;
    --hbm-gib replaces the HBM limit (on CPU it is the only budget there is), --peak the peak."""
    from olmax.fit.chips import SCOPED_VMEM_64MIB, Chip, chip_of_device_kind

    chip = chip_of_device_kind(device.device_kind)
    peak = args.peak or (chip.peak_tflops if chip else V5E_PEAK_TFLOPS)
    limit = (device.memory_stats() or {}).get("bytes_limit")
    if args.hbm_gib:
        limit_gib, source = args.hbm_gib, "--hbm-gib"
    elif chip is not None:
        limit_gib, source = chip.hbm_limit_gib, f"olmax.fit.chips ({chip.name})"
    elif limit:
        limit_gib, source = limit / GIB, "memory_stats bytes_limit"
    else:
        return None, peak, "none (CPU without --hbm-gib)"
    if chip is None:
        flags = SCOPED_VMEM_64MIB if device.platform == "tpu" else ()
        chip = Chip(
            name=device.device_kind,
            platform=device.platform,
            peak_tflops=peak,
            hbm_limit_gib=limit_gib,
            device_kind=device.device_kind,
            libtpu_flags=flags,
        )
    return dataclasses.replace(chip, hbm_limit_gib=limit_gib), peak, source


# ----------------------------------------------------------------------------------------------
# Choosing what fits


def state_bytes(model, accumulated: bool) -> int:
    """Bytes the step holds whatever its activations: parameters in model.param_dtype, two fp32 Adam
    moments (olmax.step.optim) and the gradients: fp32 sums over micro-batches (olmax.step.train_step's
    accumulate), or with one micro-batch in the parameters' dtype (the compiler folds the fp32 sum
    into its consumers: the 7B's layer shape at 1 layer, bf16 parameters, 1 x 8192 tokens, compiled
    for v5e with every activation kept, peaked at 12.81 GiB against 13.35 counting fp32 gradients)."""
    import numpy as np

    from olmax.model.olmo3 import count_params

    item = np.dtype(model.param_dtype).itemsize
    return count_params(model) * (item + 4 + 4 + (4 if accumulated else item))


def layer_candidates(cfg, most: int, budget: Optional[float]) -> list[int]:
    """Layer counts to try, most first: from the most whose state_bytes fit the budget down to 1
    (none when even one layer's do not: its step cannot fit, and a compile near the HBM limit is the
    slowest, the compiler rescheduling to fit)."""
    accumulated = (cfg.trainer.micro_batch_size or cfg.trainer.global_batch) < cfg.trainer.global_batch
    fits = lambda n: budget is None or state_bytes(_layers(cfg, n).model, accumulated) <= budget * GIB
    return [n for n in range(most, 0, -1) if fits(n)]


def _layers(cfg, n: int):
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, n_layers=n))


def _with(cfg, **model_fields):
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **model_fields))


class Prober:
    """Compiles candidate steps (olmax.fit.compiler.compile_step) from abstract arrays, each at most
    once: remat_search.Candidate figures by (shape, remat, order), the compiled step kept for those
    that fit."""

    def __init__(self, mesh, options: dict, where: str, budget: Optional[float]):
        self.mesh, self.options, self.where, self.budget = mesh, options, where, budget
        self.seen: dict = {}  # key -> (Candidate, compiled or None, the TPU compiler's heap or None)
        self.seconds: list[float] = []

    def __call__(self, cfg, mesh=None):
        """The remat_search.Compile of cfg's step (mesh: this prober's; bisect passes it back)."""
        from olmax.fit.compiler import CompilerRefused, compile_step
        from olmax.fit.remat_search import Candidate

        m, t = cfg.model, cfg.trainer
        key = (m.n_layers, m.param_dtype, t.micro_batch_size, m.remat, m.remat_serial)
        if key in self.seen:
            return self.seen[key][0]
        t0 = time.perf_counter()
        try:
            compiled, _, _, heap = compile_step(cfg, self.mesh, self.options, self.where)
        except CompilerRefused as e:
            if e.memory != "HBM":  # a kernel's tiles: no layer count or remat changes that
                raise
            self.seconds.append(time.perf_counter() - t0)
            c = Candidate(m.remat, m.remat_serial, None, False, self.seconds[-1], e.reason)
            compiled, heap, what = None, None, f"refused by the compiler ({e.reason})"
        else:
            self.seconds.append(time.perf_counter() - t0)
            peak = compiled.memory_analysis().peak_memory_in_bytes / GIB
            fits = self.budget is None or peak <= self.budget
            c = Candidate(m.remat, m.remat_serial, peak, fits, self.seconds[-1])
            what = f"peak {peak:.3f} GiB, {'fits' if fits else 'over the budget'}"
        log(f"    {describe(cfg)}: {what} [{self.seconds[-1]:.0f} s]")
        self.seen[key] = (c, compiled if c.fits else None, heap)
        return c

    def compiled(self, cfg):
        """(compiled step, the TPU compiler's heap in bytes or None) of a candidate that fits."""
        m, t = cfg.model, cfg.trainer
        return self.seen[(m.n_layers, m.param_dtype, t.micro_batch_size, m.remat, m.remat_serial)][1:]


class Fit(NamedTuple):
    """What --fit fixes of a row's configuration (None: searched)."""

    layers: Optional[int] = None
    param_dtype: Optional[str] = None
    remat: Optional[str] = None  # model.remat, a policy or tags; fixed, it is compiled alone (no bisection)
    micro_batch: Optional[int] = None


def parse_fit(text: str) -> tuple[str, Fit]:
    """ROW:LAYERS:DTYPE:REMAT:MICRO, trailing and empty fields searched: "1b:7:float32:full"."""
    name, *fields = text.split(":")
    if name not in ROWS or len(fields) > 4:
        raise argparse.ArgumentTypeError(f"{text!r}: want ROW:LAYERS:DTYPE:REMAT:MICRO, ROW one of {', '.join(ROWS)}")
    layers, dtype, remat, micro = (fields + [""] * 4)[:4]
    if dtype not in ("", "float32", "bfloat16"):
        raise argparse.ArgumentTypeError(f"{text!r}: DTYPE is float32 or bfloat16, not {dtype!r}")
    try:
        fit = Fit(int(layers) if layers else None, dtype or None, remat or None, int(micro) if micro else None)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: LAYERS and MICRO are whole numbers") from None
    return name, fit


def short_remat(remat: str) -> str:
    """A remat set of tags, short: q_proj,k_proj,v_proj,attn_context -> q,k,v,ctx."""
    return remat.replace("_proj", "").replace("attn_context", "ctx").replace("mlp_", "")


def describe(cfg) -> str:
    m, t = cfg.model, cfg.trainer
    micro = t.micro_batch_size or t.global_batch
    serial = ", serial" if m.remat_serial else ""
    return (
        f"{m.n_layers} layers, {m.param_dtype} params, {t.global_batch // micro} x {micro} x {cfg.data.seq_len}"
        f" tokens, remat {short_remat(m.remat)}{serial}"
    )


def choose(name: str, args, mesh, chip, where: str):
    """-> (cfg, compiled step, its heap in bytes or None, Prober, remat candidates or None): the row's
    configuration (module doc)."""
    from olmax.config.remat import AUTO, AUTO_LADDER
    from olmax.fit.compiler import budget_gib, target_options
    from olmax.fit.remat_search import bisect, with_remat

    row, device = ROWS[name], mesh.devices.flat[0]
    fit = args.fit.get(name, Fit())
    budget = budget_gib(chip) if chip is not None else None
    prober = Prober(mesh, target_options(chip, device.platform), where, budget)
    fixed_remat = fit.remat is not None
    # auto: the ladder's most kept set first (where it fits, it is auto's choice: bisect's sets are
    # nested, each leaner than the one above), then the leanest, which decides whether the shape fits
    tries = [fit.remat] if fixed_remat else [AUTO_LADDER[0], AUTO_LADDER[-1]]
    base = row_config(name, args, [f"model.remat={tries[0]}"])
    log(
        f"  {name}: fit search on {where}, budget "
        + ("none (every candidate fits)" if budget is None else f"{budget:.2f} GiB")
        + f", model.remat {' then '.join(short_remat(r) for r in tries)}"
    )
    shapes = []  # (shape configs preferred first), one group per parameter dtype
    if row.search == "layers":
        most = min(base.model.n_layers, SMOKE_MAX_LAYERS) if args.smoke else base.model.n_layers
        for dtype in [fit.param_dtype] if fit.param_dtype else row.dtypes:
            cfg = _with(base, param_dtype=dtype)
            layers = [fit.layers] if fit.layers else layer_candidates(cfg, most, budget)
            if not layers:
                one = state_bytes(_layers(cfg, 1).model, False) / GIB
                log(f"    {dtype} params: one layer's parameters, Adam moments and gradients alone take {one:.2f} GiB")
            shapes.append([_layers(cfg, n) for n in layers])
    else:
        cfg = _with(base, param_dtype=fit.param_dtype) if fit.param_dtype else base
        micros = [fit.micro_batch] if fit.micro_batch else [m for m in range(row.batch, 0, -1) if row.batch % m == 0]
        shapes.append(
            [dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, micro_batch_size=m)) for m in micros]
        )
    best, first_fits = None, False
    for group in shapes:  # the first shape that fits in each dtype's group; the most layers overall
        for cfg in group:
            if best is not None and cfg.model.n_layers <= best.model.n_layers:
                break  # no more layers than the choice so far: not worth a compile
            fitting = next((r for r in tries if prober(with_remat(cfg, r, False)).fits), None)
            if fitting is not None:
                best, first_fits = cfg, fitting == tries[0]
                break
    if best is None:
        raise RuntimeError(f"{name}: nothing fits (every candidate above was refused or over the budget)")
    if fixed_remat or first_fits:
        chosen, tried = with_remat(best, tries[0], False), None
    else:  # model.remat=auto's bisection (olmax.fit.remat_search), the compiles above reused
        log(f"  {name}: the shape fits recomputing whole blocks; model.remat=auto's bisection over remat.AUTO_LADDER")
        found, tried = bisect(_with(best, remat=AUTO), mesh, prober)
        chosen = with_remat(best, found.remat, found.serial)
    log(f"  {name}: chose {describe(chosen)}")
    return chosen, *prober.compiled(chosen), prober, tried


# ----------------------------------------------------------------------------------------------
# Rows


def run_matmul(args) -> dict:
    """Best of 3 batches of 10 back-to-back bf16 matmuls, after a compile and a warm-up."""
    import jax
    import jax.numpy as jnp

    n = 512 if args.smoke else 8192
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.bfloat16)
    f = jax.jit(jnp.matmul)
    f(a, b).block_until_ready()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        outs = [f(a, b) for _ in range(10)]
        jax.block_until_ready(outs)
        best = min(best, (time.perf_counter() - t0) / 10)
        del outs
    return {"row": "matmul", "n": n, "s_per_matmul": best, "tflops": 2 * n**3 / best / 1e12}


def run_row(name: str, args, chip, peak: float) -> dict:
    import jax
    import numpy as np

    from olmax.fit.compiler import memory_of
    from olmax.fit.flops import exact_step_flops, maxtext_step_flops
    from olmax.fit.remat_search import describe_devices
    from olmax.model.attention import resolve_backend
    from olmax.model.olmo3 import count_params
    from olmax.model.sharding import make_mesh
    from olmax.step.state import init_program
    from olmax.step.train_step import batch_layout, batch_sharding

    device = jax.devices()[0]
    t_row = time.perf_counter()
    before = device.memory_stats()
    base = row_config(name, args, [])
    mesh = make_mesh(base.mesh, [device])
    cfg, compiled, heap, prober, tried = choose(name, args, mesh, chip, describe_devices([device]))
    layout = batch_layout(cfg, mesh)
    m, seq = cfg.model, cfg.data.seq_len
    tokens = np.random.default_rng(0).integers(0, m.vocab_size, (cfg.trainer.global_batch, seq), dtype=np.int32)
    batch = {"input_ids": jax.device_put(tokens, batch_sharding(cfg, mesh))}
    with jax.set_mesh(mesh):
        t0 = time.perf_counter()  # olmax.step.state's jitted init, its compile timed apart
        init = init_program(cfg, mesh).lower(jax.random.key(0), None).compile()
        init_compile_s = time.perf_counter() - t0
        state = jax.block_until_ready(init(jax.random.key(0), None))
        init_s = time.perf_counter() - t0
        state, times, losses = timed_steps(compiled, state, batch, args.warmup + args.steps)
        profile = None
        if args.profile:  # a few more steps under JAX's profiler, after the timed ones
            trace = Path(args.profile) / name
            with jax.profiler.trace(str(trace)):
                state, _, _ = timed_steps(compiled, state, batch, PROFILE_STEPS)
            profile = read_profile(trace, PROFILE_STEPS, compiled.as_text())
    del state, batch
    stats = device.memory_stats() or {}
    holds = None
    if args.chip_holds:

        def step():
            with jax.set_mesh(mesh):
                fresh = init(jax.random.key(0), None)
            jax.block_until_ready(compiled(fresh, {"input_ids": jax.device_put(tokens, batch_sharding(cfg, mesh))}))

        holds = chip_holds(step, before)
    memory = memory_of(compiled, heap, None if chip is None else chip.hbm_limit_gib)
    s = statistics.median(times[args.warmup :])
    gb = cfg.trainer.global_batch
    flops = {"mt": maxtext_step_flops(m, seq, gb).total, "ex": exact_step_flops(m, seq, gb).total}
    return {
        "row": name,
        "config": describe(cfg),
        "n_layers": m.n_layers,
        "param_dtype": m.param_dtype,
        "micro_batch": layout.micro_batch,
        "accum_steps": layout.accum_steps,
        "remat": m.remat,
        "remat_serial": m.remat_serial,
        "attention": resolve_backend(m.attention, device.platform, m.compute_dtype),
        "vocab": m.padded_vocab_size,
        "params": count_params(m),
        "tokens_per_step": gb * seq,
        "compiles_s": prober.seconds,
        "init_s": init_s,
        "init_compile_s": init_compile_s,
        # model.remat=auto's bisection, when the most kept set did not fit (remat_search.Candidate)
        "remat_search": None if tried is None else [dataclasses.asdict(c) for c in tried],
        "step_times_s": times[args.warmup :],
        "first_step_s": times[0],
        "losses": losses,
        "s_per_step": s,
        "tokens_per_s": gb * seq / s,
        "tflop_per_step": {k: v / 1e12 for k, v in flops.items()},
        "tflops": {k: v / 1e12 / s for k, v in flops.items()},
        "mfu": {k: v / 1e12 / s / peak for k, v in flops.items()},
        "xla_peak_gib": memory["peak_gib"],
        "hbm_peak_gib": stats["peak_bytes_in_use"] / GIB if "peak_bytes_in_use" in stats else None,
        "compile_check_hbm_gib": memory["hbm_gib"],  # the TPU compiler's heap + code (None off TPU)
        "chip_holds_gib": holds,  # --chip-holds: chip_holds' measure, after the timed steps
        "profile": profile,  # tpu_profile.op_times of PROFILE_STEPS more steps (--profile), else None
        "row_s": time.perf_counter() - t_row,
    }


# ----------------------------------------------------------------------------------------------
# Report


def table(rows: list[dict], peak: float) -> str:
    mm = next((r for r in rows if r["row"] == "matmul" and "error" not in r), None)
    rate = mm["tflops"] if mm else None
    lines = []
    if mm:
        lines.append(
            f"matmul bf16 {mm['n']}^3: {mm['tflops']:.1f} TFLOP/s ({100 * mm['tflops'] / peak:.1f}% of {peak:g})"
        )
    head = (
        f"{'row':14s} {'configuration':84s} {'s/step':>7s} {'tokens/s':>9s} {'TFLOP/s mt':>10s} {'ex':>6s} "
        f"{'MFU mt':>7s} {'ex':>6s} {'%mm mt':>7s} {'ex':>6s} {'xla GiB':>7s} {'hbm GiB':>7s} {'compile s':>9s}"
    )
    lines.append(head)
    for r in rows:
        if r["row"] == "matmul":
            continue
        if "error" in r:
            lines.append(f"{r['row']:14s} FAILED: {r['error']}")
            continue
        config = f"{r['config']}, {r['attention']}"
        pct = {k: f"{100 * v / rate:6.1f}%" if rate else f"{'-':>7s}" for k, v in r["tflops"].items()}
        hbm = "-" if r["hbm_peak_gib"] is None else f"{r['hbm_peak_gib']:.2f}"
        lines.append(
            f"{r['row']:14s} {config:84s} {r['s_per_step']:7.4f} {r['tokens_per_s']:9.0f} {r['tflops']['mt']:10.1f} "
            f"{r['tflops']['ex']:6.1f} {100 * r['mfu']['mt']:6.1f}% {100 * r['mfu']['ex']:5.1f}% {pct['mt']:>7s} "
            f"{pct['ex']:>6s} {r['xla_peak_gib']:7.2f} {hbm:>7s} {sum(r['compiles_s']):5.0f} ({len(r['compiles_s'])})"
        )
    for r in rows:
        if r.get("compile_check_hbm_gib") is not None or r.get("chip_holds_gib") is not None:
            cc, held = r.get("compile_check_hbm_gib"), r.get("chip_holds_gib")
            line = f"{r['row']}: compile-check says the chip holds {cc:.3f} GiB (heap + code)" if cc else r["row"] + ":"
            if held is not None:
                line += f"; it took {held:.3f} GiB on the chip (chip_holds, {FILLER_BLOCK / GIB:.4f} GiB resolution)"
            lines.append(line + f"; XLA's peak {r['xla_peak_gib']:.3f} GiB")
    lines.append(
        f"MFU against {peak:g} TFLOP/s; %mm = of the matmul row's rate; mt = MaxText's FLOP convention (unpadded "
        "vocabulary, every layer global), ex = the exact count; xla = the step program's compiled peak, hbm = the "
        "process's peak_bytes_in_use so far"
    )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--only", action="append", choices=ALL_ROWS, help=f"rows to run (repeatable; default all: {' '.join(ALL_ROWS)})"
    )
    p.add_argument("--steps", type=int, help="timed steps per row (default 10; smoke 2)")
    p.add_argument("--warmup", type=int, help="untimed steps first (default 2; smoke 1)")
    p.add_argument("--json", help="write the rows here (rewritten after every row)")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on CPU (module doc)")
    p.add_argument("--peak", type=float, help="peak TFLOP/s when olmax.fit.chips does not know the chip (default 197)")
    p.add_argument("--hbm-gib", type=float, help="HBM limit per device for the fit search (default: the chip's)")
    p.add_argument(
        "--fit",
        action="append",
        default=[],
        type=parse_fit,
        metavar="ROW:LAYERS:DTYPE:REMAT:MICRO",
        help="a row's fit, no search for the fields given (repeatable; e.g. 1b:7:float32:full, 190m:::full:1)",
    )
    p.add_argument("--compile-cache", help="JAX's persistent compilation cache directory (reused by the next run)")
    p.add_argument("--stop-after", type=float, help="start no row after this many seconds of the run")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override for every row")
    p.add_argument("--profile", help="trace more steps of each row into DIR/<row> (device time by op: tpu_profile.py)")
    p.add_argument("--chip-holds", action="store_true", help="measure the HBM each row's step takes (chip_holds)")
    args = p.parse_args(argv)
    if args.chip_holds and args.smoke:
        p.error("--chip-holds measures a TPU chip's memory; --smoke runs on the CPU")
    named = [name for name, _ in args.fit]
    if len(set(named)) < len(named):
        p.error(f"--fit names a row twice: {' '.join(sorted(n for n in set(named) if named.count(n) > 1))}")
    args.fit = dict(args.fit)
    if args.smoke:
        os.environ["JAX_PLATFORMS"] = "cpu"
        args.hbm_gib = args.hbm_gib or SMOKE_HBM_GIB
    else:  # the TPU's flag profile, as the olmax commands set it (splash's tiles need its scoped VMEM)
        from olmax.cli.common import tpu_profile_env

        tpu_profile_env()
    args.steps = args.steps or (2 if args.smoke else 10)
    args.warmup = args.warmup or (1 if args.smoke else 2)

    import jax

    if args.compile_cache:  # a second run on the same host compiles nothing (JAX's persistent cache)
        jax.config.update("jax_compilation_cache_dir", args.compile_cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    device = jax.devices()[0]
    chip, peak, source = the_chip(device, args)
    env = {
        "device": device.device_kind,
        "platform": device.platform,
        "devices": len(jax.devices()),
        "jax": jax.__version__,
        "LIBTPU_INIT_ARGS": os.environ.get("LIBTPU_INIT_ARGS", ""),
        "peak_tflops": peak,
        "hbm_limit_gib": None if chip is None else chip.hbm_limit_gib,
        "hbm_limit_from": source,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "steps": args.steps,
        "warmup": args.warmup,
        "smoke": args.smoke,
        "set": args.set,
    }
    log(
        f"tpu_throughput: {device.device_kind} ({device.platform}, {len(jax.devices())} devices), peak {peak:g} "
        f"TFLOP/s, HBM limit {env['hbm_limit_gib']} GiB from {source}; {args.warmup} warm-up + {args.steps} timed "
        f"steps per row" + ("  [SMOKE: tiny shapes on CPU, figures meaningless]" if args.smoke else "")
    )
    rows, start = [], time.perf_counter()
    for name in args.only or ALL_ROWS:
        log(f"{name} ...")
        t0 = time.perf_counter()
        try:
            if args.stop_after and t0 - start > args.stop_after:
                raise TimeoutError(f"not started: {t0 - start:.0f} s into the run, past --stop-after")
            row = run_matmul(args) if name == "matmul" else run_row(name, args, chip, peak)
        except Exception as e:  # out of memory, nothing fits: reported in the table, the next row runs
            row = {"row": name, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:400] if str(e) else ''}"}
        gc.collect()
        jax.clear_caches()
        done = "done"
        if "init_s" in row:
            done += f", the state's init {row['init_s']:.0f} s ({row['init_compile_s']:.0f} s of it compiling)"
        log(f"  {name}: " + row.get("error", done) + f" ({time.perf_counter() - t0:.0f} s)")
        if row.get("profile"):
            log(row["profile"].get("error") or side_by_side({"olmax": row["profile"]}))
        rows.append(row)
        if args.json:
            Path(args.json).write_text(json.dumps({"env": env, "rows": rows}, indent=2))
    log(table(rows, peak))
    return 0


if __name__ == "__main__":
    sys.exit(main())
