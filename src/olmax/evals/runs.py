r"""Reading logged training curves: olmax metrics.jsonl, TensorBoard event files and W&B CSV exports.

Every reader returns `{metric name: Series}` with the metric names as logged (olmax logs OLMo-core's
W&B names, e.g. `train/CE loss`). A step logged twice (a run that resumed from an earlier checkpoint
logs the steps after it again) keeps its LAST value: that is the one the run continued from.

- metrics.jsonl: one JSON object per line with an integer `step`; every other numeric field is a metric.
- TensorBoard: `events.out.tfevents.*` files anywhere under a directory, read record by record
  (TFRecord framing: length, CRC, payload, CRC) and decoded with tensorboardX's Event protobuf;
  scalars come as `simple_value` or as a one-element float tensor. TensorBoard writers replace
  characters outside `[-/\w.]` in tags with `_` (`train/CE loss` is stored as `train/CE_loss`);
  `find_metric` accepts either spelling.
- W&B CSV export (the "Download CSV" of a panel): a `Step` (or `_step`) column and one column per
  run and metric, named `RUN - METRIC`; the `__MIN` / `__MAX` companion columns and empty cells are
  skipped. `metric_prefix_run` strips the run part so the metric names match the other formats.
"""

from __future__ import annotations

import csv
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from olmax.evals.jsonl import read_jsonl


class RunFormatError(ValueError):
    """A run path that cannot be read as metrics.jsonl, TensorBoard events or a W&B CSV; names the file."""


@dataclass(frozen=True)
class Series:
    steps: np.ndarray  # int64, strictly increasing
    values: np.ndarray  # float64

    @staticmethod
    def from_points(points: dict[int, float]) -> "Series":
        steps = np.asarray(sorted(points), dtype=np.int64)
        return Series(steps, np.asarray([points[s] for s in steps], dtype=np.float64))


def _finish(points: dict[str, dict[int, float]]) -> dict[str, Series]:
    return {name: Series.from_points(p) for name, p in sorted(points.items()) if p}


def read_metrics_jsonl(path: Path) -> dict[str, Series]:
    points: dict[str, dict[int, float]] = {}
    for line_no, record in read_jsonl(path, RunFormatError):
        if not isinstance(record.get("step"), int):
            raise RunFormatError(f"{path} line {line_no}: no integer `step` field")
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                points.setdefault(key, {})[record["step"]] = float(value)
    return _finish(points)


def _tfrecords(path: Path):
    """The payloads of a TFRecord file (CRCs are not checked; a truncated last record ends the file,
    as it does for TensorBoard when a run was killed mid-write)."""
    with open(path, "rb") as f:
        while True:
            header = f.read(12)
            if len(header) < 12:
                return
            (length,) = struct.unpack("<Q", header[:8])
            payload = f.read(length)
            if len(payload) < length or len(f.read(4)) < 4:
                return
            yield payload


def read_tensorboard(directory: Path) -> dict[str, Series]:
    from tensorboardX.proto.event_pb2 import Event

    files = sorted(directory.rglob("events.out.tfevents.*"))
    if not files:
        raise RunFormatError(f"{directory} has no TensorBoard event files (events.out.tfevents.*)")
    points: dict[str, dict[int, float]] = {}
    for path in files:  # file names start with the creation time: later files win on repeated steps
        for payload in _tfrecords(path):
            event = Event.FromString(payload)
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    number = value.simple_value
                elif value.HasField("tensor") and len(value.tensor.float_val) == 1:
                    number = value.tensor.float_val[0]
                else:
                    continue
                points.setdefault(value.tag, {})[int(event.step)] = float(number)
    return _finish(points)


def metric_prefix_run(column: str) -> str:
    """`my-run - train/CE loss` -> `train/CE loss` (W&B joins run and metric with ' - ')."""
    return column.split(" - ", 1)[1] if " - " in column else column


