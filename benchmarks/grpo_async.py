"""GRPO loop speed: synchronous rollouts (grpo.async_steps=0) against one rollout sampled ahead
(grpo.async_steps=1), the same `olmax train` run otherwise.

    .venv/bin/python benchmarks/grpo_async.py [--init-from runs/demo-chat/dpo/checkpoints --steps 12
                                              --warmup 2 --repeats 2 --json out.json]

The workload is the `olmax demo chat` RL stage (recipe `tiny_grpo`: 8 prompts x 8 samples of the
shipped arithmetic prompts, responses up to 128 tokens, the math verifier, one optimizer step per
rollout), started from `--init-from` (the demo's DPO checkpoint, as the demo's RL stage starts; without
it a random model, whose responses run to the length limit). Each repeat trains a fresh run directory
for `--steps` steps in each mode (the modes interleaved within a repeat, so that a change of the
host's load hits both); the first `--warmup` steps of each run are dropped (the compiles, and the
async run's first rollout, which nothing overlaps). Per mode: the median wall time per step
(`time/step`: the step's rollout wait, its update and its logging), the mean rollout figures of the
kept steps (sampling and verifying seconds per rollout, `rollout/wait_s`: how long the trainer waited
for its rollout), and the ratio of the synchronous median to each. In one process, one mesh: the
asynchronous worker's sampling shares the devices (here the CPU's cores) with the trainer's steps,
so what it can hide is the host's share of a rollout (reading back, detokenising, verifying, packing)
and the gaps between the device's programs. Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
from pathlib import Path

from olmax.config.io import apply_overrides
from olmax.config.recipes import get_recipe
from olmax.data.chat_corpus import chat_file
from olmax.trainer.run import train

ROLLOUT = ("rollout/sample_s", "rollout/verify_s", "rollout/wait_s", "rollout/response_len_mean")


def run(mode: int, args, where: Path) -> dict:
    """One run of `args.steps` steps with grpo.async_steps=mode: its kept steps' figures."""
    overrides = [
        f"data.paths=[{chat_file('rl')}]",
        f"trainer.max_steps={args.steps}",
        f"grpo.async_steps={mode}",
        "checkpoint.every=1000",
        *([f"checkpoint.init_from={args.init_from}"] if args.init_from else []),
    ]
    cfg = apply_overrides(get_recipe("tiny_grpo"), overrides)
    rows = train(cfg, where, progress=False)[args.warmup :]
    out = {"step_s": [r["time/step"] for r in rows]}
    for key in ROLLOUT:
        out[key] = statistics.fmean(r[key] for r in rows if key in r)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--init-from", default=None, help="the starting checkpoint (olmax demo chat's DPO stage)")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    load_before = os.getloadavg()[0]
    results: dict[int, list[dict]] = {0: [], 1: []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for mode in (0, 1) if repeat % 2 == 0 else (1, 0):
                results[mode].append(run(mode, args, Path(tmp) / f"r{repeat}-a{mode}"))
    load_after = os.getloadavg()[0]
    table = []
    median = {m: statistics.median(s for r in results[m] for s in r["step_s"]) for m in (0, 1)}
    for mode in (0, 1):
        rs = results[mode]
        table.append(
            {
                "async_steps": mode,
                "step_s": median[mode],
                **{k: statistics.fmean(r[k] for r in rs) for k in ROLLOUT},
                "speedup": median[0] / median[mode],
            }
        )
    start = args.init_from or "random init"
    cpu = platform.processor() or platform.machine()
    print(
        f"# tiny_grpo from {start}; {args.steps} steps per run, first {args.warmup} dropped, {args.repeats} repeats; "
        f"load average {load_before:.1f} before / {load_after:.1f} after; {cpu}, {os.cpu_count()} CPUs"
    )
    print(
        "| grpo.async_steps | s/step (median) | sampling s / rollout | verifying s / rollout | waited s / step "
        "| response tokens (mean) | speed-up |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in table:
        print(
            f"| {row['async_steps']} | {row['step_s']:.3f} | {row['rollout/sample_s']:.3f} | "
            f"{row['rollout/verify_s']:.3f} | {row['rollout/wait_s']:.3f} | {row['rollout/response_len_mean']:.1f} | "
            f"{row['speedup']:.2f}x |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "table": table}, indent=2) + "\n")


if __name__ == "__main__":
    main()
