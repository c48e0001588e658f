"""`olmax status RUN_DIR`: where a run stands, from what its trainer and launcher leave in the run
directory (a local path or a gs:// URL) and its checkpoints. Reads only; safe next to a running job.

- RUN_DIR/config.yaml         total steps, tokens per step, the model (for MFU), the checkpoint directory
- RUN_DIR/metrics.jsonl       step, tokens, step time, loss, skipped steps, MFU (olmax.trainer.metrics)
- RUN_DIR/metric_names.json   which of a row's metrics is the objective's loss, and its rollout figures
                              (olmax.objectives: loss_metric, status_metrics), written by the trainer
- the checkpoint directory    the newest complete checkpoint and its data fingerprint (olmax.rundir.progress)
- RUN_DIR/launch_state.json   attempts, retries, preemptions, the last failure (olmax.launch.resume)
- RUN_DIR/exit_status.json    how the last trainer ended (olmax.rundir.exits)

Recent figures are medians over the last `window` logged steps, so an evaluation or a checkpoint
write in one step does not swing them; the smoothed loss is their mean.
"""

from __future__ import annotations

import json
import statistics
from typing import Optional

from olmax.rundir import paths
from olmax.rundir.exits import ExitStatus, read_record
from olmax.rundir.progress import newest_checkpoint, read_run_config, run_checkpoint_dir

METRICS_FILE, NAMES_FILE = "metrics.jsonl", "metric_names.json"
STEP_TIME, SKIPPED = "time/step", "optim/step skipped"
TFLOPS, MFU, TOKENS = "throughput/device/TFLOPs", "throughput/device/MFU", "throughput/total tokens"


def write_metric_names(run_dir: str, loss: str, shown: tuple[str, ...]) -> None:
    """RUN_DIR/metric_names.json: the logged name of the run's loss and the figures status shows."""
    paths.write_text(run_dir, NAMES_FILE, json.dumps({"loss": loss, "status": list(shown)}) + "\n")


def read_metric_names(run_dir: str, row: dict) -> dict:
    """The names metric_names.json holds; for a run directory from before it was written, the row's
    `train/... loss` (not the z-loss) and no rollout figures."""
    text = paths.read_text(run_dir, NAMES_FILE)
    if text:
        return json.loads(text)
    losses = [k for k in row if k.startswith("train/") and k.endswith(" loss") and k != "train/Z loss"]
    return {"loss": losses[0] if losses else "train/CE loss", "status": []}


class MetricsReader:
    """Reads RUN_DIR/metrics.jsonl incrementally: each `refresh` reads only what was appended since
    the last, and starts over when the file was rewritten (a resumed trainer drops the rows after its
    checkpoint and logs those steps again, so the file may end shorter or longer than before).

    A rewrite keeps the rows up to the checkpoint byte for byte and changes what follows (the new rows
    carry other step times), so it shows in the bytes just before the end of what was read: each
    refresh reads those last `TAIL` bytes again with the new ones (one range read, local or gs://)
    and starts over if they changed, or if the file is shorter than what was read."""

    TAIL = 4096  # several rows: rewritten rows differ from the old ones at the same bytes

    def __init__(self, run_dir: str, window: int):
        self.path, self.window = paths.join(run_dir, "metrics.jsonl"), window
        self._start()

    def _start(self) -> None:
        self._offset, self._partial, self._tail = 0, b"", b""  # _tail: the last bytes read, up to _offset
        self.rows: list[dict] = []  # the last `window` rows
        self.skipped = 0  # steps whose update was skipped, over the whole file

    def refresh(self) -> None:
        size = paths.size(self.path)
        if size is None or size < self._offset:
            self._start()
        if size is None:
            return
        back = len(self._tail)
        data = paths.read_range(self.path, self._offset - back, size)
        if data[:back] != self._tail:  # rewritten: what was read is no longer there
            self._start()
            data = paths.read_range(self.path, 0, size)
        else:
            data = data[back:]
        # what was read, not `size`: a file replaced between the two calls may have ended sooner
        self._offset, self._tail = self._offset + len(data), (self._tail + data)[-self.TAIL :]
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if self.rows and row.get("step", 0) <= self.rows[-1].get("step", 0):  # rows re-logged after a resume
                self.rows = [r for r in self.rows if r["step"] < row["step"]]
            self.skipped += int(row.get(SKIPPED, 0) > 0)
            self.rows = (self.rows + [row])[-self.window :]


