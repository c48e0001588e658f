"""Decode throughput of olmax's rollout sampler (olmax.rollout.sampler.sample: prefill, then one jitted
while loop over new tokens) on ONE TPU chip (v5e), against the HBM-bandwidth bound, every row in this
one process (one process at a time may hold the chip).

    python benchmarks/tpu_decode.py [--models tiny,190m,1b --shapes b64,grpo --runs 3 --json out.json
                                     --set model.compute_dtype=float32 --temperature 0]
    python benchmarks/tpu_decode.py --smoke     # the same code path on CPU at tiny shapes

Rows: each model at each shape, bf16 parameters and compute (so a bf16 KV cache: the cache takes
model.compute_dtype, olmax.rollout.cache), random weights (olmax.model.olmo3.init_params) and random
prompts, temperature 1 (GRPO's sampling; top-k and top-p off) and no EOS, so every row generates exactly
--new tokens. Models: `tiny` (the `tiny` recipe's: d_model 128, 4 layers, the 100k dolma2
vocabulary), `190m` (OLMo-core 3.0.0's olmo3_190M: d_model 768, 12 layers, 12 heads of 64, MLP
3072), `1b` (olmo3_1B: d_model 2048, 16 layers, 16 heads of 128, MLP 8192); all with the 7B's
windows (4096 on three layers of four) and vocabulary. Shapes:
- `b64`: 64 prompts of 128 tokens, 1 sample each, 128 new tokens.
- `grpo`: the `tiny_grpo` recipe's GRPO groups (its grpo section: 8 prompts x 8 samples, prompts of
  max_prompt_len 64 tokens, max_response_len 128 new), each prompt's prefill computed once and its
  cache repeated to its samples, as a rollout does. The RL recipes' own 64 x 8 groups with responses
  of 8k-32k tokens need a KV cache far beyond one v5e (the 1b at 512 rows of 10k positions: ~460 GB).
--prompts / --prompt-len / --new / --grpo-prompts / --grpo-samples change them.

Timing: one call compiles (and runs); then --runs calls of the whole request and --runs calls of the
same program with every row limited to 1 new token (`limits`: the same compiled program, the prefill
and one loop iteration). ms/step = (median whole - median one-token) / (new - 1): one decode
iteration; decode tokens/s = rows / that; end-to-end tokens/s = rows x new / median whole call
(prefill included).

Bound: the live-KV bound of benchmarks/decode_bound.py: per decode step the chip must read every
weight once (all layers and the LM head, in model.param_dtype; of the embedding only the rows' own
entries) and the keys and values each row holds, at the average context prompt + (new + 1) / 2
positions (a windowed layer at most its window), at the HBM bandwidth (olmax.fit.chips' hbm_gbps for
the chip, else --hbm-gbps, default 819 GB/s: Cloud TPU v5e docs): bound tokens/s = rows / ((weight
bytes + KV bytes) / bandwidth). `ring GB` is what a step that scored every slot of every layer's ring
would read (the whole bucketed cache length on a global layer; the sampler's XLA attention does,
olmax.rollout.cache); on a TPU the decode kernel reads only the blocks the rows hold
(olmax.rollout.decode_attention).
Target: decode tokens/s >= 50% of the bound at 64 rows for the 1b. --stop-after S starts no row
after S seconds; --json is rewritten after every row; --compile-cache DIR keeps the compiled programs
for the next run on the same host. Prints a table; asserts nothing.

--smoke: on the CPU, every model cut to d_model 64 (4 heads of 16, MLP 192), a 2048 vocabulary and a
window of 16, prompts of 16 tokens and 8 new: it proves the script runs end to end, its figures mean
nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # olmax from this checkout

from decode_bound import bound_tokens_per_s, hbm_gbps, kv_bytes, ring_bytes, weight_bytes  # noqa: E402
from shapes import SHAPE_1B, SHAPE_190M  # noqa: E402 - the training table's shapes (overrides)

SMOKE_MODEL = dict(d_model=64, n_heads=4, n_kv_heads=4, head_dim=16, mlp_hidden=192, vocab_size=2048, sliding_window=16)
MODELS = ("tiny", "190m", "1b")
SHAPES = ("b64", "grpo")


def log(line: str) -> None:
    print(line, flush=True)


def model_config(name: str, args):
    from olmax.config.experiment import ExperimentConfig
    from olmax.config.io import apply_overrides
    from olmax.config.recipes import OLMO3_7B, TINY

    on = lambda model, overrides: apply_overrides(dataclasses.replace(ExperimentConfig(), model=model), overrides).model
    shape = {"tiny": [], "190m": SHAPE_190M, "1b": SHAPE_1B}[name]
    model = on(TINY if name == "tiny" else OLMO3_7B, shape)
    model = dataclasses.replace(model, param_dtype="bfloat16", compute_dtype="bfloat16", remat="none")
    if args.smoke:
        model = dataclasses.replace(model, **SMOKE_MODEL)
    return on(model, args.set)


def shape_of(name: str, args) -> dict:
    """prompts, samples per prompt, prompt tokens, new tokens of a shape (module doc)."""
    if name == "b64":
        return dict(prompts=args.prompts, n=1, prompt_len=args.prompt_len, new=args.new)
    from olmax.config.recipes import get_recipe

    rl = get_recipe("tiny_grpo").grpo
    return dict(
        prompts=args.grpo_prompts or rl.prompts_per_step,
        n=args.grpo_samples or rl.samples_per_prompt,
        prompt_len=args.prompt_len if args.smoke else rl.max_prompt_len,
        new=args.new if args.smoke else rl.max_response_len,
    )


def bound(cfg, rows: int, prompt_len: int, new: int, cache_len: int, gbps: float) -> dict:
    """The live-KV bound of one decode step at the run's average context (module doc), and the KV a
    step scoring whole rings would read."""
    weights = weight_bytes(cfg, rows)
    kv = kv_bytes(cfg, [prompt_len] * rows, [new] * rows) / new  # per step
    step_s = (weights + kv) / (gbps * 1e9)
    return {
        "weights_gb": weights / 1e9,
        "kv_gb": kv / 1e9,
        "ring_gb": ring_bytes(cfg, rows, cache_len) / 1e9,
        "avg_context": prompt_len + (new + 1) / 2,
        "bound_step_ms": step_s * 1e3,
        "bound_tokens_per_s": bound_tokens_per_s(cfg, new, rows, [prompt_len] * rows, [new] * rows, gbps),
    }


def run_row(model: str, shape: str, args, gbps: float) -> dict:
    import jax
    import numpy as np

    from olmax.model.olmo3 import count_params, init_params
    from olmax.rollout.sampler import Sampling, sample, widths
    from olmax.step.state import init_compiler_options

    cfg = model_config(model, args)
    s = shape_of(shape, args)
    prompts, n, prompt_len, new = s["prompts"], s["n"], s["prompt_len"], s["new"]
    rows = prompts * n
    t0 = time.perf_counter()
    options = init_compiler_options(jax.devices()[0].platform)
    init = jax.jit(functools.partial(init_params, cfg), compiler_options=options).lower(jax.random.key(0)).compile()
    init_compile_s = time.perf_counter() - t0
    params = jax.block_until_ready(init(jax.random.key(0)))
    init_s = time.perf_counter() - t0  # the row's set-up (its compile included), apart from its timings
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (prompts, prompt_len)).tolist()
    sampling = Sampling(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=1)

    def call(limit: int) -> float:
        t0 = time.perf_counter()
        out = sample(params, cfg, ids, new, n=n, sampling=sampling, limits=[limit] * rows)
        jax.block_until_ready(out)
        took = time.perf_counter() - t0
        lengths = np.asarray(out.lengths)
        if lengths.min() != limit or lengths.max() != limit:  # no EOS given, so every row runs to its limit
            raise RuntimeError(f"rows generated {lengths.min()}..{lengths.max()} tokens, not {limit}")
        return took

    first = call(new)  # compiles, then runs
    whole = [call(new) for _ in range(args.runs)]
    one = [call(1) for _ in range(args.runs)]
    width, steps = widths(prompt_len, new)
    step_s = (statistics.median(whole) - statistics.median(one)) / (new - 1)
    b = bound(cfg, rows, prompt_len, new, width + steps, gbps)
    decode_tps = rows / step_s if step_s > 0 else float("nan")
    stats = jax.devices()[0].memory_stats() or {}
    return {
        "model": model,
        "shape": shape,
        "params": count_params(cfg),
        "param_dtype": cfg.param_dtype,
        "compute_dtype": cfg.compute_dtype,
        "prompts": prompts,
        "samples": n,
        "rows": rows,
        "prompt_len": prompt_len,
        "new": new,
        "cache_len": width + steps,
        "sampling": dataclasses.asdict(sampling),
        "init_s": init_s,
        "init_compile_s": init_compile_s,
        "first_call_s": first,
        "whole_s": whole,
        "one_token_s": one,
        "step_ms": step_s * 1e3,
        "decode_tokens_per_s": decode_tps,
        "e2e_tokens_per_s": rows * new / statistics.median(whole),
        **b,
        "ratio": decode_tps / b["bound_tokens_per_s"],
        "hbm_peak_gib": stats["peak_bytes_in_use"] / 2**30 if "peak_bytes_in_use" in stats else None,
    }


def table(rows: list[dict], gbps: float) -> str:
    head = (
        f"{'model':6s} {'shape':5s} {'rows':>10s} {'prompt':>6s} {'new':>4s} {'ms/step':>8s} {'decode tok/s':>12s} "
        f"{'e2e tok/s':>10s} {'bound tok/s':>11s} {'ratio':>6s} {'weights GB':>10s} {'kv GB':>6s} {'ring GB':>7s} "
        f"{'compile+1st s':>13s}"
    )
    lines = [head]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['model']:6s} {r['shape']:5s} FAILED: {r['error']}")
            continue
        lines.append(
            f"{r['model']:6s} {r['shape']:5s} {r['rows']:>4d} ({r['prompts']}x{r['samples']})".ljust(24)
            + f" {r['prompt_len']:>5d} {r['new']:>4d} {r['step_ms']:8.2f} {r['decode_tokens_per_s']:12.0f} "
            f"{r['e2e_tokens_per_s']:10.0f} {r['bound_tokens_per_s']:11.0f} {100 * r['ratio']:5.1f}% "
            f"{r['weights_gb']:10.3f} {r['kv_gb']:6.3f} {r['ring_gb']:7.3f} {r['first_call_s']:13.1f}"
        )
    lines.append(
        f"live bound: (weights + the KV the rows hold, at the average context) / {gbps:g} GB/s per decode step; "
        "ratio = decode tok/s / bound; ring = a step reading whole rings; e2e counts the prefill too"
    )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    p.add_argument("--runs", type=int, help="timed calls of each kind (default 3; smoke 2)")
    p.add_argument("--prompts", type=int, default=64, help="b64: prompts (one sample each)")
    p.add_argument("--prompt-len", type=int, help="b64: prompt tokens (default 128; smoke 16)")
    p.add_argument("--new", type=int, help="b64: new tokens (default 128; smoke 8)")
    p.add_argument("--grpo-prompts", type=int, help="grpo: prompts (default tiny_grpo's)")
    p.add_argument("--grpo-samples", type=int, help="grpo: samples per prompt (default tiny_grpo's)")
    p.add_argument("--temperature", type=float, default=1.0, help="0: greedy (a program without the draw)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--hbm-gbps", type=float, help="HBM bandwidth when olmax.fit.chips has none (default 819)")
    p.add_argument("--compile-cache", help="JAX's persistent compilation cache directory (reused by the next run)")
    p.add_argument("--stop-after", type=float, help="start no row after this many seconds of the run")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="model.* override, every row")
    p.add_argument("--json", help="write the rows here (rewritten after every row)")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on CPU (module doc)")
    args = p.parse_args(argv)
    if args.smoke:
        os.environ["JAX_PLATFORMS"] = "cpu"
    else:  # the TPU's flag profile, as the olmax commands set it (splash's tiles need its scoped VMEM)
        from olmax.cli.common import tpu_profile_env

        tpu_profile_env()
    args.runs = args.runs or (2 if args.smoke else 3)
    args.prompt_len = args.prompt_len or (16 if args.smoke else 128)
    args.new = args.new or (8 if args.smoke else 128)
    if args.new < 2:
        p.error("--new must be at least 2 (a decode step is timed as the difference of new and 1 token)")

    import jax

    if args.compile_cache:  # a second run on the same host compiles nothing (JAX's persistent cache)
        jax.config.update("jax_compilation_cache_dir", args.compile_cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)

    device = jax.devices()[0]
    gbps = hbm_gbps(device.device_kind, args.hbm_gbps)
    env = {
        "device": device.device_kind,
        "platform": device.platform,
        "jax": jax.__version__,
        "hbm_gbps": gbps,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "runs": args.runs,
        "set": args.set,
        "smoke": args.smoke,
    }
    log(
        f"tpu_decode: {device.device_kind} ({device.platform}), HBM {gbps:g} GB/s, {args.runs} runs per timing"
        + ("  [SMOKE: tiny shapes on CPU, figures meaningless]" if args.smoke else "")
    )
    rows, start = [], time.perf_counter()
    for model in args.models.split(","):
        for shape in args.shapes.split(","):
            t0 = time.perf_counter()
            try:
                if args.stop_after and t0 - start > args.stop_after:
                    raise TimeoutError(f"not started: {t0 - start:.0f} s into the run, past --stop-after")
                row = run_row(model, shape, args, gbps)
            except Exception as e:  # out of memory: reported in the table, the next row runs
                row = {"model": model, "shape": shape, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:400]}"}
            gc.collect()
            jax.clear_caches()
            what = row.get("error") or (
                f"{row['step_ms']:.2f} ms/step, {100 * row['ratio']:.1f}% of the bound; "
                f"parameters' init {row['init_s']:.0f} s ({row['init_compile_s']:.0f} s of it compiling), "
                f"compile + first call {row['first_call_s']:.0f} s"
            )
            log(f"  {model} {shape}: {what} ({time.perf_counter() - t0:.0f} s)")
            rows.append(row)
            if args.json:
                Path(args.json).write_text(json.dumps({"env": env, "rows": rows}, indent=2))
    log(table(rows, gbps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