def read_wandb_csv(path: Path) -> dict[str, Series]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise RunFormatError(f"{path} has no rows")
    step_col = next((c for c in ("Step", "_step", "step") if c in rows[0]), None)
    if step_col is None:
        raise RunFormatError(f"{path} has no Step column (columns: {list(rows[0])})")
    points: dict[str, dict[int, float]] = {}
    for row in rows:
        if not row[step_col]:
            continue
        step = int(float(row[step_col]))
        for column, cell in row.items():
            if column == step_col or column.endswith(("__MIN", "__MAX")) or cell in ("", None):
                continue
            try:
                value = float(cell)
            except ValueError:
                continue  # a text column (run names, timestamps)
            if math.isfinite(value):
                points.setdefault(metric_prefix_run(column), {})[step] = value
    return _finish(points)


def find_metric(curves: dict[str, Series], metric: str) -> Series | None:
    """`metric` as logged, or as a TensorBoard writer stores its name."""
    return curves.get(metric, curves.get(re.sub(r"[^-/\w.]", "_", metric)))


def read_run(path: str | Path) -> dict[str, Series]:
    """A run's curves from a metrics.jsonl file, a W&B .csv export, or a directory holding a
    metrics.jsonl or TensorBoard event files."""
    path = Path(path)
    if path.is_file():
        if path.suffix == ".csv":
            return read_wandb_csv(path)
        if path.suffix == ".jsonl":
            return read_metrics_jsonl(path)
        raise RunFormatError(f"{path}: expected a metrics .jsonl, a W&B .csv or a run directory")
    if path.is_dir():
        if (path / "metrics.jsonl").is_file():
            return read_metrics_jsonl(path / "metrics.jsonl")
        return read_tensorboard(path)
    raise RunFormatError(f"run {path} does not exist")


MIN_BINS = 20


@dataclass(frozen=True)
class Binned:
    bins: np.ndarray  # int64: the index k of each bin that holds at least one point
    ends: np.ndarray  # int64: the last step logged in each of those bins (its label)
    values: np.ndarray  # float64: the (smoothed) bin means
    counts: np.ndarray  # int64: points in each bin


def default_bin_size(*runs: Series) -> int:
    """The largest of 1, 2, 5, 10, 20, 50, ... steps that gives every run at least MIN_BINS bins (a
    run of fewer steps gets bins of 1 step)."""
    target = max(1, min((int(r.steps.max()) for r in runs if r.steps.size), default=1) // MIN_BINS)
    size = 1
    for candidate in (m * 10**e for e in range(19) for m in (1, 2, 5)):
        if candidate > target:
            break
        size = candidate
    return size


def bin_series(series: Series, bin_size: int, smooth: int = 1) -> Binned:
    if bin_size <= 0 or smooth <= 0:
        raise ValueError(f"bin size and smoothing must be positive, got {bin_size} and {smooth}")
    index = (series.steps + bin_size - 1) // bin_size  # step s lies in bin ceil(s / bin_size)
    keys, inverse, counts = np.unique(index, return_inverse=True, return_counts=True)
    means = np.bincount(inverse, weights=series.values) / counts
    last = np.full(keys.size, np.iinfo(np.int64).min)
    np.maximum.at(last, inverse, series.steps.astype(np.int64))
    if smooth > 1:
        csum = np.concatenate([[0.0], np.cumsum(means)])
        lo = np.maximum(np.arange(len(means)) - smooth + 1, 0)
        means = (csum[1:] - csum[lo]) / (np.arange(len(means)) + 1 - lo)
    return Binned(keys, last, means, counts)


def value_at(binned: Binned, step: int, bin_size: int) -> Optional[float]:
    """The binned value of the bin containing `step`, or None if that bin has no point."""
    hit = np.flatnonzero(binned.bins == -(-step // bin_size))
    return float(binned.values[hit[0]]) if hit.size else None


def common_bins(a: Binned, b: Binned) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(labels, indices into a, indices into b) of the bins both hold; a label is the smaller of the
    two runs' labels, a step both runs logged or passed."""
    _, ia, ib = np.intersect1d(a.bins, b.bins, return_indices=True)
    return np.minimum(a.ends[ia], b.ends[ib]), ia, ib
