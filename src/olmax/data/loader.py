"""The training data loader: OLMo-core's instances and order, read through Grain.

Contract (what the trainer relies on)
-------------------------------------
    loader = make_loader(data_cfg, global_batch, dp_rank=r, dp_size=D, local_ranks=k, state=saved)
    for batch in loader:            # runs on across epochs; never ends by itself
        batch["input_ids"]          # np.ndarray (k * global_batch / D, seq_len) int32
        batch["index"]              # np.ndarray (rows,) int64: global instance ids of those rows
        batch["instance_mask"]      # np.ndarray (rows,) bool, only with data.instance_filter
        batch["doc_lens"]           # np.ndarray (rows, seq_len) int32, only with data.doc_masking
        batch["label_mask"]         # np.ndarray (rows, seq_len) bool, only with data.label_masks
        ...train on it...
        loader.state()              # JSON-able; save it in the checkpoint of this step
    loader.audit()                  # {"instances_delivered", "repeats_in_epoch"} for the logs

- Rows are the columns `r::D, r+1::D, ..., r+k-1::D` of OLMo-core's global batch, concatenated in rank
  order: a process that owns data-parallel ranks r..r+k-1 gets exactly their rows, and
  `jax.make_array_from_process_local_data` over a batch axis sharded by rank assembles the global batch.
  The order is a function of (files, seed, epoch, global batch) only; D, k, processes and
  `data.num_workers` never change which instance lands in which rank of which batch.
- Sharding happens in ONE place: `RankBatches.__getitem__` takes rank columns of the batch row.
  Grain's sampler and DataLoader are both given `NoSharding()`, so nothing can stride the stream a
  second time (the MaxText double-sharding bug). tests/data/test_data_loader.py shows every instance of an
  epoch delivered exactly once across ranks and workers.
- `state()` = {fingerprint, seed, epoch, batches_processed, tokens_processed, ...}: `batches_processed`
  counts batches handed to the caller, so the state saved after step N resumes at batch N. Restoring
  with `state=` continues the same global order on any D, k or worker count. A fingerprint mismatch
  raises `DataStateError` naming what changed, unless `allow_fingerprint_mismatch=True`.
- At the end of an epoch the next one starts with a new permutation (epoch + 1), as OLMo-core's trainer does.
- Instances come from a TokenSource (data.packing=none) or a PackedSource (obfd, olmax.data.packing);
  the order, batches, ranks and state above are the same for both, over their instance count.
- `doc_lens` row i: the lengths of instance i's segments in order (its documents, then, in a packed
  instance, one segment for all the padding), as OLMo-core's `generate_doc_lengths` counts them, then
  zeros up to seq_len (an instance has at most seq_len segments). Cumulative sums of the non-zero
  entries are the document starts.
- `label_mask` row i: instance i's label masks (data.label_masks, SFT data), False over its padding,
  as OLMo-core's packed dataset with `label_mask_paths` gives them; the loss trains only where it is True.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

import numpy as np

from olmax.data.chat_files import eos_reading_notes
from olmax.data.filters import instance_mask
from olmax.data.order import cached_permutation, check_rank, check_steps, num_batches, rank_ids
from olmax.data.packing import PackedSource, doc_lengths, padded_doc_lens, permute_paths
from olmax.data.sources import TokenSource, label_mask_paths, resolve_paths
from olmax.data.tokenizer import TokenizerFields

log = logging.getLogger(__name__)

STATE_VERSION = 1


class DataStateError(RuntimeError):
    """A saved loader state that does not fit the data it is restored onto."""


def default_work_dir() -> Path:
    """Where order memmaps and the tokenized demo corpus are cached: $OLMAX_CACHE or ~/.cache/olmax."""
    return Path(os.environ.get("OLMAX_CACHE", Path.home() / ".cache" / "olmax"))


def work_dir_of(data_cfg) -> Path:
    return Path(data_cfg.work_dir) if data_cfg.work_dir else default_work_dir()


def tokenizer_fields(data_cfg) -> TokenizerFields:
    return TokenizerFields(
        vocab_size=data_cfg.vocab_size,
        eos_token_id=data_cfg.eos_token_id,
        pad_token_id=data_cfg.pad_token_id,
        bos_token_id=data_cfg.bos_token_id,
    )


Source = TokenSource | PackedSource


def build_source(data_cfg, paths: Optional[Sequence[str]] = None) -> Source:
    """The instances of `data_cfg.paths` (or `paths`; jsonl text among them tokenized with data.tokenizer
    on first use), checked against the configured tokenizer: chunks of each file (data.packing=none) or
    packed documents (obfd), the files in the permuted order when
    data.source_permutation_seed is set (OLMo-core permutes the paths of every dataset kind); with
    data.label_masks each file's label mask beside it (sources.label_mask_paths)."""
    specs = list(paths if paths is not None else data_cfg.paths)
    files = resolve_paths(
        specs,
        mix_base=data_cfg.mix_base,
        tokenizer_dir=data_cfg.mix_tokenizer_dir,
        cache_dir=work_dir_of(data_cfg),
        tokenizer=data_cfg.tokenizer,
        tok=tokenizer_fields(data_cfg),
    )
    files = permute_paths(files, data_cfg.source_permutation_seed)
    if data_cfg.packing == "obfd" and data_cfg.use_array_if_local is not False:
        # not an error: OLMo-core's default scans for EOS too, and AI2's SFT runs left it at that
        for note in eos_reading_notes(specs):
            log.warning("%s", note)
    if data_cfg.packing == "obfd":
        return PackedSource(
            files,
            data_cfg.seq_len,
            tokenizer_fields(data_cfg),
            work_dir_of(data_cfg),
            long_doc_strategy=data_cfg.long_doc_strategy,
            group_size=data_cfg.source_group_size,
            label_mask_paths=label_mask_paths(files) if data_cfg.label_masks else None,
            use_array_if_local=data_cfg.use_array_if_local,
        )
    return TokenSource(
        files, data_cfg.seq_len, tokenizer_fields(data_cfg), max_target_seq_len=data_cfg.max_target_seq_len
    )


