"""Items of rows read from `olmax tokenize --chat` output, for the objectives whose data is such items:
preference pairs (trainer.objective=dpo; the data kind `pairs`) and a plug-in data kind's items
(olmax.config.data_kind), with the per-item fields their rows carry (olmax.data.item_fields).

    source = PairSource(data_cfg, objective="dpo")   # data.paths = [DIR]; DIR/chosen/ and DIR/rejected/
    loader = PairLoader(data_cfg, source, reference, global_batch, state=saved, fields={"weight": "float32"})
    for batch in loader:                     # runs on across epochs
        batch["input_ids"]                   # (items, rows, seq_len) int32: a pair's [:, 0] chosen, [:, 1] rejected
        batch["response_mask"]               # (items, rows, seq_len) bool: the tokenizer's label masks
        batch["reference_logps"]             # (items, rows) float32: the reference pass's (olmax.trainer.reference),
                                             # when the objective has one (reference=None: absent)
        batch["weight"]                      # (items,) each item's value of a field its rows carry
        batch["index"]                       # (items,) int64: the items' ids
    loader.state()                           # JSON-able; resume with PairLoader(..., state=saved)
    pair_order_report(data_cfg, 128, range(1, 3))   # `olmax data order` on pairs: who trained on what

- An item source (`ItemSource`) says how many items there are, the rows of any of them, each item's
  value of a per-item field, and its fingerprint; `ChatDocuments` reads one tokenized chat directory
  for it. PairSource is the preference pairs': document i of `chosen/` and of `rejected/` is pair i
  (tokenize writes them so). Each side is one row: its tokens, cut to data.seq_len, right-padded with
  data.pad_token_id (masked out). Cutting a longer side is what open-instruct does: its DPO tokenizes
  every side with `max_seq_length` truncation (`preference_tulu_tokenize_and_truncate_v1`, which runs
  `sft_tulu_tokenize_and_truncate_v1` per side), then drops pairs where a side has no trained token
  left (`preference_tulu_filter_v1`; open-instruct `open_instruct/dataset_transformation.py`, commit
  e6c3044). PairSource drops those pairs too; tokenizing with `--max-seq-len` equal to data.seq_len
  makes both steps happen there. A pair's fields are its row's, read from chosen/.
- The order: epoch e is the permutation of the items by PCG64(data.seed + e)
  (olmax.data.order.cached_permutation, OLMo-core's), global batches of trainer.global_batch items
  cut from it, the remainder dropped; a process that owns data-parallel ranks r..r+k-1 of D gets their
  items (olmax.data.order.rank_ids), as the LM loader does. A source whose `group` is g > 1 keeps runs
  of g consecutive items together: the order shuffles whole runs (OLMo-core's chunked order), so an
  item's rows may be built from the other items of its run and still be in its global batch (KTO's
  mismatched completions, which TRL takes from the batch it samples sequentially).
- `state()` holds the source's fingerprint (for pairs: both sides' token and label-mask digests, the
  masks being what the loss and the reference pass sum over, the rows' fields, and data.seq_len),
  seed, epoch and batches processed: the state saved after step N resumes at batch N; a fingerprint
  mismatch raises DataStateError unless allowed. It also records the fingerprint of the parameters
  the reference log-probs came from (`reference_fingerprint`,
  olmax.trainer.reference.params_fingerprint): a resumed run checks the cache against its own start
  without loading the starting parameters again.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
from pathlib import Path
from typing import Iterator, Mapping, Optional

import numpy as np

from olmax.config.data_kind import kind_named
from olmax.config.objective import data_kind
from olmax.data.item_fields import fields_digest, read_field
from olmax.data.loader import DataStateError, tokenizer_fields, work_dir_of
from olmax.data.order import cached_permutation, check_rank, check_steps, num_batches, rank_ids
from olmax.data.sources import MASK_PART_PREFIX, TOKEN_PART_PREFIX, check_manifest_tokenizers
from olmax.data.tokenize import MANIFEST
from olmax.errors import ConfigError

log = logging.getLogger(__name__)

SIDES = ("chosen", "rejected")
STATE_VERSION = 1
REFERENCE_FINGERPRINT = "reference_fingerprint"


class ChatDocuments:
    """One `olmax tokenize --chat` directory's documents: token and mask memmaps per part, (part, start,
    end) per document, and the per-item fields of their rows."""

    def __init__(self, directory: str | Path, data_cfg):
        self.root = Path(directory)
        if not (self.root / MANIFEST).is_file():
            raise ConfigError(f"{self.root} is not `olmax tokenize --chat` output: no {self.root / MANIFEST}")
        check_manifest_tokenizers([str(self.root)], tokenizer_fields(data_cfg))
        self.manifest = json.loads((self.root / MANIFEST).read_text())
        dtype = np.dtype(self.manifest["dtype"])
        self.digests = [shard["sha256"] for shard in self.manifest["shards"]]
        self.mask_digests = []
        self.tokens, self.masks, self.docs = [], [], []
        for k, shard in enumerate(self.manifest["shards"]):
            self.tokens.append(np.memmap(self.root / shard["path"], dtype=dtype, mode="r"))
            mask_name = shard.get("label_mask", shard["path"].replace(TOKEN_PART_PREFIX, MASK_PART_PREFIX))
            self.masks.append(np.memmap(self.root / mask_name, dtype=np.bool_, mode="r"))
            # written by `olmax tokenize --chat` since it records them; hashed here for older output
            self.mask_digests.append(shard.get("label_mask_sha256") or _file_digest(self.root / mask_name))
            offsets = self.root / shard["path"].replace(".npy", ".csv.gz")
            with gzip.open(offsets, "rt") as f:
                for line in f:
                    start, end = (int(x) for x in line.split(",")[:2])
                    self.docs.append((k, start, end))
        self.fields_digest = fields_digest(self.root)

    def __len__(self) -> int:
        return len(self.docs)

    def read(self, i: int, seq_len: Optional[int] = None) -> tuple[np.ndarray, np.ndarray]:
        """Document i's (tokens, label mask), cut to `seq_len` tokens when given."""
        part, start, end = self.docs[i]
        if seq_len is not None:
            end = min(end, start + seq_len)
        return self.tokens[part][start:end], self.masks[part][start:end]

    def completion(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Document i as (prompt tokens, completion tokens, the completion's label mask): the completion
        starts at the last run of trained tokens (a conversation's final assistant turn)."""
        tokens, mask = self.read(i)
        trained = np.flatnonzero(mask)
        if not len(trained):
            return tokens, tokens[:0], mask[:0]
        untrained = np.flatnonzero(~mask[: trained[-1]])
        start = untrained[-1] + 1 if len(untrained) else 0
        return tokens[:start], tokens[start:], mask[start:]

    def field(self, name: str, dtype: str) -> np.ndarray:
        """Every document's value of the per-item field `name`, as `dtype` (olmax.data.item_fields)."""
        return read_field(self.root, self.manifest, name, dtype, len(self))


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


class ItemSource:
    """What PairLoader and the reference pass read (module doc): `len(source)` items of `rows_per_item`
    rows each, `item` naming one in messages ("pair"), `group` consecutive items kept in one batch,
    `root` the directory the reference log-probs are cached under (ROOT/reference_logps), and
    `fingerprint`, which keys the loader's state and that cache (it must change with anything `rows`
    or `field` returns)."""

    item: str = "item"
    rows_per_item: int = 2
    group: int = 1
    root: Path
    fingerprint: str

    def __len__(self) -> int:
        raise NotImplementedError

    def rows(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(input_ids (n, rows_per_item, seq_len) int32, response_mask (n, rows_per_item, seq_len) bool)
        of items `ids`: each row a sequence right-padded with data.pad_token_id, its mask False there."""
        raise NotImplementedError

    def field(self, name: str, dtype: str) -> np.ndarray:
        """(len(self),) every item's value of the per-item field `name`, as `dtype`."""
        raise NotImplementedError


class PairSource(ItemSource):
    """The pairs of data.paths[0] that keep a trained token on both sides within data.seq_len.
    `objective`: the objective that reads them, named in errors."""

    item = "pair"

    def __init__(self, data_cfg, objective: Optional[str] = None):
        who = f"trainer.objective={objective}" if objective else "an objective on preference pairs"
        if len(data_cfg.paths) != 1:
            raise ConfigError(
                f"{who} reads one `olmax tokenize --chat` preference directory (holding chosen/ and "
                f"rejected/), so data.paths needs exactly one entry; got {list(data_cfg.paths)}"
            )
        self.root = Path(data_cfg.paths[0])
        dirs = [self.root / side for side in SIDES]
        missing = [str(d) for d in dirs if not (d / MANIFEST).is_file()]
        if missing:
            raise ConfigError(
                f"data.paths={self.root} is not `olmax tokenize --chat` preference output ({who} reads one): no "
                f"{', '.join(missing)}/{MANIFEST}"
            )
        self.seq_len, self.pad_id = data_cfg.seq_len, data_cfg.pad_token_id
        self.sides = [ChatDocuments(d, data_cfg) for d in dirs]
        counts = [len(s) for s in self.sides]
        if counts[0] != counts[1]:
            raise ConfigError(
                f"{self.root}: chosen/ has {counts[0]} documents and rejected/ {counts[1]}; pairs need both"
            )
        self.pairs = np.array(
            [i for i in range(counts[0]) if all(s.read(i, self.seq_len)[1].any() for s in self.sides)], np.int64
        )
        self.dropped = counts[0] - len(self.pairs)
        if self.dropped:
            log.info(
                "%d of %d pairs have a side with no trained token within %d tokens: left out",
                self.dropped,
                counts[0],
                self.seq_len,
            )
        key = {"seq_len": self.seq_len}
        for side, name in zip(self.sides, SIDES):
            key[name], key[f"{name}_masks"] = side.digests, side.mask_digests
        if self.sides[0].fields_digest:  # the fields a pair's objective may read (tokenized before: none)
            key["fields"] = self.sides[0].fields_digest
        self.fingerprint = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()

    def __len__(self) -> int:
        return len(self.pairs)

    def rows(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(input_ids (n, 2, seq_len) int32, response_mask (n, 2, seq_len) bool) of kept pairs `ids`."""
        input_ids = np.full((len(ids), 2, self.seq_len), self.pad_id, np.int32)
        mask = np.zeros((len(ids), 2, self.seq_len), bool)
        for row, i in enumerate(ids):
            for side, source in enumerate(self.sides):
                tokens, trained = source.read(int(self.pairs[i]), self.seq_len)
                input_ids[row, side, : len(tokens)] = tokens
                mask[row, side, : len(trained)] = trained
        return input_ids, mask

    def field(self, name: str, dtype: str) -> np.ndarray:
        return self.sides[0].field(name, dtype)[self.pairs]


class PairLoader:
    """Batches of an item source's items (preference pairs, or a plug-in data kind's) in the seeded
    order, across epochs, with resume state (module doc). `fields`: {name: dtype} of the per-item fields
    the objective declares (olmax.objectives.base.Objective.data_fields), read once and given with each
    batch; `objective` names it in errors."""

    def __init__(
        self,
        data_cfg,
        source: ItemSource,
        reference: Optional[np.ndarray],
        global_batch: int,
        dp_rank: int = 0,
        dp_size: int = 1,
        local_ranks: int = 1,
        state: Optional[dict] = None,
        allow_fingerprint_mismatch: bool = False,
        reference_fingerprint: Optional[str] = None,
        fields: Optional[Mapping[str, str]] = None,
        objective: Optional[str] = None,
    ):
        check_rank(global_batch, dp_rank, dp_size)
        who = f"trainer.objective={objective}: " if objective else ""
        if reference is not None and reference.shape != (len(source), source.rows_per_item):
            raise ValueError(
                f"reference log-probs of shape {reference.shape} for {len(source)} {source.item}s of "
                f"{source.rows_per_item} rows"
            )
        if global_batch % source.group:
            raise ConfigError(
                f"{who}trainer.global_batch={global_batch} is not a multiple of the {source.group} {source.item}s "
                "its data keeps together in one batch"
            )
        try:
            self.fields = {name: source.field(name, dtype) for name, dtype in (fields or {}).items()}
        except ConfigError as e:
            raise ConfigError(f"{who}{e}") from None
        self.cfg, self.source, self.reference = data_cfg, source, reference
        self.reference_fingerprint = reference_fingerprint
        self.global_batch, self.ranks, self.dp_size = global_batch, range(dp_rank, dp_rank + local_ranks), dp_size
        self.batches_per_epoch = num_batches(len(source) // source.group * source.group, global_batch)
        if self.batches_per_epoch == 0:
            raise ConfigError(
                f"{who}{len(source)} {source.item}s make no global batch of {global_batch} (trainer.global_batch)"
            )
        self.seed, self.epoch, self.batches_processed = data_cfg.seed, 1, 0
        if state is not None:
            self._restore(state, allow_fingerprint_mismatch)
        self._delivered = 0

    @property
    def kind(self) -> str:
        """What the state calls this loader's items ("pairs")."""
        return f"{self.source.item}s"

    def _restore(self, state: dict, allow_mismatch: bool) -> None:
        if state.get("version") != STATE_VERSION or state.get("kind") != self.kind:
            raise DataStateError(f"the checkpoint's data state is not a loader of {self.kind}: {state}")
        if state["fingerprint"] != self.source.fingerprint:
            if not allow_mismatch:
                raise DataStateError(
                    f"the {self.kind} differ from the checkpoint's (fingerprint {state['fingerprint'][:12]} -> "
                    f"{self.source.fingerprint[:12]}); pass --allow-data-change to continue anyway"
                )
            log.warning("%s: data fingerprint mismatch allowed", self.kind)
        self.seed, self.epoch = state["seed"], state["epoch"]
        # as the LM loader: position by rows, so a changed batch size resumes where the data left off
        self.batches_processed = state["pairs_processed"] // self.global_batch

    def __iter__(self) -> Iterator[dict]:
        while True:
            if self.batches_processed >= self.batches_per_epoch:
                self.epoch, self.batches_processed = self.epoch + 1, 0
            order = cached_permutation(
                work_dir_of(self.cfg) / "orders", len(self.source), self.seed, self.epoch, self.source.group
            )
            ids = np.concatenate(
                [rank_ids(order, self.batches_processed, self.global_batch, r, self.dp_size) for r in self.ranks]
            ).astype(np.int64)
            input_ids, mask = self.source.rows(ids)
            self.batches_processed += 1
            self._delivered += len(ids)
            batch = {"input_ids": input_ids, "response_mask": mask, "index": ids}
            batch.update({name: values[ids] for name, values in self.fields.items()})
            if self.reference is not None:
                batch["reference_logps"] = self.reference[ids]
            yield batch

    def audit(self) -> dict:
        # a permutation per epoch: no item comes twice within one
        return {"instances_delivered": self._delivered, "repeats_in_epoch": 0}

    def state(self) -> dict:
        return {
            "version": STATE_VERSION,
            "kind": self.kind,
            "fingerprint": self.source.fingerprint,
            "seed": self.seed,
            "epoch": self.epoch,
            "batches_processed": self.batches_processed,
            "pairs_processed": self.batches_processed * self.global_batch,  # items (the name older states use)
            "global_batch": self.global_batch,
            "seq_len": self.cfg.seq_len,
            REFERENCE_FINGERPRINT: self.reference_fingerprint,
        }


def item_source(cfg) -> ItemSource:
    """The items the objective of `cfg` (an ExperimentConfig) reads from files: the preference pairs
    for the data kind `pairs`, a plug-in kind's `source(cfg)` for any other (olmax.config.data_kind). A
    ConfigError for `tokens` and `rollouts`, whose batches are not items (olmax.trainer.batches), and
    for a source whose items hold other than the rows its kind declares."""
    kind = kind_named(data_kind(cfg.objective_config))
    objective = cfg.trainer.objective
    if kind.name in ("tokens", "rollouts"):
        raise ConfigError(f"trainer.objective={objective} trains on {kind.name}, not on items read from files")
    source = PairSource(cfg.data, objective=objective) if kind.name == "pairs" else kind.source(cfg)
    if source.rows_per_item != kind.rows:
        raise ConfigError(
            f"the data kind {kind.name!r} declares {kind.rows} rows an item, but its source gives "
            f"{source.rows_per_item}"
        )
    return source


def pair_order_report(
    data_cfg,
    global_batch: int,
    steps: range,
    epoch: int = 1,
    dp_size: int = 1,
    dp_rank: Optional[int] = None,
    with_tokens: bool = False,
    source: Optional[ItemSource] = None,
) -> dict:
    """`olmax data order` for an objective on items: the items of `source` (default: the preference
    pairs of data.paths) each data-parallel rank trained on at each step, in PairLoader's order. `ids`
    count the source's items (a batch's `index`); pairs also list their `documents` in chosen/ and
    rejected/. With `with_tokens`, each rank also lists `instances`: for pairs `{"id", "document",
    "chosen": {"tokens", "label_mask"}, "rejected": {...}}`, each side cut to data.seq_len as trained,
    without the padding; for a plug-in kind's items `{"id", "rows": [{"tokens", "label_mask"}, ...]}`,
    each row as the loader gives it, padded to data.seq_len with data.pad_token_id. Steps count from 1:
    step s trains on batch s - 1."""
    source = PairSource(data_cfg) if source is None else source
    pairs = source if isinstance(source, PairSource) else None
    kept = len(source) // source.group * source.group  # the order shuffles whole runs of `group` items
    check_steps(steps, kept, global_batch, epoch, data_cfg.seq_len)
    order = cached_permutation(work_dir_of(data_cfg) / "orders", len(source), data_cfg.seed, epoch, source.group)
    ranks = range(dp_size) if dp_rank is None else [dp_rank]
    report_steps = []
    for step in steps:
        per_rank = []
        for r in ranks:
            check_rank(global_batch, r, dp_size)
            ids = rank_ids(order, step - 1, global_batch, r, dp_size).astype(np.int64)
            row: dict = {"rank": r, "ids": ids.tolist()}
            if pairs is not None:
                row["documents"] = pairs.pairs[ids].tolist()
            if with_tokens:
                row["instances"] = _pair_tokens(pairs, ids) if pairs is not None else _item_rows(source, ids)
            per_rank.append(row)
        report_steps.append({"step": step, "batch": step - 1, "ranks": per_rank})
    report = {
        "kind": f"{source.item}s",
        "fingerprint": source.fingerprint,
        "instances": len(source),
        "batches_per_epoch": num_batches(kept, global_batch),
        "seed": data_cfg.seed,
        "epoch": epoch,
        "global_batch": global_batch,
        "seq_len": data_cfg.seq_len,
        "dp_size": dp_size,
        "files": [str(source.root / side) for side in SIDES] if pairs is not None else [str(source.root)],
        "steps": report_steps,
    }
    if pairs is not None:
        report["dropped"] = pairs.dropped
    return report


def _pair_tokens(source: PairSource, ids: np.ndarray) -> list[dict]:
    out = []
    for i in ids:
        doc = int(source.pairs[i])
        inst: dict = {"id": int(i), "document": doc}
        for name, side in zip(SIDES, source.sides):
            tokens, trained = side.read(doc, source.seq_len)
            inst[name] = {"tokens": tokens.tolist(), "label_mask": trained.tolist()}
        out.append(inst)
    return out


def _item_rows(source: ItemSource, ids: np.ndarray) -> list[dict]:
    input_ids, mask = source.rows(ids)
    return [
        {"id": int(i), "rows": [{"tokens": t.tolist(), "label_mask": m.tolist()} for t, m in zip(rows, masks)]}
        for i, rows, masks in zip(ids, input_ids, mask)
    ]
