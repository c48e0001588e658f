"""The objective interface: what the train step, the trainer, the fit and the metrics ask of an objective.

An objective is one class (lm.py, dpo.py, grpo.py, or a plug-in's: olmax.objectives.registry) that
declares, in one place:

- `config`: its config section (olmax.config.objective.ObjectiveConfig; None for none), which also
  says the kind of data it trains on (`data`: tokens, pairs, rollouts or a plug-in kind,
  olmax.config.data_kind) and so what the trainer prepares (the Grain loader, items such as the
  preference pairs, the RL loop's rollouts) and the rows an item holds; `reference_pass`: each item's
  rows come with a reference model's summed response log-probs, which the trainer computes once and
  caches (olmax.trainer.reference); `data_fields`: the per-item values its data carries from the
  files (a KTO label, a weight: olmax.data.item_fields), given with each batch;
- `fields(cfg)`: the batch it takes, each field's shape, dtype and logical axes (placed on the mesh
  by the ONE rules table, olmax.model.sharding), whether it must be there and whether the run's data
  carries it; `check_batch` refuses another batch with an error naming the key;
- the loss: `prepare` turns the placed global batch into the per-item arrays the step splits into
  micro-batches (and anything the whole batch decides, such as the LM loss's denominator);
  `micro_loss` is one micro-batch's loss and metric sums, whose gradients the step accumulates;
  `finish` makes the step's gradients, the loss the skip rule watches and the metrics; `hold`, when an
  update must not happen (an RL step with no token to learn from);
- its metrics: `metric_names` (step metric -> logged name), `unlogged_metrics` (those the step returns
  for its callers only; any other metric `finish` returns is an error at the first step,
  olmax.trainer.metrics), `loss_metric` (the one a row shows as the loss), `metric_reductions` (how
  micro-batches combine: sum, min or max), `status_metrics` (the rollout figures `olmax status` shows).

The step (olmax.step.train_step) knows nothing else of an objective: it checks, places, splits,
accumulates and updates, the same for every objective.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from olmax.config.experiment import ExperimentConfig
from olmax.config.layout import BatchLayout
from olmax.config.objective import data_kind


class BatchField(NamedTuple):
    """One array a step's batch may hold: its global shape, dtype and logical axes (the first is the item
    axis, "batch"); whether the step needs it (`required`) and whether this run's batches carry it
    (`carried`: what the fit compiles the step for; an optional field may still be given)."""

    shape: tuple[int, ...]
    dtype: str
    axes: tuple[Optional[str], ...]
    required: bool = True
    carried: bool = True


def item_fields(cfg, *, reference: bool, data_fields: Optional[dict[str, str]] = None) -> dict[str, BatchField]:
    """The batch of an objective on items of rows read from files (olmax.data.pairs.PairLoader makes it:
    preference pairs, a plug-in kind's items): an item axis first, so that splitting the batch over
    devices and micro-batches, as the step splits instances, keeps an item's rows together (its kind's
    `rows`: 2 for a pair, chosen then rejected); `reference`: with the reference pass's log-probs;
    `data_fields`: {name: dtype} of per-item values from the files (the objective's `data_fields`)."""
    items, seq = cfg.trainer.global_batch, cfg.data.seq_len
    rows = cfg.rows_per_step // items
    fields = {
        "input_ids": BatchField((items, rows, seq), "int32", ("batch", None, None)),
        "response_mask": BatchField((items, rows, seq), "bool", ("batch", None, None)),
    }
    if reference:
        fields["reference_logps"] = BatchField((items, rows), "float32", ("batch", None))
    for name, dtype in (data_fields or {}).items():
        fields[name] = BatchField((items,), dtype, ("batch",))
    return fields


class StepContext(NamedTuple):
    """What a step's objective code may read besides the batch: the config, the mesh and how the
    global batch splits over its devices and micro-batches (olmax.config.layout)."""

    cfg: ExperimentConfig
    mesh: Mesh
    layout: BatchLayout


class Objective:
    """Base of every objective; the defaults are an objective on tokens with summed metrics."""

    name: ClassVar[str]
    config: ClassVar[Optional[type]] = None
    reference_pass: ClassVar[bool] = False
    data_fields: ClassVar[dict[str, str]] = {}  # {name: dtype}: per-item values its data's files carry
    metric_names: ClassVar[dict[str, str]] = {}
    unlogged_metrics: ClassVar[tuple[str, ...]] = ()
    loss_metric: ClassVar[str] = "loss"
    metric_reductions: ClassVar[dict[str, str]] = {}  # absent: "sum"
    status_metrics: ClassVar[tuple[str, ...]] = ()

    @property
    def data(self) -> str:
        """The name of the kind of data it trains on (olmax.config.data_kind)."""
        return data_kind(self.config)

    def fields(self, cfg: ExperimentConfig) -> dict[str, BatchField]:
        raise NotImplementedError

    def check_batch(self, cfg: ExperimentConfig, batch: dict) -> None:
        """A ValueError naming the key for a batch `fields` does not describe: an unknown key, a missing
        required one, a wrong shape."""
        fields = self.fields(cfg)
        for key in batch:
            if key not in fields:
                raise ValueError(
                    f"trainer.objective={self.name}: unknown batch key {key!r} (known: {', '.join(sorted(fields))})"
                )
        for key, f in fields.items():
            if batch.get(key) is None:
                if f.required:
                    raise ValueError(f"trainer.objective={self.name} but the batch has no {key!r}")
            elif tuple(batch[key].shape) != f.shape:
                raise ValueError(f"batch[{key!r}] has shape {tuple(batch[key].shape)}, expected {f.shape}")

    def prepare(self, ctx: StepContext, batch: dict) -> tuple[dict, Any]:
        """The placed global batch -> ({name: (global_batch, ...) array split into micro-batches},
        what every micro-batch shares)."""
        raise NotImplementedError

    def micro_loss(self, ctx: StepContext, params: dict, micro: dict, shared: Any) -> tuple[jax.Array, dict]:
        """One micro-batch's loss, already divided so that the micro-batches' sum is the step's, and
        its metrics in the form `combine` adds up."""
        raise NotImplementedError

    def zero_metrics(self) -> dict:
        """Where the step's metrics start: the identity of `combine` for each micro_loss metric."""
        start = {"sum": 0.0, "min": jnp.inf, "max": -jnp.inf}
        return {k: jnp.asarray(start[self.metric_reductions.get(k, "sum")], jnp.float32) for k in self.micro_metrics()}

    def micro_metrics(self) -> tuple[str, ...]:
        """The names of the metrics micro_loss returns."""
        raise NotImplementedError

    def combine(self, a: dict, b: dict) -> dict:
        """Two micro-batches' metrics -> the step's so far (metric_reductions; sum by default)."""
        ops = {"sum": jnp.add, "min": jnp.minimum, "max": jnp.maximum}
        return {k: ops[self.metric_reductions.get(k, "sum")](a[k], b[k]) for k in a}

    def finish(self, ctx: StepContext, grads: dict, sums: dict, batch: dict) -> tuple[dict, jax.Array, dict]:
        """The summed gradients and metrics -> (gradients, the loss the skip rule watches, metrics)."""
        return grads, sums[self.loss_metric], sums

    def hold(self, metrics: dict) -> Optional[jax.Array]:
        """A bool scalar: True where the step must not update (None: it always may)."""
        return None
