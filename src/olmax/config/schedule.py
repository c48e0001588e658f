"""The `schedule` section of the experiment config: which learning-rate schedule and its horizon
(olmax.step.schedules builds the schedule from it; docs/training.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from olmax.errors import ConfigError

SCHEDULES = ("cosine", "stitched_cosine", "wsd", "linear", "constant")


@dataclass(frozen=True)
class ScheduleConfig:
    """LR schedules, OLMo-core semantics and 1-based step numbering (olmax.step.schedules, docs/training.md)."""

    name: str = "cosine"
    """Schedule: cosine, stitched_cosine (AI2's stage 1), wsd (warmup-stable-decay), linear or constant."""
    warmup_steps: int = 2000
    """Steps of linear warmup from 0 (step 1 uses lr / warmup_steps)."""
    warmup_fraction: Optional[float] = None
    """Warmup as a fraction of the horizon instead: round(t_max x fraction) steps (OLMo-core's
    warmup_fraction; AI2's SFT: 0.03); needs schedule.warmup_steps=0."""
    alpha_f: float = 0.1
    """Final LR as a fraction of optimizer.lr (cosine, stitched_cosine, wsd, linear)."""
    t_max_tokens: Optional[int] = None
    """Horizon in tokens (OLMo-core style; steps = ceil(tokens / tokens per step)); None = trainer.max_steps."""
    t_max_epochs: Optional[int] = None
    """Horizon in epochs of the training data (OLMo-core's Duration.epochs): steps = epochs x the whole
    global batches in one epoch, counted when the run opens its data. A run stops at trainer.max_steps (null: at this
    horizon's end)."""
    switch_step: int = 0
    """stitched_cosine: the first step under the second scheduler, OLMo-core's
    HalfCosWithWarmup(warmup=half_cos_warmup, t_max=final_t_max_tokens); the steps before it follow the
    cosine. AI2's stage 1: 596,048, the step after the checkpoint -pretrain-2.py resumed from."""
    half_cos_warmup: int = 0
    """stitched_cosine: HalfCosWithWarmup's warmup. Before this step the second scheduler is on its
    warmup ramp, (lr + alpha_f * lr) / 2 x step / half_cos_warmup; from it on, the second half of a
    cosine from that midpoint to alpha_f * lr at `final_t_max_tokens`. AI2's stage 1: 597,046."""
    final_t_max_tokens: Optional[int] = None
    """stitched_cosine: the horizon, in tokens, of the second scheduler."""
    decay_fraction: float = 0.1
    """wsd: the last fraction of the horizon decays linearly."""

    def __post_init__(self):
        if self.name not in SCHEDULES:
            raise ConfigError(f"schedule.name={self.name!r} is not one of {', '.join(SCHEDULES)}")
        if self.warmup_steps < 0:
            raise ConfigError(f"schedule.warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.warmup_fraction is not None and (not 0.0 <= self.warmup_fraction <= 1.0 or self.warmup_steps):
            raise ConfigError(
                f"schedule.warmup_fraction must be in [0, 1] with schedule.warmup_steps=0, got "
                f"warmup_fraction={self.warmup_fraction}, warmup_steps={self.warmup_steps}"
            )
        if not 0.0 <= self.alpha_f <= 1.0:
            raise ConfigError(f"schedule.alpha_f must be in [0, 1], got {self.alpha_f}")
        if not 0.0 <= self.decay_fraction <= 1.0:
            raise ConfigError(f"schedule.decay_fraction must be in [0, 1], got {self.decay_fraction}")
        if self.t_max_epochs is not None and (self.t_max_epochs <= 0 or self.t_max_tokens is not None):
            raise ConfigError(
                f"schedule.t_max_epochs must be a positive number of epochs and excludes schedule.t_max_tokens, "
                f"got t_max_epochs={self.t_max_epochs}, t_max_tokens={self.t_max_tokens}"
            )
        if self.name == "stitched_cosine" and (
            self.switch_step <= 0 or self.half_cos_warmup <= 0 or self.final_t_max_tokens is None
        ):
            raise ConfigError(
                "schedule.name=stitched_cosine needs schedule.switch_step > 0, schedule.half_cos_warmup > 0 "
                "and schedule.final_t_max_tokens"
            )
