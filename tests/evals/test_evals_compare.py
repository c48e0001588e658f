"""Run comparison on synthetic runs: the three log formats read alike, the gap table at landmarks
equals bin means computed by hand, and the paired diff finds the first step a resume diverged."""

import csv
import json

import numpy as np
import pytest

from olmax.evals.compare import compare_runs, paired_diff
from olmax.evals.runs import Series, bin_series, default_bin_size, find_metric, read_run

METRIC = "train/CE loss"


def curve(s):
    return 3.0 + 5.0 / np.sqrt(s)


def write_jsonl(path, steps, values, extra=None):
    with open(path, "w") as f:
        for s, v in zip(steps, values):
            f.write(json.dumps({"step": int(s), METRIC: float(v), "throughput/tokens": 7, **(extra or {})}) + "\n")
    return path


def write_tensorboard(directory, steps, values):
    from tensorboardX import SummaryWriter

    w = SummaryWriter(str(directory))
    for s in range(500, 521, 10):  # a first attempt that crashed; the resumed run logs these steps again
        w.add_scalar(METRIC, 99.0, s)
    for s, v in zip(steps, values):
        w.add_scalar(METRIC, float(v), int(s))
    w.close()
    return directory


def write_wandb_csv(path, steps, values):
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["Step", f"ref - {METRIC}", f"ref - {METRIC}__MIN", f"ref - {METRIC}__MAX"])
        for s, v in zip(steps, values):
            out.writerow([int(s), repr(float(v)), "", ""])
        out.writerow([int(steps[-1]) + 5, "", "", ""])  # W&B leaves cells empty where a run did not log
    return path


@pytest.fixture
def runs(tmp_path):
    sa, sb, sr = np.arange(1, 1001), np.arange(10, 1001, 10), np.arange(5, 1001, 5)
    a = write_jsonl(tmp_path / "a.jsonl", sa, curve(sa))
    b = write_tensorboard(tmp_path / "b_tb", sb, curve(sb) + 0.05)
    ref = write_wandb_csv(tmp_path / "ref.csv", sr, curve(sr) - 0.1)
    return a, b, ref


def test_readers_agree(runs):
    a, b, ref = runs
    ra, rb, rr = read_run(a), read_run(b), read_run(ref)
    assert set(ra) == {METRIC, "throughput/tokens"} and list(rr) == [METRIC]
    assert list(rb) == ["train/CE_loss"]  # TensorBoard writers replace the space
    tb = find_metric(rb, METRIC)
    np.testing.assert_array_equal(tb.steps, np.arange(10, 1001, 10))
    np.testing.assert_allclose(tb.values, curve(tb.steps) + 0.05, rtol=1e-6)  # float32 in TB
    np.testing.assert_allclose(rr[METRIC].values, curve(rr[METRIC].steps) - 0.1, rtol=1e-12)


def test_gap_table_numbers(runs, tmp_path):
    a, b, ref = runs
    report = compare_runs(str(a), str(b), tmp_path / "out", bin_size=100, landmarks=[100, 450, 1000], ref_csv=str(ref))
    by_step = {r["step"]: r for r in report["landmarks"]}
    # Landmark 450 reads bin (400, 500]: A logged every step there, B every 10 steps, ref every 5.
    sa, sb, sr = np.arange(401, 501), np.arange(410, 501, 10), np.arange(405, 501, 5)
    r = by_step[450]
    assert r["a"] == pytest.approx(curve(sa).mean(), rel=1e-12)
    assert r["b"] == pytest.approx(curve(sb).mean() + 0.05, rel=1e-6)
    assert r["gap"] == pytest.approx(curve(sb).mean() + 0.05 - curve(sa).mean(), abs=1e-6)
    assert r["a_minus_ref"] == pytest.approx(curve(sa).mean() - curve(sr).mean() + 0.1, abs=1e-9)
    assert by_step[1000]["gap"] == pytest.approx(
        curve(np.arange(910, 1001, 10)).mean() + 0.05 - curve(np.arange(901, 1001)).mean(), abs=1e-6
    )
    md = (tmp_path / "out" / "compare.md").read_text()
    assert "| 450 |" in md and f"{r['gap']:+.4f}" in md
    for name in ("overlay.png", "paired_diff.png"):
        assert (tmp_path / "out" / name).read_bytes()[:4] == b"\x89PNG"


def test_paired_diff_finds_the_resume_bug(tmp_path):
    steps = np.arange(1, 601)
    good = curve(steps)
    bad = good.copy()
    bad[300:] += 1e-3  # resumed after step 300 with, say, the data one batch off
    a = write_jsonl(tmp_path / "a.jsonl", steps, good)
    b = write_jsonl(tmp_path / "b.jsonl", steps, bad)
    report = compare_runs(str(a), str(b), tmp_path / "out", bin_size=2000)
    p = report["paired"]
    assert p["common_steps"] == 600 and p["first_divergent_step"] == 301 and p["steps_over_tolerance"] == 300
    assert p["max_abs_delta"] == pytest.approx(1e-3)
    assert "first differ at step 301" in (tmp_path / "out" / "compare.md").read_text()
    same = paired_diff(Series(steps, good), Series(steps, good.copy()))
    assert same["first_divergent_step"] is None and same["max_abs_delta"] == 0.0


