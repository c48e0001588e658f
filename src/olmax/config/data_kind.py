"""The kinds of data an objective trains on, and what a config knows of each without jax.

An objective's section names its kind (`ObjectiveConfig.data`, olmax.config.objective). A kind says what
one item of trainer.global_batch is: `rows`, the sequences of data.seq_len an item holds (what
`ExperimentConfig.rows_per_step` counts: FLOPs, tokens, the fit), and `check(cfg)`, what every objective
on it refuses of the other sections. Built in:

- `tokens`: a token instance, one row (the Grain loader, olmax.data.loader);
- `pairs`: a preference pair, two rows, chosen then rejected (olmax.data.pairs.PairSource);
- `rollouts`: a packed rollout row (the RL loop, olmax.rollout.producer).

The trainer makes their batches (olmax.trainer.batches). A plug-in kind, for an objective whose data is
a new shape, is an `olmax.data_kinds` entry point naming a `DataKind` subclass (or an instance), which
also gives its items: `source(cfg)` returns an item source (olmax.data.pairs.ItemSource: each item a few
rows of one or more `olmax tokenize --chat` directories, and per-item fields from their rows), which the
trainer reads as it reads preference pairs, in the seeded order, with the reference pass when the
objective asks for one. docs/extending.md, "An objective's data".
"""

from __future__ import annotations

import functools
from typing import ClassVar

from olmax.config.entry_points import installed
from olmax.errors import ConfigError, refuse

ENTRY_POINT_GROUP = "olmax.data_kinds"


class DataKind:
    """Base of every kind of data (module doc). `name`: what an objective's section's `data` calls it;
    `rows`: the sequences one item holds."""

    name: ClassVar[str]
    rows: ClassVar[int] = 1

    def check(self, cfg) -> None:
        """A ConfigError naming the knob for what no objective on this data takes."""

    def source(self, cfg):
        """A plug-in kind's items (olmax.data.pairs.ItemSource); the built-in kinds' batches are made by
        olmax.trainer.batches."""
        raise NotImplementedError(f"the data kind {self.name!r} has no item source")


def lm_only(cfg, unit: str) -> list[tuple[bool, str, str]]:
    """The LM data and loss options an objective on whole sequences (pairs, rollouts, a plug-in's items:
    the `unit`) refuses, as refuse() rules."""
    data = cfg.data
    return [
        (data.instance_filter, "data.instance_filter=true", "the repetition filter is an LM-loss mask"),
        (data.max_target_seq_len is not None, "data.max_target_seq_len", f"it chunks token streams, not {unit}"),
        (cfg.optimizer.z_loss != 0.0, f"optimizer.z_loss={cfg.optimizer.z_loss}", "it regularises the LM loss"),
        (cfg.mesh.context != 1, f"mesh.context={cfg.mesh.context}", "its log-probs are not split over a context axis"),
    ]


def check_sequences(cfg, unit: str) -> None:
    """What an objective on items of whole sequences read from `olmax tokenize --chat` output does not
    take (`unit`: what an item is, "pairs"): each row is one prompt and response, right-padded
    (open-instruct's DPO batches), its label mask read with it (olmax.data.pairs)."""
    data = cfg.data
    refused = [
        (data.packing != "none", "data.packing=obfd", f"each row is one sequence of the {unit}, not packed documents"),
        (data.doc_masking, "data.doc_masking=true", "a row holds one document, so causal attention is enough"),
        (data.label_masks, "data.label_masks=true", f"the {unit} are always read with their label masks"),
    ]
    message = f"trainer.objective={cfg.trainer.objective} does not take {{knob}}: {{why}}"
    refuse(refused + lm_only(cfg, unit), message)


def check_rollouts(cfg) -> None:
    """What an objective on rollouts (GRPO) does not take. Its rows are the RL loop's packed prompt +
    response sequences (open-instruct's pack_sequences), handed to the step whole: no LM data options apply."""
    data = cfg.data
    refused = [
        (data.packing != "none", "data.packing=obfd", "the RL loop packs its rollouts itself"),
        (data.label_masks, "data.label_masks=true", "the batch's response_mask says which tokens have a loss"),
    ]
    message = f"trainer.objective={cfg.trainer.objective} does not take {{knob}}: {{why}}"
    refuse(refused + lm_only(cfg, "rollouts"), message)


class Tokens(DataKind):
    name = "tokens"


class Pairs(DataKind):
    name = "pairs"
    rows = 2  # chosen, rejected

    def check(self, cfg) -> None:
        check_sequences(cfg, "pairs")


class Rollouts(DataKind):
    name = "rollouts"

    def check(self, cfg) -> None:
        check_rollouts(cfg)


BUILTINS: dict[str, DataKind] = {k.name: k for k in (Tokens(), Pairs(), Rollouts())}


def _entry_points() -> dict:
    return installed(ENTRY_POINT_GROUP)


def kind_names() -> list[str]:
    """The built-in kinds and the installed plug-in kinds (their names only: nothing loads)."""
    return [*BUILTINS, *(n for n in sorted(_entry_points()) if n not in BUILTINS)]


@functools.cache
def plugin_kind(name: str):
    """The kind an `olmax.data_kinds` entry point names, loaded once per process; None when no entry
    point has that name."""
    ep = _entry_points().get(name)
    if ep is None:
        return None
    try:
        return ep.load()
    except Exception as e:  # a plug-in that fails to import: name it, not a bare traceback
        raise ConfigError(f"the data kind {name!r}: the entry point {ep.value!r} does not load: {e}") from e


def kind_named(name: str) -> DataKind:
    """The kind called `name`: built in, or an `olmax.data_kinds` entry point (loaded once per process).
    A ConfigError listing the known kinds for any other name."""
    if name in BUILTINS:
        return BUILTINS[name]
    found = plugin_kind(name)
    if found is None:
        raise ConfigError(
            f"the data kind {name!r} is not one of {', '.join(kind_names())} (a plug-in kind is an "
            f"`{ENTRY_POINT_GROUP}` entry point: docs/extending.md)"
        )
    kind = found() if isinstance(found, type) else found
    if not isinstance(kind, DataKind):
        raise ConfigError(
            f"the data kind {name!r}: its entry point gives {found!r}, not an olmax.config.data_kind.DataKind"
        )
    if kind.name != name:
        raise ConfigError(f"the `{ENTRY_POINT_GROUP}` entry point {name!r} gives the data kind named {kind.name!r}")
    if not (isinstance(kind.rows, int) and kind.rows >= 1):
        raise ConfigError(f"the data kind {name!r} declares rows={kind.rows!r}: an item holds one row or more")
    return kind
