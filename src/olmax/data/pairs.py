"""Preference pairs for the objectives on pairs (trainer.objective=dpo), read from `olmax tokenize --chat`
preference output.

    source = PairSource(data_cfg)            # data.paths = [DIR]; DIR/chosen/ and DIR/rejected/
    loader = PairLoader(data_cfg, source, reference, global_batch, state=saved)
    for batch in loader:                     # runs on across epochs
        batch["input_ids"]                   # (pairs, 2, seq_len) int32: [:, 0] chosen, [:, 1] rejected
        batch["response_mask"]               # (pairs, 2, seq_len) bool: the tokenizer's label masks
        batch["reference_logps"]             # (pairs, 2) float32: the reference pass's (olmax.trainer.reference),
                                             # when the objective has one (reference=None: absent)
        batch["index"]                       # (pairs,) int64: the pairs' ids
    loader.state()                           # JSON-able; resume with PairLoader(..., state=saved)
    pair_order_report(data_cfg, 128, range(1, 3))   # `olmax data order` on pairs: who trained on what

- Document i of `chosen/` and of `rejected/` is pair i (tokenize writes them so). Each side is one row:
  its tokens, cut to data.seq_len, right-padded with data.pad_token_id (masked out). Cutting a longer
  side is what open-instruct does: its DPO tokenizes every side with `max_seq_length` truncation
  (`preference_tulu_tokenize_and_truncate_v1`, which runs `sft_tulu_tokenize_and_truncate_v1` per
  side), then drops pairs where a side has no trained token left (`preference_tulu_filter_v1`;
  open-instruct `open_instruct/dataset_transformation.py`, commit e6c3044). PairSource drops those
  pairs too; tokenizing with `--max-seq-len` equal to data.seq_len makes both steps happen there.
- The order: epoch e is the permutation of the kept pairs by PCG64(data.seed + e)
  (olmax.data.order.cached_permutation, OLMo-core's), global batches of trainer.global_batch pairs
  cut from it, the remainder dropped; a process that owns data-parallel ranks r..r+k-1 of D gets their
  pairs (olmax.data.order.rank_ids), as the LM loader does.
- `state()` holds the fingerprint (both sides' token and label-mask digests, the masks being what the
  loss and the reference pass sum over, and data.seq_len), seed, epoch and
  batches processed: the state saved after step N resumes at batch N; a fingerprint mismatch raises
  DataStateError unless allowed. It also records the fingerprint of the parameters the reference
  log-probs came from (`reference_fingerprint`, olmax.trainer.reference.params_fingerprint): a
  resumed run checks the cache against its own start without loading the starting parameters again.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from olmax.data.loader import DataStateError, tokenizer_fields, work_dir_of
from olmax.data.order import cached_permutation, check_rank, check_steps, num_batches, rank_ids
from olmax.data.sources import MASK_PART_PREFIX, TOKEN_PART_PREFIX, check_manifest_tokenizers
from olmax.data.tokenize import MANIFEST
from olmax.errors import ConfigError

log = logging.getLogger(__name__)

SIDES = ("chosen", "rejected")
STATE_VERSION = 1
REFERENCE_FINGERPRINT = "reference_fingerprint"


class _Side:
    """One side's documents: token and mask memmaps per part, (part, start, end) per document."""

    def __init__(self, directory: Path):
        manifest = json.loads((directory / MANIFEST).read_text())
        dtype = np.dtype(manifest["dtype"])
        self.digests = [shard["sha256"] for shard in manifest["shards"]]
        self.mask_digests = []
        self.tokens, self.masks, self.docs = [], [], []
        for k, shard in enumerate(manifest["shards"]):
            self.tokens.append(np.memmap(directory / shard["path"], dtype=dtype, mode="r"))
            mask_name = shard.get("label_mask", shard["path"].replace(TOKEN_PART_PREFIX, MASK_PART_PREFIX))
            self.masks.append(np.memmap(directory / mask_name, dtype=np.bool_, mode="r"))
            # written by `olmax tokenize --chat` since it records them; hashed here for older output
            self.mask_digests.append(shard.get("label_mask_sha256") or _file_digest(directory / mask_name))
            offsets = directory / shard["path"].replace(".npy", ".csv.gz")
            with gzip.open(offsets, "rt") as f:
                for line in f:
                    start, end = (int(x) for x in line.split(",")[:2])
                    self.docs.append((k, start, end))

    def read(self, i: int, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
        part, start, end = self.docs[i]
        end = min(end, start + seq_len)
        return self.tokens[part][start:end], self.masks[part][start:end]


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


class PairSource:
    """The pairs of data.paths[0] that keep a trained token on both sides within data.seq_len."""

    def __init__(self, data_cfg):
        if len(data_cfg.paths) != 1:
            raise ConfigError(
                "trainer.objective=dpo reads one `olmax tokenize --chat` preference directory (holding chosen/ "
                f"and rejected/), so data.paths needs exactly one entry; got {list(data_cfg.paths)}"
            )
        self.root = Path(data_cfg.paths[0])
        dirs = [self.root / side for side in SIDES]
        missing = [str(d) for d in dirs if not (d / MANIFEST).is_file()]
        if missing:
            raise ConfigError(
                f"data.paths={self.root} is not `olmax tokenize --chat` preference output: no {', '.join(missing)}"
                f"/{MANIFEST}"
            )
        check_manifest_tokenizers([str(d) for d in dirs], tokenizer_fields(data_cfg))
        self.seq_len, self.pad_id = data_cfg.seq_len, data_cfg.pad_token_id
        self.sides = [_Side(d) for d in dirs]
        counts = [len(s.docs) for s in self.sides]
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


class PairLoader:
    """Batches of pairs in the seeded order, across epochs, with resume state (module doc)."""

    def __init__(
        self,
        data_cfg,
        source: PairSource,
        reference: Optional[np.ndarray],
        global_batch: int,
        dp_rank: int = 0,
        dp_size: int = 1,
        local_ranks: int = 1,
        state: Optional[dict] = None,
        allow_fingerprint_mismatch: bool = False,
        reference_fingerprint: Optional[str] = None,
    ):
        check_rank(global_batch, dp_rank, dp_size)
        if reference is not None and reference.shape != (len(source), 2):
            raise ValueError(f"reference log-probs of shape {reference.shape} for {len(source)} pairs")
        self.cfg, self.source, self.reference = data_cfg, source, reference
        self.reference_fingerprint = reference_fingerprint
        self.global_batch, self.ranks, self.dp_size = global_batch, range(dp_rank, dp_rank + local_ranks), dp_size
        self.batches_per_epoch = num_batches(len(source), global_batch)
        if self.batches_per_epoch == 0:
            raise ConfigError(f"{len(source)} pairs make no global batch of {global_batch} (trainer.global_batch)")
        self.seed, self.epoch, self.batches_processed = data_cfg.seed, 1, 0
        if state is not None:
            self._restore(state, allow_fingerprint_mismatch)
        self._delivered = 0

    def _restore(self, state: dict, allow_mismatch: bool) -> None:
        if state.get("version") != STATE_VERSION or state.get("kind") != "pairs":
            raise DataStateError(f"the checkpoint's data state is not a pair loader's: {state}")
        if state["fingerprint"] != self.source.fingerprint:
            if not allow_mismatch:
                raise DataStateError(
                    f"the preference pairs differ from the checkpoint's (fingerprint {state['fingerprint'][:12]} -> "
                    f"{self.source.fingerprint[:12]}); pass --allow-data-change to continue anyway"
                )
            log.warning("preference data fingerprint mismatch allowed")
        self.seed, self.epoch = state["seed"], state["epoch"]
        # as the LM loader: position by rows, so a changed batch size resumes where the data left off
        self.batches_processed = state["pairs_processed"] // self.global_batch

    def __iter__(self) -> Iterator[dict]:
        while True:
            if self.batches_processed >= self.batches_per_epoch:
                self.epoch, self.batches_processed = self.epoch + 1, 0
            order = cached_permutation(work_dir_of(self.cfg) / "orders", len(self.source), self.seed, self.epoch)
            ids = np.concatenate(
                [rank_ids(order, self.batches_processed, self.global_batch, r, self.dp_size) for r in self.ranks]
            ).astype(np.int64)
            input_ids, mask = self.source.rows(ids)
            self.batches_processed += 1
            self._delivered += len(ids)
            batch = {"input_ids": input_ids, "response_mask": mask, "index": ids}
            if self.reference is not None:
                batch["reference_logps"] = self.reference[ids]
            yield batch

    def audit(self) -> dict:
        # a permutation per epoch: no pair comes twice within one
        return {"instances_delivered": self._delivered, "repeats_in_epoch": 0}

    def state(self) -> dict:
        return {
            "version": STATE_VERSION,
            "kind": "pairs",
            "fingerprint": self.source.fingerprint,
            "seed": self.seed,
            "epoch": self.epoch,
            "batches_processed": self.batches_processed,
            "pairs_processed": self.batches_processed * self.global_batch,
            "global_batch": self.global_batch,
            "seq_len": self.cfg.seq_len,
            REFERENCE_FINGERPRINT: self.reference_fingerprint,
        }


def pair_order_report(
    data_cfg,
    global_batch: int,
    steps: range,
    epoch: int = 1,
    dp_size: int = 1,
    dp_rank: Optional[int] = None,
    with_tokens: bool = False,
) -> dict:
    """`olmax data order` for trainer.objective=dpo: the pairs each data-parallel rank trained on at each
    step, in PairLoader's order. `ids` count the kept pairs (a batch's `index`); `documents` are their
    document numbers in chosen/ and rejected/. With `with_tokens`, each rank also lists
    `instances: [{"id", "document", "chosen": {"tokens", "label_mask"}, "rejected": {...}}]`, each side
    cut to data.seq_len as trained, without the padding. Steps count from 1: step s trains on batch s - 1."""
    source = PairSource(data_cfg)
    check_steps(steps, len(source), global_batch, epoch, data_cfg.seq_len)
    order = cached_permutation(work_dir_of(data_cfg) / "orders", len(source), data_cfg.seed, epoch)
    ranks = range(dp_size) if dp_rank is None else [dp_rank]
    report_steps = []
    for step in steps:
        per_rank = []
        for r in ranks:
            check_rank(global_batch, r, dp_size)
            ids = rank_ids(order, step - 1, global_batch, r, dp_size).astype(np.int64)
            row: dict = {"rank": r, "ids": ids.tolist(), "documents": source.pairs[ids].tolist()}
            if with_tokens:
                row["instances"] = []
                for i in ids:
                    doc = int(source.pairs[i])
                    inst: dict = {"id": int(i), "document": doc}
                    for name, side in zip(SIDES, source.sides):
                        tokens, trained = side.read(doc, source.seq_len)
                        inst[name] = {"tokens": tokens.tolist(), "label_mask": trained.tolist()}
                    row["instances"].append(inst)
            per_rank.append(row)
        report_steps.append({"step": step, "batch": step - 1, "ranks": per_rank})
    return {
        "kind": "pairs",
        "fingerprint": source.fingerprint,
        "instances": len(source),
        "dropped": source.dropped,
        "batches_per_epoch": num_batches(len(source), global_batch),
        "seed": data_cfg.seed,
        "epoch": epoch,
        "global_batch_instances": global_batch,
        "seq_len": data_cfg.seq_len,
        "dp_size": dp_size,
        "files": [str(source.root / side) for side in SIDES],
        "steps": report_steps,
    }
