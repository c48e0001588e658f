"""Where training metrics go: `RUN_DIR/metrics.jsonl` (one JSON object per step) and TensorBoard
scalars in `RUN_DIR/tensorboard/`, both under OLMo-core's W&B metric names so curves of the two
frameworks overlay one to one (olmax compare reads either).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from tensorboardX import SummaryWriter

from olmax.config import ExperimentConfig
from olmax.flops import exact_step_flops

# olmax train_step metric -> OLMo-core name
STEP_METRIC_NAMES = {
    "ce_loss": "train/CE loss",
    "z_loss": "train/Z loss",
    "lr": "optim/LR",
    "grad_norm": "optim/total grad norm",
    "skipped": "optim/step skipped",
}
# extra TensorBoard aliases some OLMo-core dashboards use
TB_ALIASES = {"optim/step skipped": "optim/step_skipped", "throughput/total tokens": "perf/total_tokens"}


class MetricsLog:
    """Appends one record per step to metrics.jsonl (flushed, so a killed run keeps what it logged)
    and mirrors each number to TensorBoard."""

    def __init__(self, run_dir: Path, cfg: ExperimentConfig, n_devices: int, peak_tflops: Optional[float] = None):
        self._jsonl = open(run_dir / "metrics.jsonl", "a")
        self._tb = SummaryWriter(str(run_dir / "tensorboard"))
        step_flops = exact_step_flops(cfg.model, cfg.data.seq_len, cfg.trainer.global_batch)
        self._tflop_per_device_step = step_flops.total / n_devices / 1e12
        self._tokens_per_device_step = cfg.trainer.global_batch * cfg.data.seq_len / n_devices
        self._peak = peak_tflops
        self._global_batch = cfg.trainer.global_batch

    def record(self, step: int, step_metrics: dict, *, total_tokens: int, step_time: float, repeats: int,
               extra: dict) -> dict:
        """One step's row. `repeats`: instances this process saw twice within an epoch (must be 0)."""
        row = {"step": step}
        row.update({STEP_METRIC_NAMES[k]: float(v) for k, v in step_metrics.items() if k in STEP_METRIC_NAMES})
        row["throughput/total tokens"] = total_tokens
        row["throughput/device/TPS"] = self._tokens_per_device_step / step_time
        row["throughput/device/TFLOPs"] = self._tflop_per_device_step / step_time
        if self._peak:
            row["throughput/device/MFU"] = row["throughput/device/TFLOPs"] / self._peak
        row["data/instances"] = step * self._global_batch
        row["data/repeats"] = repeats
        row["time/step"] = step_time
        row.update(extra)
        self._jsonl.write(json.dumps(row) + "\n")
        self._jsonl.flush()
        for name, value in row.items():
            if name != "step":
                self._tb.add_scalar(name, value, step)
                if name in TB_ALIASES:
                    self._tb.add_scalar(TB_ALIASES[name], value, step)
        return row

    def close(self) -> None:
        self._jsonl.close()
        self._tb.close()


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
