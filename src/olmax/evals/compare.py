"""Two training runs side by side at step-aligned landmarks (`olmax compare`, docs/verification.md).

Curves are read by olmax.evals.runs (metrics.jsonl, TensorBoard, W&B CSV). Two views:

Binned overlay. Steps are grouped into bins of `bin_size` steps, bin k holding steps
(k * bin_size, (k + 1) * bin_size]; a bin's value is the mean of the run's logged values in it, then
optionally a trailing moving average over `smooth` bins. A bin is drawn at (labelled by) the last
step the run logged in it, so a short run's last bin never claims a step the run did not reach. The
default bin size (`default_bin_size`) follows the runs' length: the largest of 1, 2, 5, 10, 20, 50,
... steps that still gives the shorter of A and B at least MIN_BINS bins. Runs logged at different
intervals are compared bin by bin, never point by point: the gap is B - A per bin both runs have
(and A - ref, B - ref with a reference export), drawn at the smaller of the two labels. A landmark
step is read from the bin that contains it; the markdown table lists A, B, gap and relative gap at
each landmark.

Paired difference (a resume A/B: the same run continued from a checkpoint vs uninterrupted).
Unbinned B - A at every step both runs logged. An exact resume gives 0.000 at every step; a resume
bug (data not at batch N, optimizer state lost, RNG not restored) shows as a nonzero delta from the
first step after the resume, which binned curves of two noisy runs hide. `tolerance` is the largest
|delta| still counted as equal (0 for bit-exact runs).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from olmax.evals.runs import Binned, Series, bin_series, common_bins, default_bin_size, find_metric, read_run, value_at

DEFAULT_METRIC = "train/CE loss"


def default_landmarks(a: Binned, b: Binned, n: int = 8) -> list[int]:
    """Up to n bin labels spread evenly over the bins both runs have."""
    common, _, _ = common_bins(a, b)
    if common.size == 0:
        return []
    picks = np.unique(np.linspace(0, common.size - 1, min(n, common.size)).round().astype(int))
    return [int(common[i]) for i in picks]


def gap_table(
    a: Binned, b: Binned, landmarks: Sequence[int], bin_size: int, ref: Optional[Binned] = None
) -> list[dict]:
    rows = []
    for step in landmarks:
        va, vb = value_at(a, step, bin_size), value_at(b, step, bin_size)
        row = {
            "step": int(step),
            "a": va,
            "b": vb,
            "gap": None if va is None or vb is None else vb - va,
            "rel_gap": None if va is None or vb is None or va == 0 else (vb - va) / abs(va),
        }
        if ref is not None:
            vr = value_at(ref, step, bin_size)
            row.update(
                ref=vr,
                a_minus_ref=None if va is None or vr is None else va - vr,
                b_minus_ref=None if vb is None or vr is None else vb - vr,
            )
        rows.append(row)
    return rows


def paired_diff(a: Series, b: Series, tolerance: float = 0.0) -> dict:
    """Per-step B - A on the steps both logged, and where they first differ by more than `tolerance`."""
    steps, ia, ib = np.intersect1d(a.steps, b.steps, return_indices=True)
    delta = b.values[ib] - a.values[ia]
    off = np.flatnonzero(np.abs(delta) > tolerance)
    return {
        "common_steps": int(steps.size),
        "first_step": int(steps[0]) if steps.size else None,
        "last_step": int(steps[-1]) if steps.size else None,
        "max_abs_delta": float(np.abs(delta).max()) if steps.size else None,
        "mean_abs_delta": float(np.abs(delta).mean()) if steps.size else None,
        "tolerance": tolerance,
        "steps_over_tolerance": int(off.size),
        "first_divergent_step": int(steps[off[0]]) if off.size else None,
        "steps": steps.tolist(),
        "delta": delta.tolist(),
    }


def _fmt(x: Optional[float], spec: str = ".4f") -> str:
    return "-" if x is None else format(x, spec)


def markdown(report: dict) -> str:
    has_ref = report["ref"] is not None
    lines = [
        f"# {report['metric']}: {report['label_a']} (A) vs {report['label_b']} (B)",
        "",
        f"Bins of {report['bin_size']} steps (mean of the logged values in each bin), smoothing "
        f"{report['smooth']} bin(s); a landmark reads the bin that contains it. Gap = B - A.",
        "",
        "| step | A | B | gap | rel. gap |" + (" ref | A - ref | B - ref |" if has_ref else ""),
        "|---:|---:|---:|---:|---:|" + ("---:|---:|---:|" if has_ref else ""),
    ]
    for r in report["landmarks"]:
        line = (
            f"| {r['step']} | {_fmt(r['a'])} | {_fmt(r['b'])} | {_fmt(r['gap'], '+.4f')} | "
            f"{_fmt(None if r['rel_gap'] is None else 100 * r['rel_gap'], '+.2f')}% |"
        )
        if has_ref:
            line += f" {_fmt(r['ref'])} | {_fmt(r['a_minus_ref'], '+.4f')} | {_fmt(r['b_minus_ref'], '+.4f')} |"
        lines.append(line)
    p = report["paired"]
    lines += ["", "## Paired difference (per step, unbinned)", ""]
    if p["common_steps"] == 0:
        lines.append("The runs share no logged step.")
    else:
        verdict = (
            "identical at every shared step"
            if p["first_divergent_step"] is None
            else f"first differ at step {p['first_divergent_step']}"
        )
        lines.append(
            f"{p['common_steps']} shared steps ({p['first_step']}-{p['last_step']}): max |B - A| "
            f"{p['max_abs_delta']:.3g}, mean {p['mean_abs_delta']:.3g}; {p['steps_over_tolerance']} "
            f"step(s) over tolerance {p['tolerance']:g}: {verdict}."
        )
    return "\n".join(lines) + "\n"


def run_label(run: str | Path) -> str:
    """A run's default name in the report: its directory's for a metrics file inside one
    (runs/x/metrics.jsonl is "x"), else the file's or directory's own."""
    path = Path(run)
    return path.parent.name if path.name == "metrics.jsonl" and path.parent.name else path.name


def compare_runs(
    run_a: str,
    run_b: str,
    out: str | Path,
    *,
    metric: str = DEFAULT_METRIC,
    bin_size: Optional[int] = None,
    smooth: int = 1,
    landmarks: Optional[Sequence[int]] = None,
    ref_csv: Optional[str] = None,
    label_a: Optional[str] = None,
    label_b: Optional[str] = None,
    tolerance: float = 0.0,
) -> dict:
    """`olmax compare`: writes overlay.png, paired_diff.png, compare.md and compare.json into `out`.
    bin_size None: `default_bin_size` of A and B."""
    from olmax.evals.plots import plot_overlay, plot_paired_diff

    def load(path: str, what: str) -> Series:
        curves = read_run(path)
        series = find_metric(curves, metric)
        if series is None:
            raise ValueError(f"{what} {path} has no metric {metric!r}; it has: {', '.join(curves) or 'none'}")
        return series

    a, b = load(run_a, "run A"), load(run_b, "run B")
    ref = load(ref_csv, "reference") if ref_csv else None
    bin_size = bin_size if bin_size is not None else default_bin_size(a, b)
    ba, bb = bin_series(a, bin_size, smooth), bin_series(b, bin_size, smooth)
    bref = bin_series(ref, bin_size, smooth) if ref is not None else None
    marks = list(landmarks) if landmarks else default_landmarks(ba, bb)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    label_a, label_b = label_a or run_label(run_a), label_b or run_label(run_b)
    if label_a == label_b:  # one name for both would draw one curve (the plots key the runs by label)
        label_a, label_b = f"{label_a} (A)", f"{label_b} (B)"
    report = {
        "metric": metric,
        "label_a": label_a,
        "label_b": label_b,
        "run_a": str(run_a),
        "run_b": str(run_b),
        "ref": str(ref_csv) if ref_csv else None,
        "bin_size": bin_size,
        "smooth": smooth,
        "landmarks": gap_table(ba, bb, marks, bin_size, bref),
        "paired": paired_diff(a, b, tolerance),
    }
    plot_overlay(out / "overlay.png", metric, {report["label_a"]: ba, report["label_b"]: bb}, bref, marks)
    plot_paired_diff(out / "paired_diff.png", metric, report["paired"])
    (out / "compare.md").write_text(markdown(report))
    (out / "compare.json").write_text(json.dumps(report, indent=2) + "\n")
    report["files"] = [str(out / f) for f in ("overlay.png", "paired_diff.png", "compare.md", "compare.json")]
    return report
