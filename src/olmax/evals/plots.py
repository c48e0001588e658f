"""PNG figures of the comparison views (matplotlib, headless Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import matplotlib

matplotlib.use("Agg")  # no display on training hosts; must precede the pyplot import
import matplotlib.pyplot as plt  # noqa: E402

from olmax.evals.runs import common_bins  # noqa: E402

MARKED = 50  # curves of at most this many points get a marker on each: one point alone has no line


def _curve(ax, x, y, *fmt, **kwargs) -> None:
    """ax.plot, with markers when there are few points (a single point would otherwise not show)."""
    if len(x) <= MARKED:
        kwargs.setdefault("marker", "o")
        kwargs.setdefault("markersize", 3)
    ax.plot(x, y, *fmt, **kwargs)


def plot_overlay(path: Path, metric: str, runs: dict, ref: Optional[object], landmarks: Sequence[int]) -> None:
    """Binned curves of two runs (and a reference) above a panel of the gap B - A (and each run - ref).
    `runs` maps a label to olmax.evals.runs.Binned, A first."""
    (label_a, a), (label_b, b) = runs.items()
    fig, (top, gap) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True, height_ratios=[2, 1])
    _curve(top, a.ends, a.values, label=f"A: {label_a}")
    _curve(top, b.ends, b.values, label=f"B: {label_b}")
    if ref is not None:
        _curve(top, ref.ends, ref.values, "k--", lw=1, label="reference")
    top.set_ylabel(metric)
    top.legend()
    common, ia, ib = common_bins(a, b)
    _curve(gap, common, b.values[ib] - a.values[ia], label="B - A")
    if ref is not None:
        for label, run in (("A - ref", a), ("B - ref", b)):
            c, i, r = common_bins(run, ref)
            _curve(gap, c, run.values[i] - ref.values[r], lw=1, label=label)
    gap.axhline(0.0, color="gray", lw=0.8)
    for ax in (top, gap):
        for step in landmarks:
            ax.axvline(step, color="gray", lw=0.5, ls=":")
    gap.set_xlabel("step")
    gap.set_ylabel("gap")
    gap.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_paired_diff(path: Path, metric: str, paired: dict) -> None:
    """Per-step B - A of a resume A/B; the first step beyond tolerance is marked."""
    fig, ax = plt.subplots(figsize=(9, 3.5))
    _curve(ax, paired["steps"], paired["delta"], lw=1)
    ax.axhline(0.0, color="gray", lw=0.8)
    if paired["first_divergent_step"] is not None:
        ax.axvline(
            paired["first_divergent_step"],
            color="red",
            lw=0.8,
            ls="--",
            label=f"first difference: step {paired['first_divergent_step']}",
        )
        ax.legend()
    ax.set_xlabel("step")
    ax.set_ylabel(f"B - A ({metric})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