def _chunk(data_cfg) -> int:
    mt = data_cfg.max_target_seq_len
    return mt // data_cfg.seq_len if mt else 1


def read_instance(source: Source, index: int, eos: int, bos: Optional[int]) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, doc_lens) of one instance, as OLMo-core's dataset with generate_doc_lengths gives them."""
    if isinstance(source, PackedSource):
        return source.read(index)
    tokens = source[index]
    return tokens, doc_lengths(tokens, eos, bos)


@dataclass(frozen=True)
class RankBatches:
    """Grain data source: element k is batch `start_batch + k` of one epoch, for ranks r..r+k-1.

    Picklable and cheap to send to workers: the order is reopened from its memmap file there.
    """

    source: Source
    order_path: str
    order_len: int
    global_batch: int
    dp_rank: int
    dp_size: int
    local_ranks: int
    start_batch: int
    apply_filter: bool
    doc_masking: bool = False
    label_masks: bool = False

    def __len__(self) -> int:
        return num_batches(self.order_len, self.global_batch) - self.start_batch

    def __repr__(self) -> str:  # Grain compares reprs on set_state; keep it stable
        return (
            f"RankBatches({self.source.fingerprint}, order={os.path.basename(self.order_path)}, "
            f"B={self.global_batch}, ranks={self.dp_rank}+{self.local_ranks}/{self.dp_size}, "
            f"start={self.start_batch})"
        )

    def ids(self, k: int) -> np.ndarray:
        order = np.memmap(self.order_path, dtype=np.uint32, mode="r", shape=(self.order_len,))
        b = self.start_batch + int(k)
        return np.concatenate(
            [
                rank_ids(order, b, self.global_batch, r, self.dp_size)
                for r in range(self.dp_rank, self.dp_rank + self.local_ranks)
            ]
        )

    def __getitem__(self, k: int) -> dict:
        ids = self.ids(k)
        out: dict = {"index": ids, "batch": np.int64(self.start_batch + int(k))}
        if self.doc_masking:
            tok = self.source.tokenizer
            read = [read_instance(self.source, int(i), tok.eos_token_id, tok.bos_token_id) for i in ids]
            width = self.source.seq_len
            out["doc_lens"] = np.stack([padded_doc_lens(lens, width) for _, lens in read])
            tokens = np.stack([t for t, _ in read]).astype(np.int32)
        else:
            tokens = np.stack([self.source[int(i)] for i in ids]).astype(np.int32)
        out["input_ids"] = tokens
        if self.label_masks:
            out["label_mask"] = np.stack([self.source.label_mask(int(i)) for i in ids])
        if self.apply_filter:
            out["instance_mask"] = instance_mask(tokens)
        return out


