"""Where training metrics go: `RUN_DIR/metrics.jsonl` (one JSON object per step), TensorBoard scalars
in `RUN_DIR/tensorboard/` (RUN_DIR local or gs://: see MetricsLog), optionally a W&B run
(`wandb.mode=online|offline`), all under OLMo-core's
W&B metric names so curves of the two frameworks overlay one to one (olmax compare reads any of them);
and the live view: a progress bar with tokens/s and ETA on a terminal, plain log lines otherwise.

A resumed run continues metrics.jsonl from the restored step: rows of steps after it (logged by an
attempt that died before its next checkpoint) are dropped first, so the file reads like one
uninterrupted run. TensorBoard and W&B keep such re-logged steps; their readers take the last value.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from tensorboardX import SummaryWriter
from tqdm import tqdm

from olmax.config.checkpoint import WandbConfig
from olmax.config.experiment import ExperimentConfig
from olmax.config.io import to_dict
from olmax.errors import ConfigError
from olmax.evals.jsonl import read_jsonl
from olmax.extras import require
from olmax.fit.flops import exact_step_flops
from olmax.objectives.registry import objective_of
from olmax.rundir import paths
from olmax.rundir.report import METRICS_FILE, write_metric_names

# the step's own metrics (every objective's) -> OLMo-core's names; each objective names its own
# (olmax.objectives: metric_names, and unlogged_metrics for those it returns for the step's callers
# only), and the rollout's figures ("rollout/...") keep theirs. Any other metric is refused at the first
# step: a metric a plug-in returns but does not name would otherwise vanish from every log.
STEP_METRIC_NAMES = {
    "lr": "optim/LR",
    "grad_norm": "optim/total grad norm",
    "skipped": "optim/step skipped",
}
STEP_UNLOGGED = ("tokens",)  # the loop counts the run's tokens from it (throughput/total tokens)
TB_DIR = "tensorboard"
# extra TensorBoard aliases some OLMo-core dashboards use
TB_ALIASES = {"optim/step skipped": "optim/step_skipped", "throughput/total tokens": "perf/total_tokens"}


class MetricsLog:
    """Appends one record per step to metrics.jsonl (flushed, so a killed run keeps what it logged)
    and mirrors each number to TensorBoard and, when enabled, W&B. `start_step`: the step the run
    (re)starts from; logged rows after it are dropped.

    A run directory on an object store (gs://...) cannot be appended to: the writers work in a local
    staging directory (metrics.jsonl continued from the run directory's copy) and `sync` uploads
    metrics.jsonl and the TensorBoard event files whole, at every checkpoint (the trainer calls it
    after each save), every SYNC_S seconds and at the end. Rows after the newest checkpoint may be
    missing from the uploaded copy after a kill; they are the ones a resumed trainer logs again."""

    SYNC_S = 300.0

    def __init__(
        self,
        run_dir: str | Path,
        cfg: ExperimentConfig,
        n_devices: int,
        peak_tflops: Optional[float] = None,
        *,
        start_step: int = 0,
        write: bool = True,
    ):
        """`write`: False on all but one process of a multi-host run (the metrics are global, so
        every process computes the same rows; one writes them)."""
        self._write = write
        self._remote = paths.clean(run_dir) if paths.is_url(run_dir) else None
        if write:
            if self._remote is not None:
                self._staging = tempfile.TemporaryDirectory(prefix="olmax-run-")
                local = Path(self._staging.name)
                previous = paths.read_text(self._remote, METRICS_FILE)
                if previous is not None:
                    (local / METRICS_FILE).write_text(previous)
                self._synced = time.monotonic()
            else:
                local = Path(run_dir)
            path = local / METRICS_FILE
            _drop_rows_after(path, start_step)
            self._local = local
            self._jsonl = open(path, "a")
            self._tb = SummaryWriter(str(local / TB_DIR))
            self._wandb = _WandbRun(cfg, run_dir, local) if cfg.wandb.mode != "disabled" else None
        objective = objective_of(cfg)
        self._objective = objective.name
        self._names = {**STEP_METRIC_NAMES, **objective.metric_names}
        self._unlogged = {*STEP_UNLOGGED, *objective.unlogged_metrics}
        if write:  # what `olmax status` shows of the rows, without importing the objective
            write_metric_names(run_dir, loss_name(cfg), objective.status_metrics)
        rows, statistic = cfg.rows_per_step, cfg.statistic_rows_per_step
        # rows that only feed a statistic run a forward, no backward (olmax.fit.flops)
        step_flops = exact_step_flops(cfg.model, cfg.data.seq_len, rows - statistic, forward_only=statistic)
        self._tflop_per_device_step = step_flops.total / n_devices / 1e12
        self._tokens_per_device_step = rows * cfg.data.seq_len / n_devices
        self._peak = peak_tflops
        self._global_batch = cfg.trainer.global_batch

    def record(
        self, step: int, step_metrics: dict, *, total_tokens: int, step_time: float, repeats: int, extra: dict
    ) -> dict:
        """One step's row. `repeats`: instances this process saw twice within an epoch (must be 0). A
        ConfigError for a metric neither named nor unlogged (module comment above STEP_METRIC_NAMES)."""
        unnamed = sorted(
            k for k in step_metrics if k not in self._names and k not in self._unlogged and not k.startswith("rollout/")
        )
        if unnamed:
            raise ConfigError(
                f"trainer.objective={self._objective} returns the metric(s) {', '.join(map(repr, unnamed))} at step "
                f"{step} without a logged name: give each one in the objective's metric_names (or list it in "
                "unlogged_metrics when only the step's callers read it)"
            )
        row = {"step": step}
        row.update({self._names[k]: float(v) for k, v in step_metrics.items() if k in self._names})
        row.update({k: float(v) for k, v in step_metrics.items() if k.startswith("rollout/")})
        row["throughput/total tokens"] = total_tokens
        row["throughput/device/TPS"] = self._tokens_per_device_step / step_time
        row["throughput/device/TFLOPs"] = self._tflop_per_device_step / step_time
        if self._peak:
            row["throughput/device/MFU"] = row["throughput/device/TFLOPs"] / self._peak
        row["data/instances"] = step * self._global_batch
        row["data/repeats"] = repeats
        row["time/step"] = step_time
        row.update(extra)
        if not self._write:
            return row
        self._jsonl.write(json.dumps(row) + "\n")
        self._jsonl.flush()
        for name, value in row.items():
            if name != "step":
                self._tb.add_scalar(name, value, step)
                if name in TB_ALIASES:
                    self._tb.add_scalar(TB_ALIASES[name], value, step)
        if self._wandb is not None:
            self._wandb.log(row)
        if self._remote is not None and time.monotonic() - self._synced > self.SYNC_S:
            self.sync()
        return row

    def sync(self) -> None:
        """Upload metrics.jsonl and the TensorBoard event files to a gs:// run directory (a local one
        is written in place: nothing to do)."""
        if not self._write or self._remote is None:
            return
        self._tb.flush()
        paths.upload(self._local / METRICS_FILE, self._remote, METRICS_FILE)
        for event_file in sorted((self._local / TB_DIR).iterdir()):
            paths.upload(event_file, self._remote, f"{TB_DIR}/{event_file.name}")
        self._synced = time.monotonic()

    def close(self) -> None:
        if not self._write:
            return
        self._jsonl.close()
        self._tb.close()
        if self._wandb is not None:
            self._wandb.close()
        if self._remote is not None:
            self.sync()
            self._staging.cleanup()


def loss_name(cfg: ExperimentConfig) -> str:
    """The logged name of the loss a row shows for cfg's objective (progress bar, `olmax train`'s last
    line, `olmax status`)."""
    objective = objective_of(cfg)
    return objective.metric_names[objective.loss_metric]


def read_metrics(run_dir: Path) -> list[dict]:
    """The rows of RUN_DIR/metrics.jsonl, in order."""
    return [row for _, row in read_jsonl(Path(run_dir) / METRICS_FILE, ValueError)]


def _drop_rows_after(path: Path, step: int) -> None:
    """Keep the rows of steps <= `step`, rewriting the file atomically (a kill mid-way leaves the old file)."""
    if not path.exists():
        return
    lines = path.read_text().splitlines(keepends=True)
    kept = [line for line, at in zip(lines, map(_step_of, lines)) if at is not None and at <= step]
    if len(kept) < len(lines):
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(kept))
        os.replace(tmp, path)


def _step_of(line: str) -> Optional[int]:
    """The step of one metrics.jsonl line; None for a line cut short by a kill."""
    try:
        return json.loads(line)["step"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return None


class _WandbRun:
    """One W&B run per run directory: its id is kept in RUN_DIR/wandb_id, so a resumed run appends to
    the same W&B run. `offline` writes RUN_DIR/wandb/offline-run-* and needs no network (upload
    later with `wandb sync`). The `wandb` package comes with the `wandb` extra."""

    def __init__(self, cfg: ExperimentConfig, run_dir: str | Path, local: Path):
        """`local`: where W&B writes its files (the run directory, or the staging one of a gs:// run)."""
        wandb = require("wandb", f"wandb.mode={cfg.wandb.mode}")
        w: WandbConfig = cfg.wandb
        run_id = paths.read_text(run_dir, "wandb_id")
        if run_id is None:
            run_id = secrets.token_hex(4) + "\n"
            paths.write_text(run_dir, "wandb_id", run_id)
        name = paths.clean(run_dir).rstrip("/").rsplit("/", 1)[-1]
        self._run = wandb.init(
            project=w.project,
            entity=w.entity,
            name=w.name or name,
            id=run_id.strip(),
            resume="allow",
            mode=w.mode,
            dir=str(local),
            config=to_dict(cfg),
        )

    def log(self, row: dict) -> None:
        self._run.log({k: v for k, v in row.items() if k != "step"}, step=row["step"])

    def close(self) -> None:
        self._run.finish()


class Progress:
    """Steps, loss, tokens/s and ETA: a tqdm bar when stderr is a terminal, otherwise one plain line
    every `every` steps (log files and CI output stay readable). Tokens/s and ETA use wall time since
    the first logged step, so compilation does not count."""

    def __init__(
        self,
        start: int,
        last: int,
        tokens_per_step: int,
        *,
        enabled: bool = True,
        every: int = 1,
        terminal: Optional[bool] = None,
        loss: str = "train/CE loss",
    ):
        """`loss`: the row's loss to show (`loss_name` of the run's objective)."""
        self._start, self._last, self._tokens, self._every = start, last, tokens_per_step, max(every, 1)
        self._loss = loss
        self._terminal = sys.stderr.isatty() if terminal is None else terminal
        self._enabled = enabled
        self._bar = tqdm(
            total=last,
            initial=start,
            desc="train",
            unit="step",
            dynamic_ncols=True,
            disable=not (enabled and self._terminal),
        )
        self._t0 = self._first = None

    def update(self, row: dict) -> None:
        step, now = row["step"], time.perf_counter()
        if self._t0 is None:
            self._t0, self._first = now, step
        done = step - self._first
        rate = done / (now - self._t0) if done else 0.0  # steps/s after the first logged step
        tok_s = rate * self._tokens
        self._bar.set_postfix(loss=f"{row[self._loss]:.3f}", tok_s=f"{tok_s:,.0f}", refresh=False)
        self._bar.update(1)
        if self._enabled and not self._terminal and (step % self._every == 0 or step == self._last):
            eta = f"{(self._last - step) / rate:.0f}s" if rate else "?"
            print(
                f"step {step}/{self._last} | {self._loss.removeprefix('train/')} {row[self._loss]:.4f} | "
                f"lr {row['optim/LR']:.3e} | "
                f"{tok_s:,.0f} tok/s | eta {eta}",
                flush=True,
            )

    def write(self, message: str) -> None:
        if self._enabled:
            self._bar.write(message)

    def close(self) -> None:
        self._bar.close()
