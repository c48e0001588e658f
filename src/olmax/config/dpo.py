"""The `dpo` section: the DPO loss (trainer.objective=dpo, olmax.objectives.dpo), trained on preference
pairs (what such an objective refuses of the other sections is olmax.config.data_kind.check_sequences).
docs/post-training/dpo.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from olmax.config.objective import ObjectiveConfig
from olmax.errors import ConfigError

DPO_LOSS_TYPES = ("dpo_norm", "dpo")  # olmax.objectives.dpo


@dataclass(frozen=True)
class DPOConfig(ObjectiveConfig):
    """Direct preference optimisation, used with trainer.objective=dpo (olmax.objectives.dpo). Defaults
    are AI2's OLMo 3 DPO (open-instruct dpo_tune_cache.py)."""

    data: ClassVar[str] = "pairs"

    loss_type: str = "dpo_norm"
    """dpo_norm: the log-prob ratios averaged over each response's tokens (AI2's OLMo 3); dpo: summed."""
    beta: float = 5.0
    """Scale of the log-prob ratios inside the sigmoid (and of the logged rewards)."""

    def __post_init__(self):
        if self.loss_type not in DPO_LOSS_TYPES:
            raise ConfigError(f"dpo.loss_type={self.loss_type!r} is not one of {', '.join(DPO_LOSS_TYPES)}")
        if self.beta <= 0:
            raise ConfigError(f"dpo.beta must be positive, got {self.beta}")
