"""Continuous batching's throughput: the slot engine (olmax.rollout.engine) against pure decode at the
same slot count, and the static sampler (olmax.rollout.sampler.sample) on the same rows.

    .venv/bin/python benchmarks/rollout_efficiency.py              # tiny model on the CPU, about two minutes
    .venv/bin/python benchmarks/rollout_efficiency.py --compile --runs 2   # cold compiles: lazy, ahead, parallel
    # one TPU v5e (15.7 GiB): the header prints the engine's KV cache, which must fit beside the weights
    python benchmarks/rollout_efficiency.py --model 190m --slots 128 --prompt-len 128 --max-new 2048 \
        --prompts 64 --n 8 --runs 1 --no-static            # KV 9.6 GiB
    python benchmarks/rollout_efficiency.py --model 190m --slots 64 --prompt-len 128 --max-new 4096 \
        --prompts 32 --n 8 --runs 1 --no-static            # KV 9.1 GiB
    python benchmarks/rollout_efficiency.py --model 1b --slots 32 --prompt-len 128 --max-new 2048 \
        --prompts 16 --n 8 --runs 1 --no-static            # KV 8.5 GiB (64 slots: 17 GiB, too many)
    python benchmarks/rollout_efficiency.py --model 1b --slots 64 --prompt-len 128 --max-new 2048 \
        --prompts 16 --n 8 --runs 1 --no-static --kv-gib 9  # paged: 9 GiB of pages for 64 slots

The static sampler's cache is the next power of two of prompt + max new (4096 for 128 + 2048), so its
rows of 128 slots would not fit where the engine's exact cache does: leave it out there (--no-static),
or run it at fewer slots. --kv-gib G pages the engine's KV (EngineConfig.kv_gib, olmax.rollout.pages):
G GiB of pages that rows take as they grow, so that slots whose whole rings would not fit do; a row
that finds none is preempted and prefilled again later (the rows' `preempted` column).

Rows: --prompts random prompts of --prompt-len tokens, --n samples each (GRPO's groups), every row's
length forced by its own limit (EOS off): `uniform`, U(0.1, 1) x --max-new; `lognormal`, median 0.3 x
--max-new (sigma --sigma), clipped to 1 .. --max-new. Temperature 1 (GRPO's sampling). Figures, each
the median of --runs runs after a warm-up run (the compiles):

- engine tok/s: the rows' tokens / the wall time of running the engine until the last row stops
  (inserts, prefills, decoding, reading back); slot efficiency: useful tokens / slot steps (slots x
  decode steps, but for the narrowed steps of the drain, EngineConfig.narrow);
  insert share: the insert programs' time (prefill and copies into the slots, host side included) /
  the wall time. A closed batch ends with a drain: no row waits, the slots empty one by one;
- fed: the same over the chunks during which rows waited for a slot (the engine's steady state, what
  a stream of prompts keeps it in), and their share of the decode steps;
- pure decode tok/s: the ceiling, the same decode program with every slot busy and no insert: --slots
  rows of --max-new tokens, tokens / the decode programs' time;
- static tok/s: `sample` over the same rows, --slots rows per program (prompts_per_program = slots / n,
  as grpo.sample_prompts runs it), and its slot efficiency: tokens / (rows per program x its longest row);
- live bound: each run's HBM-bandwidth bound (benchmarks/decode_bound.py): its decoding steps' weights
  plus the keys and values its rows hold at each of their tokens, at the chip's bandwidth (olmax.fit.
  chips; a v5e's 819 GB/s elsewhere, where the ratio means nothing); pure decode's and the engine's
  tok/s against their own (fed: the fed chunks' steps and tokens, each token's KV the run's mean).

--compile: instead of the table, the engine's cold compile (each figure from a fresh process, JAX's
persistent cache off, median of --runs): the programs the first batch compiles at their first use
(lazy) against `SlotEngine.compile_ahead` compiling the same engine's whole set ahead, one after another
(--workers 1) and in a thread pool (one thread per program up to the host's cores): the ahead step's
seconds, the CPU seconds of all its threads, and the first batch's wall time, compiles included.

Models (bench shapes as benchmarks/tpu_decode.py names them): `tiny` (the `tiny` recipe's model: 4
layers, d_model 128, window 64, the 100k dolma2 vocabulary; float32), `190m` and `1b` (OLMo-core
3.0.0's olmo3_190M and olmo3_1B shapes, benchmarks/shapes.py, with the 7B's windows and vocabulary;
--dtype, default bfloat16). Random weights. --set model.X=Y changes the model. Prints a table; asserts
nothing; --json writes the rows.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # olmax from this checkout

import numpy as np  # noqa: E402
from decode_bound import bound_tokens_per_s, hbm_gbps, kv_bytes, weight_bytes  # noqa: E402 - the live-KV bound
from shapes import SHAPE_1B, SHAPE_190M  # noqa: E402 - the training table's shapes (overrides)

SPREADS = ("uniform", "lognormal")


def model_config(name: str, dtype: str, overrides: list[str]):
    from olmax.config.experiment import ExperimentConfig
    from olmax.config.io import apply_overrides
    from olmax.config.recipes import OLMO3_7B, TINY

    on = lambda model, extra: apply_overrides(dataclasses.replace(ExperimentConfig(), model=model), extra).model
    model = on(TINY if name == "tiny" else OLMO3_7B, {"tiny": [], "190m": SHAPE_190M, "1b": SHAPE_1B}[name])
    model = dataclasses.replace(model, param_dtype=dtype, compute_dtype=dtype, remat="none")
    return on(model, overrides)


def row_lengths(spread: str, rows: int, max_new: int, sigma: float, seed: int):
    """Each row's forced length (module doc)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if spread == "uniform":
        x = rng.uniform(0.1, 1.0, rows)
    else:
        x = 0.3 * np.exp(sigma * rng.standard_normal(rows))
    return np.clip(np.round(x * max_new), 1, max_new).astype(np.int32)


