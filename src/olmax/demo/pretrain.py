"""`olmax demo`: the embedded default, end to end on CPU.

Trains the `tiny` recipe on the shipped demo corpus (tokenized with dolma2 on first use), evaluates
held-out loss in the loop, then writes a loss-curve PNG and a short summary. Rerunning resumes (or,
when finished, only redraws the figures) from the same run directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import matplotlib.pyplot as plt  # picks a non-interactive backend by itself when there is no display

from olmax.config.io import apply_overrides
from olmax.config.recipes import get_recipe
from olmax.trainer.metrics import read_metrics
from olmax.trainer.run import train

TRAIN_LOSS = "train/CE loss"


def run_demo(run_dir: str | Path, overrides: Sequence[str] = (), progress: bool = True) -> dict:
    run_dir = Path(run_dir)
    cfg = apply_overrides(get_recipe("tiny"), overrides)
    train(cfg, run_dir, progress=progress)
    rows = read_metrics(run_dir)
    eval_key = next((k for k in rows[-1] if k.startswith("eval/") and k.endswith("/CE loss")), None)
    summary = {
        "run_dir": str(run_dir),
        "steps": rows[-1]["step"],
        "tokens": rows[-1]["throughput/total tokens"],
        "first_train_loss": rows[0][TRAIN_LOSS],
        "last_train_loss": rows[-1][TRAIN_LOSS],
        "heldout_loss": rows[-1].get(eval_key) if eval_key else None,
        "heldout_curve": {r["step"]: r[eval_key] for r in rows if eval_key in r} if eval_key else {},
        # the first step includes compilation; later steps are the steady state
        "median_tokens_per_s": _median([r["throughput/device/TPS"] for r in rows[1:]] or [0.0]),
        "loss_png": str(run_dir / "loss.png"),
    }
    _plot(rows, eval_key, run_dir / "loss.png")
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def _plot(rows: list[dict], eval_key, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["step"] for r in rows], [r[TRAIN_LOSS] for r in rows], label="train CE loss")
    if eval_key:
        points = [(r["step"], r[eval_key]) for r in rows if eval_key in r]
        ax.plot(*zip(*points), "o-", label="held-out CE loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title("olmax demo: tiny OLMo 3 on the embedded corpus")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def format_summary(s: dict) -> str:
    lines = [
        f"trained {s['steps']} steps ({s['tokens']:,} tokens) in {s['run_dir']}",
        f"train CE loss  {s['first_train_loss']:.3f} -> {s['last_train_loss']:.3f}",
    ]
    if s["heldout_loss"] is not None:
        curve = ", ".join(f"step {k}: {v:.3f}" for k, v in s["heldout_curve"].items())
        lines.append(f"held-out loss  {curve}")
    lines += [
        f"throughput     {s['median_tokens_per_s']:.0f} tokens/s (median step after compilation)",
        f"loss curve     {s['loss_png']}",
        f"metrics        {s['run_dir']}/metrics.jsonl, TensorBoard in {s['run_dir']}/tensorboard",
        f"checkpoints    {s['run_dir']}/checkpoints (olmax eval loss --ckpt ..., olmax convert --to-hf ...)",
    ]
    return "\n".join(lines)
