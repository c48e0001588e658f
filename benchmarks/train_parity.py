"""Training parity with ai2-olmo-core 3.0.0, run long, with a plot: the comparison itself is
olmax.parity.training (its docstring says what is compared).

    .venv/bin/python benchmarks/train_parity.py [--steps 300 --spike-step 150 --out train_parity.png]
    .venv/bin/python benchmarks/train_parity.py --sft [--steps 50] [--noise-floor]   # SFT as AI2 ran it
    .venv/bin/python benchmarks/train_parity.py --sft --ranks 2 --micro-batch 2       # OLMo-core over 2 ranks
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from olmax.parity.harness import Run, Setup
from olmax.parity.training import compare_training


def plot(ref: Run, ours: Run, figures: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = np.arange(1, len(ref.ce) + 1)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    top.plot(steps, ref.ce, label="OLMo-core 3.0.0 (torch)", lw=2.5, alpha=0.6)
    top.plot(steps, ours.ce, label="olmax (JAX)", lw=1, ls="--")
    for s in ref.skipped:
        top.axvline(s, color="red", lw=0.8, alpha=0.5)
    top.set_ylabel("CE loss")
    top.set_title(f"Same init, data and optimizer; skipped steps (red): {ref.skipped}")
    top.legend()
    bottom.semilogy(
        steps, np.maximum(np.abs(np.asarray(ref.ce) - np.asarray(ours.ce)), 1e-12), label="olmax vs OLMo-core"
    )
    if "noise_floor_ce" in figures:
        bottom.semilogy(
            steps,
            np.maximum(figures["noise_floor_ce"], 1e-12),
            alpha=0.6,
            label="OLMo-core vs itself from a start 1 ulp away",
        )
        bottom.legend()
    bottom.set_ylabel("|delta CE loss|\n(equal: shown at 1e-12)")
    bottom.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--spike-step", type=int, default=None, help="default: half way, and at least 70 (none with --sft)")
    ap.add_argument(
        "--sft",
        action="store_true",
        help="SFT: packed chat parts with label masks, the SFT recipe's optimizer and schedule (Setup(sft=True))",
    )
    ap.add_argument(
        "--ranks",
        type=int,
        default=1,
        help="with --sft: OLMo-core's train module over this many gloo processes, olmax with per-rank loss "
        "normalisation over as many ranks (Setup.ranks)",
    )
    ap.add_argument(
        "--micro-batch", type=int, default=0, help="with --ranks: instances per rank per micro-batch (0: all)"
    )
    ap.add_argument("--out", default="train_parity.png")
    ap.add_argument(
        "--noise-floor",
        action="store_true",
        help="also run OLMo-core from its init moved by 1 ulp, to show float32 drift alone",
    )
    args = ap.parse_args(argv)
    if args.sft:
        if args.spike_step:
            ap.error("--sft trains without a spike (the spike batch is pre-training data)")
        setup = Setup.sft_run(args.steps, ranks=args.ranks, micro_batch=args.micro_batch)
    elif args.ranks > 1:
        ap.error("--ranks is for --sft (per-rank loss normalisation)")
    else:
        spike = args.spike_step or max(70, args.steps // 2)
        if not 1 <= spike <= args.steps:
            ap.error(f"--spike-step {spike} is outside 1..{args.steps}")
        setup = Setup(steps=args.steps, spike_step=spike)
    with tempfile.TemporaryDirectory() as tmp:
        ref, ours, f = compare_training(setup, Path(tmp), noise_floor=args.noise_floor)
    plot(ref, ours, f, Path(args.out))
    rows = [
        ("steps", f["steps"]),
        ("same batches every step", f["same_batches"]),
        ("max |delta CE loss|", f"{f['max_abs_ce_delta']:.2e} (step {f['max_abs_ce_delta_step']})"),
        ("max rel delta CE loss", f"{f['max_rel_ce_delta']:.2e} (step {f['max_rel_ce_delta_step']})"),
        ("max |delta z-loss|", f"{f['max_abs_z_delta']:.2e}"),
        ("max rel delta grad norm", f"{f['max_rel_grad_norm_delta']:.2e}"),
        ("max |delta lr|", f"{f['max_abs_lr_delta']:.2e}"),
        ("skipped steps (OLMo-core / olmax)", f"{f['skips_olmo_core']} / {f['skips_olmax']}"),
        ("skip steps matched", f["skips_match"]),
        ("final max rel param diff", f"{f['final_max_rel_param_diff']:.2e} ({f['worst_param']})"),
        ("final rel L2 param diff (all params)", f"{f['final_rel_l2_param_diff']:.2e}"),
        ("CE first -> last step", f"{f['first_ce']:.3f} -> {f['last_ce']:.3f}"),
        ("seconds (OLMo-core / olmax)", f"{f['seconds_olmo_core']} / {f['seconds_olmax']}"),
    ]
    if "noise_floor_max_abs_ce_delta" in f:
        rows.append(
            (
                "noise floor: max |delta CE| OLMo-core vs itself (1 ulp start)",
                f"{f['noise_floor_max_abs_ce_delta']:.2e}, skips {f['noise_floor_skips']}",
            )
        )
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    print(f"plot: {args.out}")
    return 0 if f["same_batches"] and f["skips_match"] else 1


if __name__ == "__main__":
    sys.exit(main())