def _grain_loader(batches: RankBatches, workers: int):
    import grain

    if workers > 0:
        # Grain's worker processes read absl flags; outside absl.app.run they are unparsed.
        from absl import flags

        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()
    sampler = grain.samplers.IndexSampler(
        num_records=len(batches), shard_options=grain.sharding.NoSharding(), shuffle=False, num_epochs=1
    )
    return grain.DataLoader(
        data_source=batches,
        sampler=sampler,
        worker_count=workers,
        shard_options=grain.sharding.NoSharding(),
        read_options=grain.ReadOptions(num_threads=2, prefetch_buffer_size=4),
    )


class Loader:
    """Iterator of per-process batches across epochs, with exact resume state. See the module doc."""

    def __init__(
        self,
        data_cfg,
        source: Source,
        global_batch: int,
        dp_rank: int,
        dp_size: int,
        local_ranks: int,
        epoch: int,
        batches_processed: int,
        seed: int,
        workers: int,
    ):
        check_rank(global_batch, dp_rank, dp_size)
        if local_ranks < 1 or dp_rank + local_ranks > dp_size:
            raise ValueError(f"ranks {dp_rank}..{dp_rank + local_ranks - 1} are not within 0..{dp_size - 1}")
        self.cfg, self.source = data_cfg, source
        self.global_batch, self.dp_rank, self.dp_size, self.local_ranks = global_batch, dp_rank, dp_size, local_ranks
        self.epoch, self.batches_processed, self.seed, self.workers = epoch, batches_processed, seed, workers
        self.batches_per_epoch = num_batches(len(source), global_batch)
        if self.batches_per_epoch == 0:
            raise ValueError(
                f"{len(source)} instances of {data_cfg.seq_len} tokens make no global batch of "
                f"{global_batch}; add data or lower the batch size"
            )
        self._delivered = 0
        self._repeats = 0
        self._seen_epoch: Optional[int] = None
        self._seen = np.zeros(0, dtype=np.uint8)

    def _order_path(self, epoch: int) -> tuple[str, int]:
        order = cached_permutation(
            work_dir_of(self.cfg) / "orders", len(self.source), self.seed, epoch, _chunk(self.cfg)
        )
        return order.filename, len(order)

    def epoch_batches(self, epoch: int, start_batch: int) -> RankBatches:
        path, length = self._order_path(epoch)
        return RankBatches(
            self.source,
            path,
            length,
            self.global_batch,
            self.dp_rank,
            self.dp_size,
            self.local_ranks,
            start_batch,
            self.cfg.instance_filter,
            self.cfg.doc_masking,
            self.cfg.label_masks,
        )

    def __iter__(self) -> Iterator[dict]:
        while True:
            if self.batches_processed >= self.batches_per_epoch:
                self.epoch, self.batches_processed = self.epoch + 1, 0
            batches = self.epoch_batches(self.epoch, self.batches_processed)
            for batch in _grain_loader(batches, self.workers):
                self.batches_processed += 1
                self._audit(batch["index"])
                yield batch

    def _audit(self, ids: np.ndarray) -> None:
        """Counts delivered instances and repeats within the epoch (a bit per instance)."""
        if self._seen_epoch != self.epoch:
            self._seen_epoch = self.epoch
            self._seen = np.zeros((len(self.source) + 7) // 8, dtype=np.uint8)
        byte, bit = ids >> 3, (1 << (ids & 7)).astype(np.uint8)
        already = (self._seen[byte] & bit) != 0
        self._repeats += int(already.sum()) + len(ids) - len(np.unique(ids))
        np.bitwise_or.at(self._seen, byte, bit)
        self._delivered += len(ids)

    def audit(self) -> dict:
        return {"instances_delivered": self._delivered, "repeats_in_epoch": self._repeats}

    def state(self) -> dict:
        return {
            "version": STATE_VERSION,
            "fingerprint": self.source.fingerprint,
            "seed": self.seed,
            "epoch": self.epoch,
            "batches_processed": self.batches_processed,
            "tokens_processed": self.batches_processed * self.global_batch * self.cfg.seq_len,
            "global_batch": self.global_batch,
            "seq_len": self.cfg.seq_len,
            "max_target_seq_len": self.cfg.max_target_seq_len,
            "packing": _packing_of(self.cfg),
            "tokenizer": vars(tokenizer_fields(self.cfg)),
            "files": [[os.path.basename(p), s] for p, s in zip(self.source.paths, self.source.sizes)],
        }


def _packing_of(data_cfg) -> dict:
    if data_cfg.packing == "none":
        return {"packing": "none"}
    out = {
        "packing": data_cfg.packing,
        "long_doc_strategy": data_cfg.long_doc_strategy,
        "source_group_size": data_cfg.source_group_size,
    }
    if data_cfg.use_array_if_local is not None:  # only when set: states saved before the field compare equal
        out["use_array_if_local"] = data_cfg.use_array_if_local
    return out


def describe_change(saved: dict, source: Source, data_cfg) -> str:
    """What differs between a saved state and the current data, for the fingerprint error."""
    changes = []
    if saved.get("packing", {"packing": "none"}) != _packing_of(data_cfg):
        changes.append(f"packing {saved.get('packing', {'packing': 'none'})} -> {_packing_of(data_cfg)}")
    if saved.get("tokenizer") != vars(tokenizer_fields(data_cfg)):
        changes.append(f"tokenizer {saved.get('tokenizer')} -> {vars(tokenizer_fields(data_cfg))}")
    if saved.get("max_target_seq_len") != data_cfg.max_target_seq_len:
        changes.append(f"max_target_seq_len {saved.get('max_target_seq_len')} -> {data_cfg.max_target_seq_len}")
    old = {name: size for name, size in saved.get("files", [])}
    new = {os.path.basename(p): s for p, s in zip(source.paths, source.sizes)}
    missing, added = sorted(set(old) - set(new)), sorted(set(new) - set(old))
    resized = sorted(n for n in set(old) & set(new) if old[n] != new[n])
    if missing:
        changes.append(f"{len(missing)} file(s) gone, e.g. {missing[0]}")
    if added:
        changes.append(f"{len(added)} file(s) new, e.g. {added[0]}")
    if resized:
        changes.append(
            f"{len(resized)} file(s) changed size, e.g. {resized[0]}: {old[resized[0]]} -> {new[resized[0]]} bytes"
        )
    if not changes and [n for n, _ in saved.get("files", [])] != list(new):
        changes.append("the same files in a different order")
    return "; ".join(changes) or "unknown (the saved state has no file list)"


def make_loader(
    data_cfg,
    global_batch: int,
    dp_rank: int = 0,
    dp_size: int = 1,
    local_ranks: int = 1,
    state: Optional[dict] = None,
    allow_fingerprint_mismatch: bool = False,
    source: Optional[Source] = None,
) -> Loader:
    """A loader for `data_cfg` (olmax.config.data.DataConfig); see the module doc for the contract.

    `global_batch` counts instances. Without `state` it starts at epoch 1, batch 0.
    """
    source = source or build_source(data_cfg)
    epoch, batches, seed = 1, 0, data_cfg.seed
    if state is not None:
        if state.get("version") != STATE_VERSION:
            raise DataStateError(f"data loader state version {state.get('version')} is not {STATE_VERSION}")
        if state["fingerprint"] != source.fingerprint:
            what = describe_change(state, source, data_cfg)
            if not allow_fingerprint_mismatch:
                raise DataStateError(
                    f"the data differs from the checkpoint's ({what}); the order would differ too. "
                    "Pass allow_fingerprint_mismatch (--allow-data-change) to continue anyway."
                )
            log.warning("data fingerprint mismatch allowed: %s", what)
        if state["seed"] != seed:
            log.warning("data seed %s in the checkpoint overrides the configured %s", state["seed"], seed)
            seed = state["seed"]
        epoch = state["epoch"]
        # As OLMo-core: position by tokens, so a changed batch size resumes where the data left off.
        batches = state["tokens_processed"] // (global_batch * data_cfg.seq_len)
    return Loader(
        data_cfg, source, global_batch, dp_rank, dp_size, local_ranks, epoch, batches, seed, data_cfg.num_workers
    )


def eval_batches(
    data_cfg,
    paths: Sequence[str],
    batch_size: int,
    max_batches: Optional[int] = None,
    dp_rank: int = 0,
    dp_size: int = 1,
) -> Iterator[np.ndarray]:
    """Held-out instances in file order, unshuffled: (batch_size / dp_size, seq_len) int32 per rank.
    Always chunks of the files as given (held-out sets are neither packed nor permuted)."""
    plain = dataclasses.replace(
        data_cfg, packing="none", source_group_size=1, long_doc_strategy="truncate", source_permutation_seed=None
    )
    source = build_source(plain, paths)
    check_rank(batch_size, dp_rank, dp_size)
    total = num_batches(len(source), batch_size)
    if max_batches is not None:
        total = min(total, max_batches)
    for b in range(total):
        ids = np.arange(b * batch_size, (b + 1) * batch_size)[dp_rank::dp_size]
        yield np.stack([source[int(i)] for i in ids]).astype(np.int32)


def order_report(
    data_cfg,
    global_batch: int,
    steps: range,
    epoch: int = 1,
    dp_size: int = 1,
    dp_rank: Optional[int] = None,
    with_tokens: bool = False,
) -> dict:
    """Which instances each rank trained on at each step: for chunks, their file and token offset;
    for packed instances, their group and bin, documents and padding. With `with_tokens`, each rank
    also lists `instances: [{"id", "tokens", "doc_lens"}]`, plus "label_mask" with data.label_masks.

    Steps count from 1 as in OLMo-core's trainer: step s trains on batch s - 1 of the epoch.
    """
    source = build_source(data_cfg)
    order = cached_permutation(work_dir_of(data_cfg) / "orders", len(source), data_cfg.seed, epoch, _chunk(data_cfg))
    ranks = range(dp_size) if dp_rank is None else [dp_rank]
    total = num_batches(len(order), global_batch)
    check_steps(steps, len(order), global_batch, epoch, data_cfg.seq_len)
    tok = tokenizer_fields(data_cfg)
    packed = isinstance(source, PackedSource)
    report_steps = []
    for step in steps:
        per_rank = []
        for r in ranks:
            ids = rank_ids(order, step - 1, global_batch, r, dp_size)
            where = [source.locate(int(i)) for i in ids]
            row: dict = {"rank": r, "ids": ids.tolist()}
            if packed:
                row["group"], row["bin"] = [w[0] for w in where], [w[1] for w in where]
                docs = [source.documents(int(i)) for i in ids]
                row["documents"] = [len(d) for d in docs]
                row["padding"] = [data_cfg.seq_len - sum(e - s for _, s, e in d) for d in docs]
            else:
                row["file"], row["offset"] = [w[0] for w in where], [w[1] for w in where]
            if with_tokens:
                read = [read_instance(source, int(i), tok.eos_token_id, tok.bos_token_id) for i in ids]
                row["instances"] = [
                    {"id": int(i), "tokens": t.tolist(), "doc_lens": lens.tolist()} for i, (t, lens) in zip(ids, read)
                ]
                if data_cfg.label_masks:
                    for inst in row["instances"]:
                        inst["label_mask"] = source.label_mask(inst["id"]).tolist()
            per_rank.append(row)
        report_steps.append({"step": step, "batch": step - 1, "ranks": per_rank})
    return {
        "fingerprint": source.fingerprint,
        "instances": len(source),
        "batches_per_epoch": total,
        "seed": data_cfg.seed,
        "epoch": epoch,
        "global_batch": global_batch,
        "seq_len": data_cfg.seq_len,
        "packing": data_cfg.packing,
        "dp_size": dp_size,
        "files": source.paths,
        "steps": report_steps,
    }
