"""MaxText's own trainer on the same TPU chip, shapes and tokens per step as the rows that
tpu_throughput.py measured: the MaxText half of the side-by-side table (docs/performance/tpu-v5e.md).

    python benchmarks/tpu_maxtext.py --olmax throughput.json [--olmax more.json] --json maxtext.json \
        --maxtext-python VENV/bin/python --maxtext-src DIR [--only 7b-layers --warmup 2 --steps 10]
    python benchmarks/tpu_maxtext.py --smoke ...    # CPU, tiny shapes, dot-product attention

benchmarks/tpu.sh's `maxtext` steps install MaxText from the wheels `tpu.sh wheels` downloads and run
this after the throughput step. MaxText runs from its source (MaxText 0.2.4, whose requirements name
jax 0.10.2 and libtpu 0.0.42.1, what a TPU VM brings; its package metadata asks for Python >= 3.12
but the trainer's modules run on 3.11 once two `type X = ...` aliases are plain assignments, which
`tpu.sh wheels` does), in a process of its own after olmax's has let go of the chip (one process at a
time may hold it).

Per olmax row (tpu_throughput.py's JSON: the fit it chose), MaxText's `olmo3-7b-pt` model with the
row's shape as overrides: layers, widths, heads, MLP, the 4096 window, the unpadded vocabulary
(MaxText's own; olmax pads 100278 to 100352); the same tokens per step and micro-batches
(per_device_batch_size x gradient_accumulation_steps), the same parameter dtype, bf16 compute, z-loss
1e-5, the output layer and loss in chunks of trainer.loss_chunk tokens (num_vocab_tiling), the same
kept activations (remat_policy=custom, olmax's tags under MaxText's names; `full` and `none` as
themselves), JAX's splash kernel at olmax's tiles (attention=flash, sa_block_*), synthetic data, no
checkpointing, and the LIBTPU_INIT_ARGS olmax ran with. Where MaxText's step does less than olmax's,
by MaxText's own design: its OLMo 3 layer i is global only when i % 4 == 3 (models/olmo3.py), while
olmax, as OLMo-core, also makes the last layer global (ModelConfig.layer_window), so a cut-down stack
whose last layer is not a fourth one has one more windowed layer in MaxText (1 layer: MaxText's is
windowed, olmax's global); and its AdamW keeps the second moment in the parameters' dtype (optax's
scale_by_adam; mu_dtype=float32 sets the first), where olmax keeps both in fp32, so with bf16
parameters MaxText's optimizer moves fewer bytes. MaxText scans its OLMo 3 block four layers (one
window cycle) at a time and would drop a remainder, so a layer count that 4 does not divide runs
unscanned (scan_layers=False, its path for that), and the table says so.

Seconds per step are the gaps between the timestamps of MaxText's `completed step: N` lines (a line
is logged once its step's metrics are on the host, the next step queued), the median after --warmup.
TFLOP/s and MFU against the peak olmax's run used: mt, MaxText's convention (olmax.fit.flops), the same
count for both; ex, the matmuls each framework's step performs (olmax.fit.flops' exact count, for MaxText
with its own windows and unpadded vocabulary); MaxText's own TFLOP/s/device figure beside them. A
run that fails (out of memory at olmax's fit, a missing module) is reported with its last lines and
the next row runs; each row's whole log is written beside --json. --profile traces 3 steps after the
timed ones (MaxText's profiler=xplane) and, where olmax's row was profiled too (tpu_throughput.py
--profile), prints the two steps' device time by kind of op (tpu_profile.py). Asserts nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # olmax from this checkout

from compile import MAXTEXT_NAMES  # noqa: E402 - this folder's compile benchmark: olmax tag -> MaxText name
from tpu_profile import PROFILE_STEPS, side_by_side  # noqa: E402 - a trace's device time by op
from tpu_profile import read as read_profile  # noqa: E402
from tpu_throughput import row_config  # noqa: E402

STEP_LINE = re.compile(
    r"^I\d{4} (\d\d):(\d\d):([0-9.]+) .*completed step: (\d+), seconds: ([0-9.]+), TFLOP/s/device: ([0-9.]+)",
    re.M,
)
SMOKE = ["attention=dot_product", "hardware=cpu"]
CYCLE = 4  # MaxText's OLMo 3: layers per window cycle (olmo3-7b.yml inhomogeneous_layer_cycle_interval)


def olmax_rows(paths: list[str], only: list[str] | None) -> tuple[dict, list[dict]]:
    """(env of the first file, the measured rows of every file, matmul and failures left out)."""
    env, rows = None, []
    for path in paths:
        data = json.loads(Path(path).read_text())
        env = env or data["env"]
        if (data["env"]["set"], data["env"]["smoke"]) != (env["set"], env["smoke"]):
            raise SystemExit(f"{path}: its run's --set/--smoke differ from {paths[0]}'s; give one run's files")
        rows += [r for r in data["rows"] if r["row"] != "matmul" and "error" not in r]
    return env, [r for r in rows if not only or r["row"] in only]


def config_of(row: dict, env: dict):
    """olmax's configuration of a measured row (its fit as overrides on tpu_throughput's row)."""
    fit = [
        f"model.n_layers={row['n_layers']}",
        f"model.param_dtype={row['param_dtype']}",
        f"model.remat={row['remat']}",
        f"trainer.micro_batch_size={row['micro_batch']}",
    ]
    return row_config(row["row"], SimpleNamespace(smoke=env["smoke"], set=env["set"]), fit)


def remat_args(remat: str) -> list[str]:
    from olmax.config.remat import remat_policy_of

    policy = remat_policy_of(remat)
    if policy is None:
        return ["remat_policy=none"]
    if not policy.save and not policy.offload:
        return ["remat_policy=full"]
    where = lambda tag: "device" if tag in policy.save else "offload" if tag in policy.offload else "remat"
    return ["remat_policy=custom", *(f"{mt}={where(tag)}" for tag, mt in MAXTEXT_NAMES.items())]


def maxtext_exact_flops(m, seq_len: int, batch: int) -> int:
    """The matmuls MaxText's step performs: olmax.fit.flops' exact count with MaxText's vocabulary
    (unpadded) and windows (layer i global only when i % CYCLE == CYCLE - 1)."""
    from olmax.fit.flops import attended_pairs, exact_step_flops

    exact = exact_step_flops(dataclasses.replace(m, vocab_multiple=1), seq_len, batch)
    ours = sum(attended_pairs(seq_len, m.layer_window(i)) for i in range(m.n_layers))
    windows = [None if i % CYCLE == CYCLE - 1 else m.sliding_window for i in range(m.n_layers)]
    theirs = sum(attended_pairs(seq_len, w if w and w > 0 else None) for w in windows)
    return exact.weights + exact.attention * theirs // ours


def maxtext_argv(cfg, row: dict, steps: int, src: Path, out: Path, smoke: bool) -> list[str]:
    m, t = cfg.model, cfg.trainer
    micro_tokens = row["micro_batch"] * cfg.data.seq_len
    tiles = 1 if not t.loss_chunk else micro_tokens // t.loss_chunk
    q, kv, kv_compute = m.splash_blocks.tiles(cfg.data.seq_len)
    blocks = [f"sa_block_{n}={q}" for n in ("q", "q_dkv", "q_dq")]
    blocks += [f"sa_block_{n}={kv}" for n in ("kv", "kv_dkv", "kv_dq")]
    blocks += [f"sa_block_{n}={kv_compute}" for n in ("kv_compute", "kv_dkv_compute")]
    return [
        "-m",
        "maxtext.trainers.pre_train.train",
        str(src / "maxtext" / "configs" / "base.yml"),
        "model_name=olmo3-7b-pt",
        "override_model_config=True",
        f"run_name=olmax-side-by-side-{row['row']}",
        f"base_output_directory={out}",
        "dataset_type=synthetic",
        "enable_checkpointing=False",
        "enable_tensorboard=False",
        "skip_jax_distributed_system=True",  # one host; the chip's VM opens no sockets
        f"steps={steps}",
        f"per_device_batch_size={row['micro_batch']}",
        f"gradient_accumulation_steps={row['accum_steps']}",
        f"max_target_length={cfg.data.seq_len}",
        f"base_num_decoder_layers={m.n_layers}",
        f"scan_layers={m.n_layers % CYCLE == 0}",
        f"base_emb_dim={m.d_model}",
        f"base_num_query_heads={m.n_heads}",
        f"base_num_kv_heads={m.n_kv_heads}",
        f"head_dim={m.head_dim}",
        f"base_mlp_dim={m.mlp_hidden}",
        f"vocab_size={m.vocab_size}",
        f"sliding_window_size={m.sliding_window}",
        f"weight_dtype={m.param_dtype}",
        "mu_dtype=float32",
        f"dtype={m.compute_dtype}",
        f"z_loss_multiplier={cfg.optimizer.z_loss}",
        f"num_vocab_tiling={tiles}",
        *remat_args(m.remat),
        *(SMOKE if smoke else ["attention=flash", *blocks]),
    ]


def profile_args(timed: int, out: Path) -> tuple[list[str], int, str]:
    """MaxText's options to trace PROFILE_STEPS steps after the `timed` ones (and one step apart, as the
    profiler's start waits for the state), the steps to run, and XLA_FLAGS that dump the compiled programs'
    text (to name the traced ops: tpu_profile.hlo_ops)."""
    extra = ["profiler=xplane", f"skip_first_n_steps_for_profiler={timed + 1}", f"profiler_steps={PROFILE_STEPS}"]
    # a cache of its own: a step loaded from MaxText's default cache (~/jax_cache) is not compiled, so not dumped
    extra.append(f"jax_cache_dir={out / 'jax-cache'}")
    dump = f"--xla_dump_to={out / 'hlo'} --xla_dump_hlo_as_text --xla_dump_hlo_module_re=train_step"
    return extra, timed + 1 + PROFILE_STEPS, dump


def run_maxtext(row: dict, env: dict, args) -> dict:
    cfg = config_of(row, env)
    steps = args.warmup + args.steps + 1  # n logged steps give n - 1 gaps
    src, out = Path(args.maxtext_src).resolve(), Path(tempfile.mkdtemp(prefix="maxtext-out-"))
    extra, total, dump = profile_args(steps, out) if args.profile else ([], steps, "")
    argv = maxtext_argv(cfg, row, total, src, out, args.smoke) + extra
    child_env = dict(os.environ, DECOUPLE_GCLOUD="TRUE", LIBTPU_INIT_ARGS=env.get("LIBTPU_INIT_ARGS", ""))
    if dump:
        child_env["XLA_FLAGS"] = " ".join(f for f in (os.environ.get("XLA_FLAGS"), dump) if f)
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(src), os.environ.get("PYTHONPATH")) if p)
    if args.smoke:
        child_env["JAX_PLATFORMS"] = "cpu"
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [args.maxtext_python, *argv], capture_output=True, text=True, env=child_env, timeout=args.row_timeout
        )
        text, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        partial = (e.stdout or b"") + (e.stderr or b"")
        text, rc = partial.decode(errors="replace"), f"killed after {args.row_timeout} s"
    wall = time.perf_counter() - t0
    if args.json:
        Path(args.json).with_name(f"maxtext-{row['row']}.log").write_text(" ".join(argv) + "\n\n" + text)
    found = STEP_LINE.findall(text)
    result = {"row": row["row"], "argv": argv, "wall_s": wall, "scanned": cfg.model.n_layers % CYCLE == 0}
    if len(found) < steps:
        tail = " | ".join(line for line in text.strip().splitlines()[-4:])[-600:]
        return {**result, "error": f"MaxText exit {rc} after {len(found)} of {steps} steps: {tail}"}
    found = found[:steps]  # the profiled steps, if any, come after
    stamps = [int(h) * 3600 + int(mi) * 60 + float(s) for h, mi, s, *_ in found]
    gaps = [(b - a) % 86400 for a, b in zip(stamps, stamps[1:])]  # % 86400: a run across midnight
    own = [float(f[5]) for f in found[1 + args.warmup :]]
    params = re.search(r"number parameters: ([0-9.]+) billion", text)
    return {
        **result,
        "params_billion": float(params.group(1)) if params else None,  # MaxText's count, vs olmax's padded one
        "step_times_s": gaps[args.warmup :],
        "s_per_step": statistics.median(gaps[args.warmup :]),
        "maxtext_tflops": statistics.median(own),
        "profile": maxtext_profile(out) if args.profile else None,
    }


def maxtext_profile(out: Path) -> dict:
    """tpu_profile.op_times of MaxText's traced steps, its ops named from XLA's dump of its train step."""
    dumps = sorted((out / "hlo").glob("*train_step*after_optimizations.txt"), key=lambda p: p.stat().st_size)
    if not dumps:  # ops named by opcode only would not compare with olmax's, named by their JAX operation
        return {"error": f"no after-optimizations dump of MaxText's train_step under {out / 'hlo'}"}
    return read_profile(out, PROFILE_STEPS, dumps[-1].read_text())


def table(pairs: list[tuple[dict, dict]], env: dict) -> str:
    from olmax.fit.flops import exact_step_flops, maxtext_step_flops

    peak = env["peak_tflops"]
    lines = [
        f"{'row':14s} {'framework':8s} {'configuration':62s} {'s/step':>7s} {'tokens/s':>9s} {'MFU mt':>7s} "
        f"{'ex':>6s} {'own TFLOP/s':>11s} {'olmax/MaxText':>13s}"
    ]
    for o, mt in pairs:
        cfg = config_of(o, env)
        m, seq, gb = cfg.model, cfg.data.seq_len, cfg.trainer.global_batch
        counted = maxtext_step_flops(m, seq, gb).total
        exact = {"olmax": exact_step_flops(m, seq, gb).total, "MaxText": maxtext_exact_flops(m, seq, gb)}
        for name, r in (("olmax", o), ("MaxText", mt)):
            if "error" in r:  # MaxText's run only: olmax_rows keeps the rows olmax measured
                lines.append(f"{o['row']:14s} {name:8s} FAILED: {r['error']}")
                continue
            mfu = {k: 100 * v / 1e12 / r["s_per_step"] / peak for k, v in (("mt", counted), ("ex", exact[name]))}
            config, own, ratio = f"{o['config']}, {o['attention']}", f"{'-':>11s}", ""
            if name == "MaxText":
                config = ("scanned" if r["scanned"] else f"unscanned (layers not a multiple of {CYCLE})") + ", same fit"
                own, ratio = f"{r['maxtext_tflops']:11.1f}", f"{r['s_per_step'] / o['s_per_step']:13.2f}x"
            lines.append(
                f"{o['row']:14s} {name:8s} {config:62s} {r['s_per_step']:7.4f} {gb * seq / r['s_per_step']:9.0f} "
                f"{mfu['mt']:6.1f}% {mfu['ex']:5.1f}% {own} {ratio}"
            )
    lines.append(
        f"MFU against {peak:g} TFLOP/s: mt = MaxText's convention (one count for both), ex = the matmuls each "
        "step performs (olmax.fit.flops); own = MaxText's printed TFLOP/s/device; olmax/MaxText = MaxText's s/step "
        "over olmax's (> 1: olmax faster)"
    )
    for o, mt in pairs:  # where both were profiled: the device time of a step by kind of op, side by side
        profiles = {"olmax": o.get("profile"), "MaxText": mt.get("profile")}
        if all(p and "error" not in p for p in profiles.values()):
            lines += [f"\n{o['row']}: device time per step by kind of op (tpu_profile.py)", side_by_side(profiles)]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--olmax", action="append", required=True, help="tpu_throughput.py's --json (repeatable)")
    p.add_argument("--maxtext-python", required=True, help="the interpreter MaxText's needs are installed for")
    p.add_argument("--maxtext-src", required=True, help="the folder holding MaxText's `maxtext` package")
    p.add_argument("--only", action="append", help="olmax rows to run (repeatable; default every measured one)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per row")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (the first compiles)")
    p.add_argument("--row-timeout", type=float, default=300, help="seconds before a MaxText run is stopped")
    p.add_argument("--json", help="write the rows here (rewritten after every row), each row's log beside it")
    p.add_argument("--smoke", action="store_true", help="CPU, dot-product attention: the olmax JSON of --smoke")
    p.add_argument("--profile", action="store_true", help="trace more steps after the timed ones (tpu_profile.py)")
    args = p.parse_args(argv)
    env, rows = olmax_rows(args.olmax, args.only)
    print(f"tpu_maxtext: {len(rows)} row(s) of {', '.join(args.olmax)}, {args.warmup} + {args.steps} steps", flush=True)
    pairs = []
    for row in rows:
        result = run_maxtext(row, env, args)
        what = result["error"] if "error" in result else f"{result['s_per_step']:.4f} s/step"
        print(f"  {row['row']}: {what} ({result['wall_s']:.0f} s)", flush=True)
        pairs.append((row, result))
        if args.json:
            Path(args.json).write_text(json.dumps({"env": env, "rows": [r for _, r in pairs]}, indent=2))
    print(table(pairs, env), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
