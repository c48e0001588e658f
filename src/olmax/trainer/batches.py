"""The batches a run trains on, one way per kind of data an objective declares (olmax.objectives.base:
`data`, `reference_pass`, `data_fields`; olmax.config.data_kind), behind one interface, so the loop
never asks which objective it runs:

- tokens:   the Grain loader (olmax.data.loader): this process's rows of OLMo-core's global batch;
- rollouts: rollouts of the prompts, sampled with the parameters the step starts from, verified and
            packed (olmax.rollout.producer), whole on every process;
- any other kind (pairs, a plug-in's): its items read from files (olmax.data.pairs: the preference
            pairs, or the plug-in kind's `source`), with the per-item fields the objective declares,
            and with the reference model's log-probs when the objective asks for a reference pass
            (DPO), from the cache beside them or from the reference pass, run now
            (olmax.trainer.reference).

`StepBatches.next(params)` places the next batch on the mesh; `state()` is what a checkpoint keeps
of the data position."""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from olmax.config.experiment import ExperimentConfig
from olmax.data.loader import make_loader
from olmax.data.pairs import REFERENCE_FINGERPRINT, ItemSource, PairLoader
from olmax.data.tokenizer import load_tokenizer
from olmax.errors import ConfigError
from olmax.model.sharding import place
from olmax.objectives.base import Objective
from olmax.objectives.registry import objective_of
from olmax.rollout.producer import RolloutProducer, prompt_set
from olmax.step.train_step import batch_layout, batch_shardings
from olmax.trainer.reference import params_fingerprint, reference_logps_cache
from olmax.trainer.start import Start, starting_params


class StepBatches:
    """A loader and the shardings of its arrays. `rollouts`: the loader samples with the parameters it
    is given (RL) and its batch is whole on every process; otherwise each process reads its own rows."""

    def __init__(self, loader, shardings: dict, *, rollouts: bool = False):
        self.loader, self.shardings, self.rollouts = loader, shardings, rollouts
        self.batches_per_epoch = loader.batches_per_epoch
        self._batches = iter(loader)  # a generator: nothing is read or sampled before the first next()

    def next(self, params) -> dict:
        """The next global batch, placed. RL: `params` are the parameters the step starts from; a new
        rollout is sampled with them (with grpo.async_steps=1 the one after the step's) and its old
        log-probs computed."""
        if self.rollouts:
            self.loader.params = params
        local = next(self._batches)
        put = place if self.rollouts else jax.make_array_from_process_local_data
        return {k: put(sharding, local[k]) for k, sharding in self.shardings.items() if k in local}

    def metrics(self) -> dict:
        """What the latest rollout measured (RL), for the step's metrics row."""
        return self.loader.metrics() if self.rollouts else {}

    def repeats(self) -> int:
        """Instances seen before in this epoch (the loader's audit)."""
        return self.loader.audit()["repeats_in_epoch"]

    def state(self) -> dict:
        return self.loader.state()

    def close(self) -> None:
        if self.rollouts:
            self.loader.close()


def objective_batches(
    cfg: ExperimentConfig,
    mesh,
    start: Start,
    pairs: Optional[ItemSource],
    run_dir: str,
    allow_data_change: bool,
) -> StepBatches:
    """The run's batches from the start's data position (errors name the data, the batch split or the
    cache that does not fit). `pairs`: the items of an objective on items read from files, such as DPO's
    preference pairs (olmax.trainer.reference.open_pairs); None for tokens and rollouts."""
    batch_layout(cfg, mesh)  # refuses a batch the mesh cannot split before the data is prepared
    objective = objective_of(cfg)
    shardings = batch_shardings(cfg, mesh, objective)
    if objective.data == "rollouts":  # every array is (rows, seq) token-aligned, placed as input_ids
        return StepBatches(_rollouts(cfg, mesh, start, run_dir, allow_data_change), shardings, rollouts=True)
    if objective.data != "tokens":
        return StepBatches(_items(cfg, mesh, start, pairs, allow_data_change, objective), shardings)
    loader = make_loader(
        cfg.data,
        cfg.trainer.global_batch,
        dp_rank=jax.process_index(),
        dp_size=jax.process_count(),
        state=start.data_state,
        allow_fingerprint_mismatch=allow_data_change,
    )
    return StepBatches(loader, shardings)


def _rollouts(cfg, mesh, start: Start, run_dir: str, allow_data_change: bool) -> RolloutProducer:
    """The RL loop's rollouts (prompts -> sample -> verify -> pack). With grpo.beta > 0 the kl3 penalty's
    reference is the starting parameters (a copy: the step donates the state's)."""
    tok = load_tokenizer(cfg.data.tokenizer)
    reference = None
    if cfg.grpo.beta > 0:
        reference = (
            jax.tree.map(jnp.copy, start.state.params) if not start.resumed else starting_params(cfg, mesh, start)
        )
    return RolloutProducer(
        cfg,
        mesh,
        prompt_set(cfg, tok),
        tok,
        reference=reference,
        state=start.data_state,
        allow_mismatch=allow_data_change,
        record_dir=run_dir,
    )


def _items(cfg, mesh, start: Start, source: ItemSource, allow_data_change: bool, objective: Objective) -> PairLoader:
    """The items (preference pairs, a plug-in kind's), with their reference log-probs when the objective
    has a reference pass (DPO) and the per-item fields it declares."""
    fields = objective.fields(cfg)
    unplaced = [name for name in objective.data_fields if name not in fields]
    if unplaced:  # the loader would read them and the step never see them
        raise ConfigError(
            f"trainer.objective={objective.name} declares the data field(s) {', '.join(unplaced)} that its "
            "fields() does not hold (olmax.objectives.base.item_fields(cfg, data_fields=...) adds them)"
        )
    logps, fingerprint = _reference(cfg, mesh, start, source) if objective.reference_pass else (None, None)
    return PairLoader(
        cfg.data,
        source,
        logps,
        cfg.trainer.global_batch,
        dp_rank=jax.process_index(),
        dp_size=jax.process_count(),
        state=start.data_state,
        allow_fingerprint_mismatch=allow_data_change,
        reference_fingerprint=fingerprint,
        fields=objective.data_fields,
        objective=objective.name,
    )


def _reference(cfg, mesh, start: Start, source: ItemSource):
    """(the items' reference log-probs, the fingerprint of the parameters they come from). The reference
    pass runs on the starting parameters, which a resumed run makes again only if the cache is missing
    (it is written before step 1); their fingerprint keys the cache: a resumed run's is the one its data
    state recorded at the start (a data state from before the record has none: the starting parameters
    are made again)."""
    if not start.resumed:
        fingerprint = params_fingerprint(start.state.params)
    else:
        fingerprint = (start.data_state or {}).get(REFERENCE_FINGERPRINT) or params_fingerprint(
            starting_params(cfg, mesh, start)
        )
    log = print if jax.process_index() == 0 else lambda _: None
    logps = reference_logps_cache(cfg, mesh, source, lambda: starting_params(cfg, mesh, start), fingerprint, log=log)
    return logps, fingerprint