def run_status(run_dir: str, reader: MetricsReader, *, peak_tflops: Optional[float] = None) -> dict:
    """The status of the run in `run_dir` (figures in the module docstring); None where unknown.
    `peak_tflops`: the chip's peak per device (olmax.fit.chips), for the MFU of a run whose trainer was
    not given one."""
    run_dir = paths.clean(run_dir)
    cfg = read_run_config(run_dir)
    reader.refresh()
    # None while a run that ends with its data's epochs has not opened the data yet (trainer.max_steps=null)
    rows, total = reader.rows, cfg.trainer.max_steps
    last = rows[-1] if rows else {}
    step = last.get("step", 0)
    step_time = _median(rows, STEP_TIME)
    tokens_per_step = cfg.rows_per_step * cfg.data.seq_len
    mfu = _median(rows, MFU)
    if mfu is None and peak_tflops is not None and _median(rows, TFLOPS) is not None:
        mfu = _median(rows, TFLOPS) / peak_tflops
    names = read_metric_names(run_dir, last)
    loss = names["loss"]
    losses = [r[loss] for r in rows if loss in r]
    launcher = paths.read_text(run_dir, "launch_state.json")
    launcher = json.loads(launcher) if launcher else None
    return {
        "run_dir": run_dir,
        "name": cfg.name,
        "step": step,
        "total_steps": total,
        "progress": step / total if total else None,
        "tokens": last.get(TOKENS),
        "total_tokens": total and total * tokens_per_step,
        "step_time_s": step_time,
        "tokens_per_s": tokens_per_step / step_time if step_time else None,
        "mfu": mfu,
        "eta_s": (total - step) * step_time if step_time and total else None,
        "loss_name": loss.removeprefix("train/"),
        "loss": losses[-1] if losses else None,
        "loss_smoothed": statistics.fmean(losses) if losses else None,
        "window": len(rows),
        # RL runs: the latest rollout's figures, and how many steps in a row had no reward at all
        "rl": {k: last[k] for k in names["status"] if k in last} or None,
        "zero_reward_steps": _zero_reward_run(rows),
        "skipped_steps": reader.skipped,
        **_checkpoint(run_checkpoint_dir(cfg, run_dir)),
        "attempts": launcher and launcher.get("attempts"),
        "retries": launcher and launcher.get("retries"),
        "preemptions": launcher and launcher.get("preemptions"),
        "last_failure": launcher and launcher.get("last_failure"),
        "last_exit": read_record(run_dir),
    }


# The trainer exits after which nothing continues the run by itself: it reached its last step, or it
# needs its input fixed, which resume-until-done never retries. After any other exit (PREEMPTED,
# CRASHED, TRANSIENT) a launcher may submit it again.
FINAL_EXITS = (ExitStatus.DONE, ExitStatus.USER_ERROR)


def has_ended(status: dict) -> bool:
    """Whether the run of a `run_status` has stopped for good, by its trainer's exit record. The record
    is the latest trainer's: `olmax train` and the launcher remove the previous one when a trainer starts."""
    record = status["last_exit"]
    return record is not None and ExitStatus(record["status"]) in FINAL_EXITS


ZERO_REWARD_WARNING = 10  # steps in a row whose rollouts earned no reward at all


def _zero_reward_run(rows: list[dict]) -> int:
    """Steps at the end of `rows` whose rollout's mean reward was 0 (RL runs; 0 for others)."""
    n = 0
    for r in reversed(rows):
        if r.get("rollout/reward_mean", 1.0) != 0.0:
            break
        n += 1
    return n


def _median(rows: list[dict], key: str) -> Optional[float]:
    values = [r[key] for r in rows if key in r]
    return statistics.median(values) if values else None


def _checkpoint(directory) -> dict:
    step, data = newest_checkpoint(directory)
    return {
        "checkpoint": step,
        "checkpoint_dir": str(directory),
        "data_fingerprint": (data or {}).get("fingerprint"),
    }


def format_status(s: dict) -> str:
    """The status as a few lines of text."""

    def num(x, fmt="{:,.0f}"):
        return "?" if x is None else fmt.format(x)

    lines = [
        f"run {s['run_dir']} ({s['name']})",
        f"step {s['step']:,} / {num(s['total_steps'])} ({num(s['progress'] and 100 * s['progress'], '{:.1f}')}%), "
        f"tokens {num(s['tokens'])} / {num(s['total_tokens'])}",
        f"recent (median of {s['window']} steps): {num(s['step_time_s'], '{:.3f}')} s/step, "
        f"{num(s['tokens_per_s'])} tokens/s, MFU {num(s['mfu'] and 100 * s['mfu'], '{:.1f}')}%, "
        f"ETA {_duration(s['eta_s'])}",
        f"{s['loss_name']} {num(s['loss'], '{:.4f}')} (mean of the recent steps {num(s['loss_smoothed'], '{:.4f}')}); "
        f"skipped steps so far: {s['skipped_steps']}",
        f"newest complete checkpoint: {'none' if s['checkpoint'] is None else 'step ' + str(s['checkpoint'])} "
        f"in {s['checkpoint_dir']}; data fingerprint {s['data_fingerprint'] or '?'}",
    ]
    if s["rl"]:
        lines.append("rollouts: " + ", ".join(f"{k.removeprefix('rollout/')} {v:.3f}" for k, v in s["rl"].items()))
        if s["zero_reward_steps"] >= ZERO_REWARD_WARNING:
            lines.append(
                f"WARNING: no rollout earned any reward in the last {s['zero_reward_steps']} steps: nothing to "
                "learn from (check the verifier, the prompts' ground truths and the chat template)"
            )
    if s["attempts"] is not None:
        failure = s["last_failure"]
        lines.append(
            f"launcher: {s['attempts']} attempt(s), {s['retries']} retries ({s['preemptions']} after "
            f"preemptions); last failure: "
            + (
                "none"
                if not failure
                else f"{failure['name']} (exit {failure['exit_code']}: {failure['why']}) at {failure['time']}"
            )
        )
    if s["last_exit"] is not None:
        e = s["last_exit"]
        lines.append(
            f"last trainer exit: {e['name']} ({e['status']}) at {e.get('time', '?')}"
            + (f": {e['message']}" if e.get("message") else "")
        )
    return "\n".join(lines)


def _duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "?"
    seconds = int(seconds)
    d, rest = divmod(seconds, 86400)
    return (f"{d}d " if d else "") + f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
