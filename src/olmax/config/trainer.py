"""The `trainer` section: the objective, the global batch and its micro-batches, the steps, logging,
the loss's normalisation and chunking, and the init seed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from olmax.config.objective import DEFAULT
from olmax.errors import ConfigError, check_choice, check_non_negative, check_positive

LOSS_NORMALISATIONS = ("global", "per_rank")


@dataclass(frozen=True)
class TrainerConfig:
    """The training loop (olmax.trainer.run, olmax.step.train_step)."""

    global_batch: int = 512
    """Items per optimizer step, over all devices; part of the recipe (it enters the data order). An item
    is one unit of the objective's data: a token instance of data.seq_len (lm), a preference pair, two
    rows (dpo), a packed rollout row (grpo); a step trains on global_batch x rows per item sequences
    (docs/config.md, "Items and rows")."""
    micro_batch_size: Optional[int] = None
    """Items per batch shard (data x fsdp device) in one forward/backward; None = the whole per-device
    batch at once. More than the per-device batch runs the per-device batch, with a warning naming both.
    Gradient accumulation steps = per-device batch / micro_batch_size."""
    loss_chunk: int = 0
    """Sequence positions per chunk of the output layer + cross-entropy, so the full fp32 logits are never
    materialised (recomputed in the backward pass); 0 = one chunk. Must divide data.seq_len."""
    max_steps: Optional[int] = 1000
    """The last step of the run (and the schedule's horizon when it has no token or epoch horizon); null =
    the end of the schedule's epoch horizon (schedule.t_max_epochs x the global batches in an epoch, as
    OLMo-core's Duration.epochs ends a run), counted when the run opens its data and written to the run's
    config.yaml."""
    log_every: int = 1
    """A plain progress line every N steps when not on a terminal (metrics.jsonl has every step)."""
    seed: int = 0
    """Seed of the parameter initialisation (the data order has its own, data.seed)."""
    objective: str = DEFAULT
    """What the step minimises: "lm" (next-token cross-entropy over data.paths), "dpo" (direct
    preference optimisation over `olmax tokenize --chat` preference pairs, the `dpo` section; its items
    are pairs), "grpo" (OlmoRL's policy loss over packed rollout rows, the `grpo` section; its items
    are packed rows) or an objective installed as an `olmax.objectives` entry point (docs/extending.md)."""
    loss_normalisation: str = "global"
    """What the LM loss divides by (trainer.objective=lm): "global", the loss tokens of the whole
    global batch (the same step on any mesh or micro-batching); "per_rank", OLMo-core's: the global
    batch is dealt to trainer.loss_ranks data-parallel ranks as OLMo-core's loader deals it (instance i
    to rank i mod loss_ranks), each rank's sums are divided by its own loss tokens and the ranks are
    averaged (docs/post-training/sft.md, "Loss normalisation")."""
    loss_ranks: Optional[int] = None
    """The data-parallel ranks of the OLMo-core run that loss_normalisation=per_rank reproduces (AI2's
    7B Think SFT: 32, 7B Instruct: 16), whatever olmax's mesh; must divide global_batch."""

    def __post_init__(self):
        # Whether the batch splits over the devices is the trainer's check (olmax.step.train_step.batch_layout);
        # which objectives exist, the whole config's (olmax.config.experiment: plug-ins add theirs).
        check_positive("trainer", self, "global_batch", "log_every")
        if self.max_steps is not None:
            check_positive("trainer", self, "max_steps")
        check_non_negative("trainer", self, "loss_chunk")
        if self.micro_batch_size is not None:
            check_positive("trainer", self, "micro_batch_size")
        self._check_loss_normalisation()

    def _check_loss_normalisation(self) -> None:
        check_choice("trainer.loss_normalisation", self.loss_normalisation, LOSS_NORMALISATIONS)
        if self.loss_normalisation == "global":
            if self.loss_ranks is not None:  # a rank count without per_rank would be silently unused
                raise ConfigError(
                    f"trainer.loss_ranks={self.loss_ranks} is only used with trainer.loss_normalisation=per_rank"
                )
            return
        if self.objective != DEFAULT:
            raise ConfigError(
                f"trainer.loss_normalisation=per_rank is for trainer.objective=lm, not {self.objective} "
                "(its loss has its own normalisation)"
            )
        if self.loss_ranks is None:
            raise ConfigError(
                "trainer.loss_normalisation=per_rank needs trainer.loss_ranks, the data-parallel ranks of the "
                "OLMo-core run it reproduces"
            )
        check_positive("trainer", self, "loss_ranks")
        if self.global_batch % self.loss_ranks:
            raise ConfigError(
                f"trainer.loss_ranks={self.loss_ranks} does not divide trainer.global_batch={self.global_batch} "
                "(OLMo-core deals the global batch evenly over its ranks)"
            )