def timed(fn, runs: int) -> tuple[float, object]:
    """(median seconds of `runs` calls after a warm-up call, the last call's result)."""
    fn()
    times, out = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def engine_of(cfg, args, cache_len: int, **knobs):
    """The benchmark's SlotEngine: the options' slots, chunk and pages, temperature 1 (GRPO's draws);
    `knobs`: the rest of EngineConfig's."""
    from olmax.rollout.engine import SlotEngine
    from olmax.rollout.sampler import Sampling

    sampling = Sampling(temperature=1.0, seed=1)
    return SlotEngine(
        cfg,
        slots=args.slots,
        cache_len=cache_len,
        sampling=sampling,
        chunk_steps=args.chunk_steps,
        kv_gib=args.kv_gib,
        **knobs,
    )


def bench_engine(params, cfg, prompts, limits, args, cache_len: int, gbps: float) -> dict:
    """The engine on the rows, closed (until the last row stops) and fed (the chunks during which rows
    were waiting for a slot: what a stream of prompts, an asynchronous RL loop's, would see)."""
    from olmax.rollout.engine_types import Counters

    def run():
        engine = engine_of(cfg, args, cache_len, narrow=args.narrow, refill_at=args.refill_at)
        for i, p in enumerate(prompts):
            engine.add(p, args.n, first_index=i * args.n, limits=limits[i * args.n : (i + 1) * args.n])
        fed, tokens = Counters(args.slots), 0
        t0 = time.perf_counter()
        while engine.pending() or engine.active():
            chunk = engine.run_chunk(params)
            tokens += sum(len(f.tokens) for f in chunk.finished)
            fed = fed + chunk.counters if engine.pending() else fed  # rows waited all through its decoding
        took = time.perf_counter() - t0
        assert tokens == int(limits.sum())  # EOS off: every row to its limit
        return took, engine.totals, fed

    run()  # warm-up: every program the workload needs compiles
    results = sorted((run() for _ in range(args.runs)), key=lambda r: r[0])
    wall, t, fed = results[len(results) // 2]
    fed_s = fed.insert_s + fed.decode_s + fed.host_s
    prompt_lens = np.full(len(limits), args.prompt_len)
    bound = bound_tokens_per_s(cfg, t.decode_steps, args.slots, prompt_lens, limits, gbps)
    per_token = kv_bytes(cfg, prompt_lens, limits) / limits.sum()  # the fed chunks' tokens: the run's mean
    fed_bound = fed.useful_tokens / max(
        1e-12, (fed.decode_steps * weight_bytes(cfg, args.slots) + fed.useful_tokens * per_token) / (gbps * 1e9)
    )
    return {
        "bound_tok_s": bound,
        "fed_bound_tok_s": fed_bound,
        "preempted": t.preempted_rows,
        "tok_s": int(limits.sum()) / wall,
        "wall_s": wall,
        "slot_efficiency": t.slot_efficiency,
        "insert_share": t.insert_s / wall,
        "decode_steps": t.decode_steps,
        "prefills": t.prefills,
        "fed_tok_s": fed.useful_tokens / fed_s if fed_s else float("nan"),
        "fed_slot_efficiency": fed.slot_efficiency,
        "fed_step_share": fed.decode_steps / t.decode_steps,
    }


def bench_pure(params, cfg, prompt, args, cache_len: int, gbps: float) -> dict:
    """Every slot busy for --max-new steps, no insert after the first: the decode programs' tokens/s (paged,
    rows the pool cannot hold wait preempted; their re-inserts are not decode time)."""

    def run():
        engine = engine_of(cfg, args, cache_len)
        engine.add(prompt, args.slots, limits=args.max_new)
        engine.run(params)
        t = engine.totals
        assert t.slot_efficiency == 1.0 or t.preempted_rows
        return t.useful_tokens / t.decode_s, t

    run()
    results = sorted((run() for _ in range(args.runs)), key=lambda r: r[0])
    tok_s, t = results[len(results) // 2]
    lengths = np.full(args.slots, args.max_new)
    bound = bound_tokens_per_s(cfg, t.decode_steps, args.slots, np.full(args.slots, len(prompt)), lengths, gbps)
    return {"tok_s": tok_s, "bound_tok_s": bound, "preempted": t.preempted_rows, "steps": t.decode_steps}


def bench_static(params, cfg, prompts, limits, args) -> dict:
    import jax

    from olmax.rollout.sampler import Sampling, sample

    per = args.slots // args.n
    call = lambda: jax.block_until_ready(
        sample(
            params,
            cfg,
            prompts,
            args.max_new,
            n=args.n,
            sampling=Sampling(temperature=1.0, seed=1),
            limits=limits,
            prompts_per_program=per,
        )
    )
    wall, _ = timed(call, args.runs)
    programs = [limits[i : i + args.slots] for i in range(0, len(limits), args.slots)]
    steps = sum(int(p.max()) for p in programs)
    return {"tok_s": int(limits.sum()) / wall, "slot_efficiency": int(limits.sum()) / (args.slots * steps)}


COMPILES = {"programs": 0, "seconds": 0.0}  # XLA compiles in this process (a persistent cache's hits are none)


def count_compiles() -> None:
    """Count the backend compiles (jax/_src/dispatch.py's event, jax 0.10.2): on a TPU host they, not the
    decoding, can take most of a run, and the rows say how much."""
    import jax

    def add(event: str, seconds: float, **_) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            COMPILES["programs"] += 1
            COMPILES["seconds"] += seconds

    jax.monitoring.register_event_duration_secs_listener(add)


def compiled_so_far(what: str) -> str:
    return f"# {what}: {COMPILES['programs']} programs compiled so far, {COMPILES['seconds']:.0f} s"


def cold_compile(params, cfg, prompts, args, cache_len: int, mode: str) -> dict:
    """One fresh process's figures (--compile): the engine for the first spread's rows, compiled ahead
    with `mode` workers ("lazy": not ahead), then the whole batch run."""

    limits = row_lengths(args.spreads.split(",")[0], args.prompts * args.n, args.max_new, args.sigma, seed=1)
    engine = engine_of(cfg, args, cache_len, narrow=args.narrow, prompt_len=args.prompt_len)
    before, t0, cpu = dict(COMPILES), time.perf_counter(), time.process_time()
    if mode != "lazy":
        engine.compile_ahead(params, workers=int(mode), shortest=args.prompt_len)
    t1, cpu = time.perf_counter(), time.process_time() - cpu
    for i, p in enumerate(prompts):
        engine.add(p, args.n, first_index=i * args.n, limits=limits[i * args.n : (i + 1) * args.n])
    engine.run(params)
    return {
        "programs": COMPILES["programs"] - before["programs"],
        "ahead_s": t1 - t0,
        "ahead_cpu_s": cpu,  # every thread's
        "batch_s": time.perf_counter() - t0,
    }


def compile_table(argv: list[str], args) -> None:
    """--compile's table: each mode's figures from fresh processes, the modes taken in turn."""
    import subprocess

    env = {**os.environ, "JAX_ENABLE_COMPILATION_CACHE": "false"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    modes = {"lazy (at first use)": "lazy", "ahead, serial": "1", "ahead, parallel": "0"}
    got: dict = {name: [] for name in modes}
    for _ in range(args.runs):
        for name, mode in modes.items():
            out = subprocess.run(
                [sys.executable, __file__, *argv, "--compile-once", mode],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            got[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    shape = f"model {args.model}, {args.slots} slots, prompt {args.prompt_len}, max new {args.max_new}"
    shape += f", chunk {args.chunk_steps}, narrow {args.narrow}"
    when = f"{time.strftime('%Y-%m-%d %H:%M %Z')}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
    print(f"# {when}; {shape}; {args.prompts} x {args.n} rows; median of {args.runs} fresh processes each")
    print("| compile | programs | ahead step s | its CPU s (all threads) | first batch s (compiles included) |")
    print("|---|---|---|---|---|")
    median = lambda name, key: statistics.median(r[key] for r in got[name])  # noqa: E731
    for name in modes:
        programs = median(name, "programs")
        ahead, cpu, batch = (median(name, k) for k in ("ahead_s", "ahead_cpu_s", "batch_s"))
        print(f"| {name} | {programs:.0f} | {ahead:.1f} | {cpu:.1f} | {batch:.1f} |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", choices=("tiny", "190m", "1b"))
    p.add_argument("--dtype", help="parameters and compute (default float32 for tiny, else bfloat16)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="model.* override")
    p.add_argument("--slots", type=int, default=16)
    p.add_argument("--prompts", type=int, default=8, help="prompts (groups)")
    p.add_argument("--n", type=int, default=8, help="samples per prompt")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--max-new", type=int, default=64, help="the longest row")
    p.add_argument("--cache-len", type=int, default=0, help="the engine's (0: prompt + max new, to a multiple of 128)")
    p.add_argument("--chunk-steps", type=int, default=32)
    p.add_argument("--refill-at", type=int, default=0, help="EngineConfig.refill_at (0: automatic)")
    p.add_argument("--narrow", type=int, default=2, help="EngineConfig.narrow (0: the drain decodes every slot)")
    p.add_argument("--kv-gib", type=float, default=0.0, help="EngineConfig.kv_gib: paged KV (0: whole rings)")
    p.add_argument("--hbm-gbps", type=float, help="the live bound's bandwidth (default: the chip table's)")
    p.add_argument("--spreads", default=",".join(SPREADS))
    p.add_argument("--sigma", type=float, default=0.8, help="lognormal's sigma")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--no-static", action="store_true", help="leave the static sampler out")
    p.add_argument("--json")
    p.add_argument("--compile-cache", help="JAX's persistent compilation cache directory (reused by the next run)")
    p.add_argument("--compile", action="store_true", help="the cold compile table instead (module doc)")
    p.add_argument("--compile-once", help=argparse.SUPPRESS)  # one process of --compile's: lazy or workers
    args = p.parse_args(argv)
    if args.compile:
        argv = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--compile"]
        compile_table(argv, args)
        return 0
    if args.slots % args.n:
        p.error(f"--slots ({args.slots}) must be a multiple of --n ({args.n}) for the static sampler's programs")
    from olmax.cli.common import tpu_profile_env

    tpu_profile_env()  # a TPU's flag profile, as the olmax commands set it (nothing on a CPU host)
    import jax

    count_compiles()
    if args.compile_cache:  # a second run on the same host compiles nothing (JAX's persistent cache)
        jax.config.update("jax_compilation_cache_dir", args.compile_cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    from olmax.model.olmo3 import init_params
    from olmax.rollout.cache import slots as ring_slots

    cfg = model_config(args.model, args.dtype or ("float32" if args.model == "tiny" else "bfloat16"), args.set)
    cache_len = args.cache_len or -(-(args.prompt_len + args.max_new) // 128) * 128
    # random weights from the `rbg` generator: any weights time the same, and a v5e compiles the 190m's
    # init for 11 s from it (75 s from the default threefry's, libtpu on a 2-core host)
    key = jax.random.key(0, impl="rbg")
    params = jax.block_until_ready(jax.jit(init_params, static_argnums=0)(cfg, key))
    prompts = np.random.default_rng(0).integers(0, cfg.vocab_size, (args.prompts, args.prompt_len)).tolist()
    per_slot = sum(ring_slots(cfg, i, cache_len) for i in range(cfg.n_layers)) * 2 * cfg.n_kv_heads * cfg.head_dim
    kv_gib = args.slots * per_slot * np.dtype(cfg.compute_dtype).itemsize / 2**30
    device = jax.devices()[0]
    gbps = hbm_gbps(device.device_kind, args.hbm_gbps)
    paged = f"paged: {args.kv_gib:g} GiB of pages" if args.kv_gib else "whole rings"
    head = (
        f"# {time.strftime('%Y-%m-%d %H:%M %Z')}, {device.device_kind} ({device.platform}), {platform.machine()}, "
        f"load {os.getloadavg()[0]:.1f}; model {args.model} ({cfg.param_dtype}), {args.slots} slots, "
        f"{args.prompts} x {args.n} rows, prompt {args.prompt_len}, max new {args.max_new}, cache {cache_len} "
        f"({kv_gib:.3g} GiB of KV in whole rings; {paged}), "
        f"chunk {args.chunk_steps}, refill_at {args.refill_at or 'auto'}, narrow {args.narrow}; median of {args.runs}; "
        f"live bounds at {gbps:g} GB/s"
    )
    if args.compile_once:
        print(json.dumps(cold_compile(params, cfg, prompts, args, cache_len, args.compile_once)))
        return 0
    print(head, flush=True)
    pure = bench_pure(params, cfg, prompts[0], args, cache_len, gbps)
    print(
        f"# pure decode: {pure['tok_s']:.0f} tok/s, {pure['tok_s'] / pure['bound_tok_s']:.2f} of its live bound "
        f"({pure['bound_tok_s']:.0f}), {pure['steps']} steps, {pure['preempted']} rows preempted"
    )
    print(compiled_so_far("pure decode done"), flush=True)
    print(
        "| spread | mean len | engine tok/s | pure decode tok/s | engine / pure | engine / live bound "
        "| slot efficiency | insert+prefill share | fed: tok/s, / pure, / live bound, slot efficiency (share of "
        "steps) | preempted | static tok/s | static slot efficiency | engine / static |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    rows = []
    for spread in args.spreads.split(","):  # each row printed and written as it is done (a bounded run)
        limits = row_lengths(spread, args.prompts * args.n, args.max_new, args.sigma, seed=1)
        r = {"spread": spread, "mean_len": float(limits.mean()), "pure_tok_s": pure["tok_s"]}
        engine = bench_engine(params, cfg, prompts, limits, args, cache_len, gbps)
        r.update({f"engine_{k}": v for k, v in engine.items()})
        r.update({"pure_bound_tok_s": pure["bound_tok_s"], "pure_preempted": pure["preempted"]})
        if not args.no_static:
            r.update({f"static_{k}": v for k, v in bench_static(params, cfg, prompts, limits, args).items()})
        rows.append(r)
        r["compiles_so_far"] = dict(COMPILES)
        static = r.get("static_tok_s")
        print(
            f"| {r['spread']} | {r['mean_len']:.0f} | {r['engine_tok_s']:.0f} | {pure['tok_s']:.0f} "
            f"| {r['engine_tok_s'] / pure['tok_s']:.2f} | {r['engine_tok_s'] / r['engine_bound_tok_s']:.2f} "
            f"| {r['engine_slot_efficiency']:.2f} | {100 * r['engine_insert_share']:.1f}% "
            + (  # no fed step at all (no row ever waited: as many slots as rows): no figures
                f"| {r['engine_fed_tok_s']:.0f}, {r['engine_fed_tok_s'] / pure['tok_s']:.2f}, "
                f"{r['engine_fed_tok_s'] / r['engine_fed_bound_tok_s']:.2f}, "
                f"{r['engine_fed_slot_efficiency']:.2f} ({100 * r['engine_fed_step_share']:.0f}%) "
                if r["engine_fed_bound_tok_s"]
                else "| - "
            )
            + f"| {r['engine_preempted']} | "
            + (
                f"{static:.0f} | {r['static_slot_efficiency']:.2f} | {r['engine_tok_s'] / static:.2f}x |"
                if static
                else "- | - | - |"
            ),
            flush=True,
        )
        if args.json:
            Path(args.json).write_text(json.dumps({"args": vars(args), "head": head, "rows": rows}, indent=1))
    print(compiled_so_far("all rows done"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