def test_binning_and_smoothing():
    s = Series(np.array([1, 2, 3, 4, 7, 9]), np.array([1.0, 2.0, 3.0, 4.0, 5.0, 7.0]))
    b = bin_series(s, 3)
    np.testing.assert_array_equal(b.bins, [1, 2, 3])
    np.testing.assert_array_equal(b.ends, [3, 4, 9])  # each bin drawn at its last logged step
    np.testing.assert_allclose(b.values, [2.0, 4.0, 6.0])
    np.testing.assert_allclose(bin_series(s, 3, smooth=2).values, [2.0, 3.0, 5.0])


def test_missing_metric_is_named(runs, tmp_path):
    a, b, _ = runs
    with pytest.raises(ValueError, match="has no metric 'eval/x/CE loss'; it has: throughput/tokens, train/CE loss"):
        compare_runs(str(a), str(b), tmp_path / "o", metric="eval/x/CE loss")


def test_cli(runs, tmp_path):
    from typer.testing import CliRunner

    from olmax.cli.common import app

    a, b, ref = runs
    result = CliRunner().invoke(
        app,
        [
            "compare",
            str(a),
            str(b),
            "--out",
            str(tmp_path / "o"),
            "--bin",
            "100",
            "--landmarks",
            "450",
            "--ref-csv",
            str(ref),
            "--json",
            str(tmp_path / "c.json"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "| 450 |" in result.output
    assert json.loads((tmp_path / "c.json").read_text())["landmarks"][0]["step"] == 450
    bad = CliRunner().invoke(app, ["compare", str(a), str(tmp_path / "nope"), "--out", str(tmp_path / "o2")])
    assert bad.exit_code == 2 and "does not exist" in bad.output


def test_default_bins_follow_the_runs_length():
    run = lambda last: Series(np.arange(1, last + 1), np.zeros(last))
    assert [default_bin_size(run(n)) for n in (10, 40, 100, 3000, 100_000)] == [1, 2, 5, 100, 5000]
    assert default_bin_size(run(40), run(100_000)) == 2  # the shorter run still gets 20 bins


def test_a_short_run_is_binned_within_its_steps(tmp_path):
    """A 40-step run (the tiny recipe's): 20 bins of 2 steps, every label a step the runs reached."""
    steps = np.arange(1, 41)
    a = write_jsonl(tmp_path / "a.jsonl", steps, curve(steps))
    b = write_jsonl(tmp_path / "b.jsonl", steps, curve(steps) + 0.01)
    report = compare_runs(str(a), str(b), tmp_path / "out")
    assert report["bin_size"] == 2
    marks = [r["step"] for r in report["landmarks"]]
    assert len(marks) == 8 and marks[0] == 2 and marks[-1] == 40
    assert all(r["gap"] == pytest.approx(0.01) for r in report["landmarks"])
    odd = write_jsonl(tmp_path / "odd.jsonl", np.arange(1, 46), curve(np.arange(1, 46)))
    assert bin_series(read_run(odd)[METRIC], 20).ends.tolist() == [20, 40, 45]  # not 60


def test_few_points_are_drawn_with_markers(tmp_path, monkeypatch):
    """One logged step per run: one point per curve, which a line alone does not show."""
    import olmax.evals.plots as plots

    figures = []
    monkeypatch.setattr(plots.plt, "close", figures.append)
    a = write_jsonl(tmp_path / "a.jsonl", [5], [3.0])
    b = write_jsonl(tmp_path / "b.jsonl", [5], [3.5])
    compare_runs(str(a), str(b), tmp_path / "out")
    lines = [line for fig in figures for ax in fig.axes for line in ax.get_lines() if len(line.get_xdata()) == 1]
    assert len(lines) >= 4  # A, B, B - A, the paired difference
    assert all(line.get_marker() not in ("None", "", None) for line in lines)


def test_runs_with_one_name_are_told_apart(tmp_path):
    """Two runs' metrics.jsonl are named by their directories; a run against itself (or two runs whose
    names agree) still gets both curves, labelled A and B, not one curve and a crash."""
    steps = np.arange(1, 41)
    for name in ("x", "y"):
        (tmp_path / name).mkdir()
        write_jsonl(tmp_path / name / "metrics.jsonl", steps, curve(steps))
    report = compare_runs(tmp_path / "x" / "metrics.jsonl", tmp_path / "y" / "metrics.jsonl", tmp_path / "xy")
    assert (report["label_a"], report["label_b"]) == ("x", "y")
    report = compare_runs(tmp_path / "x", tmp_path / "x", tmp_path / "xx")
    assert (report["label_a"], report["label_b"]) == ("x (A)", "x (B)")
    assert (tmp_path / "xx" / "overlay.png").stat().st_size > 0
