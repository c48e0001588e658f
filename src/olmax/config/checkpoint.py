"""The sections of the experiment config for what a run keeps besides its state: checkpoints, the
held-out evaluation in the loop and the W&B writer (olmax.config.experiment composes them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from olmax.errors import ConfigError, check_choice, check_non_negative, check_positive

WANDB_MODES = ("disabled", "online", "offline")  # W&B's own mode names


@dataclass(frozen=True)
class CheckpointConfig:
    """Run checkpoints (olmax.checkpoint.store, docs/checkpoints.md)."""

    every: int = 1000
    """Save a checkpoint every N steps (and at the end of the run)."""
    keep: int = 3
    """How many of the newest checkpoints to keep; older ones are deleted once a newer one is complete.
    Landmarks (keep_every, keep_steps) are kept on top of these."""
    keep_every: int = 0
    """Landmarks: keep every checkpoint whose step is a multiple of this for good (0: none); such a step
    is saved even when it is off the `every` grid."""
    keep_steps: tuple[int, ...] = ()
    """Landmarks: these steps are saved and kept for good, on top of the newest `keep`."""
    init_from: Optional[str] = None
    """Parameters to start from with a fresh optimizer, or a checkpoint written by `olmax ckpt warm-start`
    (then its moments and bias-correction counter come along too)."""
    dir: Optional[str] = None
    """Where the run's checkpoints go: a local path or a gs:// URL (logs and metrics stay in the run
    directory); None: RUN_DIR/checkpoints."""

    def __post_init__(self):
        check_positive("checkpoint", self, "every", "keep")
        if self.keep_every < 0:
            raise ConfigError(f"checkpoint.keep_every must be >= 0 (0: no periodic landmarks), got {self.keep_every}")
        if any(s < 1 for s in self.keep_steps):
            raise ConfigError(f"checkpoint.keep_steps must be positive steps, got {list(self.keep_steps)}")

    def is_landmark(self, step: int) -> bool:
        """Whether `step` is kept for good (keep_every, keep_steps)."""
        return (self.keep_every > 0 and step % self.keep_every == 0) or step in self.keep_steps


@dataclass(frozen=True)
class EvalConfig:
    """Held-out loss in the training loop (olmax.evals.heldout)."""

    every: int = 0
    """Evaluate every N steps; 0 = never."""
    batches: int = 8
    """At most this many batches (of trainer.global_batch instances) per eval set."""
    data: tuple[str, ...] = ()
    """Eval sets: token shards, jsonl text files (tokenized with data.tokenizer on first use) or
    "demo:heldout"; each logs eval/<name>/CE loss and PPL."""

    def __post_init__(self):
        check_non_negative("eval", self, "every")
        check_positive("eval", self, "batches")


@dataclass(frozen=True)
class WandbConfig:
    """The optional Weights & Biases writer (olmax.trainer.metrics); needs the `wandb` extra unless disabled."""

    mode: str = "disabled"
    """disabled: no W&B run; online: log to the W&B server; offline: write RUN_DIR/wandb/ only (no network;
    upload later with `wandb sync`)."""
    project: str = "olmax"
    """W&B project."""
    entity: Optional[str] = None
    """W&B entity (user or team); None = W&B's default for the logged-in user."""
    name: Optional[str] = None
    """W&B run name; None = the run directory's name."""

    def __post_init__(self):
        check_choice("wandb.mode", self.mode, WANDB_MODES)
