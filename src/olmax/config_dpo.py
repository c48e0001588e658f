"""The `dpo` section of the experiment config and what trainer.objective=dpo asks of the rest of it
(olmax.config composes and calls them; docs/post-training.md, "DPO in `olmax train`")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from olmax.errors import ConfigError, refuse

if TYPE_CHECKING:  # olmax.config imports this module
    from olmax.config import ExperimentConfig

DPO_LOSS_TYPES = ("dpo_norm", "dpo")  # olmax.objectives.dpo


@dataclass(frozen=True)
class DPOConfig:
    """Direct preference optimisation, used with trainer.objective=dpo (olmax.objectives.dpo). Defaults
    are AI2's OLMo 3 DPO (open-instruct dpo_tune_cache.py)."""

    loss_type: str = "dpo_norm"
    """dpo_norm: the log-prob ratios averaged over each response's tokens (AI2's OLMo 3); dpo: summed."""
    beta: float = 5.0
    """Scale of the log-prob ratios inside the sigmoid (and of the logged rewards)."""

    def __post_init__(self):
        if self.loss_type not in DPO_LOSS_TYPES:
            raise ConfigError(f"dpo.loss_type={self.loss_type!r} is not one of {', '.join(DPO_LOSS_TYPES)}")
        if self.beta <= 0:
            raise ConfigError(f"dpo.beta must be positive, got {self.beta}")


def lm_only(cfg: ExperimentConfig, unit: str) -> list[tuple[bool, str, str]]:
    """The LM data and loss options an objective on whole sequences (DPO's pairs, GRPO's rollouts; the
    `unit`) refuses, as refuse() rules."""
    data = cfg.data
    return [
        (data.instance_filter, "data.instance_filter=true", "the repetition filter is an LM-loss mask"),
        (data.max_target_seq_len is not None, "data.max_target_seq_len", f"it chunks token streams, not {unit}"),
        (cfg.optimizer.z_loss != 0.0, f"optimizer.z_loss={cfg.optimizer.z_loss}", "it regularises the LM loss"),
        (cfg.mesh.context != 1, f"mesh.context={cfg.mesh.context}", "its log-probs are not split over a context axis"),
    ]


def check_dpo(cfg: ExperimentConfig) -> None:
    """What trainer.objective=dpo does not take: its rows are whole sequences, one prompt and response
    each, right-padded (open-instruct's DPO batches), read by the pair loader (olmax.data.pairs)."""
    data = cfg.data
    refused = [
        (data.packing != "none", "data.packing=obfd", "each row is one pair's sequence, not packed documents"),
        (data.doc_masking, "data.doc_masking=true", "a row holds one document, so causal attention is enough"),
        (data.label_masks, "data.label_masks=true", "the pair loader always reads the label masks"),
    ]
    refuse(refused + lm_only(cfg, "pairs"), "trainer.objective=dpo does not take {knob}: {why}")
