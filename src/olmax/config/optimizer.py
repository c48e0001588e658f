"""The `optimizer` section: AdamW as OLMo-core runs it (float32 moments, the weight-decay mask),
skip-step, clipping and the z-loss weight; olmax.step.optim builds the optimizer from it."""

from __future__ import annotations

from dataclasses import dataclass

from olmax.errors import ConfigError, check_non_negative, check_positive


@dataclass(frozen=True)
class OptimizerConfig:
    """AdamW with OLMo-core's skip-step rule, clipping and z-loss (olmax.step.optim, docs/training.md)."""

    lr: float = 3e-4
    """Peak learning rate; the schedule scales it."""
    b1: float = 0.9
    """AdamW beta1 (first-moment decay)."""
    b2: float = 0.95
    """AdamW beta2 (second-moment decay)."""
    eps: float = 1e-8
    """AdamW epsilon, added to the bias-corrected sqrt of the second moment."""
    weight_decay: float = 0.1
    """Decoupled weight decay, multiplied by the learning rate."""
    no_decay: tuple[str, ...] = ("embed",)
    """Parameter paths excluded from weight decay (a path or any prefix of one, e.g. "embed"); an entry
    that matches no parameter is an error."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this."""
    z_loss: float = 1e-5
    """Multiplier of the z-loss, logsumexp(logits)^2 per token; 0 turns it off."""
    skip_step: bool = True
    """Skip the update of a step whose loss or gradient norm spikes (OLMo-core's SkipStepAdamW)."""
    skip_window: int = 128
    """Skip-step: how many past steps' loss and gradient norm the spike test compares against."""
    skip_sigma: float = 6.0
    """Skip-step: a step is skipped when its loss or gradient norm exceeds the window's mean by this many stds."""

    def __post_init__(self):
        check_positive("optimizer", self, "lr", "max_grad_norm", "skip_sigma")
        check_non_negative("optimizer", self, "eps", "weight_decay", "z_loss")
        for name in ("b1", "b2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"optimizer.{name} must be in [0, 1), got {getattr(self, name)}")
        if self.skip_window < 2:
            raise ConfigError(f"optimizer.skip_window must be >= 2, got {self.skip_window}")
