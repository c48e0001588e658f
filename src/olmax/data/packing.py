"""Whole documents packed into fixed-length instances, as ai2-olmo-core 3.0.0's `NumpyPackedFSLDataset`.

Documents: a local file is cut after every EOS (with a BOS id: after every EOS that a BOS follows, and
after an EOS that ends the file), so EOS is a document's last token and the tokens after a file's last
boundary are dropped. A remote file (a URL) takes its boundaries from the `.csv.gz` next to it (lines
`start,end,...`, the layout OLMo-core's `write_document_indices` writes), because 3.0.0 reads the
metadata for every URL source (`olmo_core/data/utils.py`, `iter_document_indices`); with
`use_array_if_local=False` (3.0.0's option of that name) a local file does too. That is the reading
chat parts need: a truncated conversation, or one that ends with another role than the assistant, has
no final EOS, and one whose text holds the EOS string has an EOS inside, so scanning would join or
split conversations where the `.csv.gz` does not (docs/data.md, "Chat parts"). A document longer
than the sequence length L keeps its first L tokens (`truncate`) or is cut into pieces of L
(`fragment`, the last piece shorter).

Groups: files are taken `source_group_size` at a time in the configured order (the last group may be
short); a group's files are read as one stream and packed on their own, so documents never cross groups.

OBFD (optimized best-fit decreasing, 3.0.0's `InstancePacker`): documents are ordered by
`np.argsort(-lengths)` (numpy's default sort; equal lengths keep the order that call gives), then each
goes to the bin whose free space is the smallest that still holds it; among bins with that free space
the one that reached it first; a new bin only when none holds it. Bins are numbered as they open. Our
structure is a sorted list of the free-space values that some bin has, each with a FIFO of its bins:
one bisection per document, O(n log n). Documents longer than L/2 always open a bin (every earlier bin
holds a document at least as long), so they are placed without the loop.

Instances: global instance id = the group's first id + the bin number; an instance is its documents in
the order they entered the bin, right-padded with the pad id. `doc_lens` are 3.0.0's: the instance
scanned for EOS (`get_document_lengths`): one length per document and one trailing segment for all the
padding (with a BOS id, the padding joins the last document); with metadata boundaries the documents'
own lengths, then the padding as the same scan sees it.

Label masks (SFT): with `label_mask_paths`, one `np.bool_` file per token file (AI2's
`labels_mask_part_N.npy` beside `token_ids_part_N.npy`, as `olmax tokenize --chat` writes), an instance's
mask is its documents' masks in instance order, False over the padding; 3.0.0 reads them the same way
(`NumpyPackedFSLDataset.__getitem__`), so they change neither the packing nor the fingerprint.

The fingerprint is 3.0.0's `NumpyPackedFSLDataset.fingerprint`: `class=NumpyPackedFSLDataset`, then
`vocab_size, pad_token_id, eos_token_id, dtype, long_doc_strategy, bos_token_id, sequence_length`,
`source_group_size` when it is > 1, `use_array_if_local` when it is set, `_metadata_fingerprint`
(basename and sha256 of the metadata file of each distinct path read through one) when any is, as
`name=value,`, then `path=<basename>,size=<bytes>,` per file in order.

The packing index is built once per data set under `work_dir/packing/`: one int64 file per group
(`[bins, documents, bin offsets (bins + 1), document spans (documents x 2) in bin order]`), named by a
hash of everything that decides it (each file's full path, size and metadata digest: 3.0.0 keys its
packing caches by full path too, `_packing_cache_extra_ids` in `olmo_core/data/numpy_dataset.py`),
written to a temp file and renamed into place. The processes of a host take a file lock, so one of them
builds and the others wait and reuse it; later runs reuse it. Groups are built in spawned processes, each
sent only its own group's paths, sizes and metadata (a `GroupTask`), not the whole source.

The sequence length must be a power of 2: 3.0.0's packer (`InstancePacker` over a `SegmentTree`,
`olmo_core/data/utils.py`) asserts it, so no other length has an OLMo-core result to match.
"""

from __future__ import annotations

import bisect
import fcntl
import gzip
import hashlib
import logging
import os
import random
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from olmax.data.sources import (
    DataSourceError,
    TokenSource,
    dataset_fingerprint,
    file_size,
    is_url,
    read_array,
    remote_error,
)
from olmax.data.tokenizer import TokenizerFields

log = logging.getLogger(__name__)

LONG_DOC_STRATEGIES = ("truncate", "fragment")
INDEX_VERSION = "olmax-obfd-v1"  # tick when the index layout or the packing changes
_SCAN_BLOCK = 1 << 24  # tokens read at a time when scanning a file for EOS
_POOL_MIN_TOKENS = 1 << 24  # below this, spawning worker processes costs more than packing in-process


def permute_paths(paths: Sequence[str], seed: Optional[int]) -> list[str]:
    """OLMo-core's `source_permutation_seed`: `random.Random(seed).shuffle` of the index list (Python's
    RNG), applied to the path order of every dataset kind."""
    if seed is None:
        return list(paths)
    order = list(range(len(paths)))
    random.Random(seed).shuffle(order)
    return [paths[i] for i in order]


# -- documents ------------------------------------------------------------------------------------


def eos_spans(read, n_tokens: int, eos: int, bos: Optional[int]) -> np.ndarray:
    """(documents, 2) [start, end) token spans of one file from its EOS (and BOS) ids.
    `read(start, count)` returns the file's tokens start..start+count."""
    ends = []
    for start in range(0, n_tokens, _SCAN_BLOCK):
        stop = min(n_tokens, start + _SCAN_BLOCK)
        if bos is None:
            ends.append(np.flatnonzero(read(start, stop - start) == eos) + start + 1)
            continue
        ids = read(start, min(n_tokens, stop + 1) - start)  # one token of look-ahead for the BOS
        ends.append(np.flatnonzero((ids[:-1] == eos) & (ids[1:] == bos)) + start + 1)
        if stop == n_tokens and ids[-1] == eos:
            ends.append(np.asarray([n_tokens]))
    end = np.concatenate(ends).astype(np.int64) if ends else np.zeros(0, np.int64)
    starts = np.concatenate([[0], end[:-1]]) if end.size else end  # a file without EOS has no document
    return np.stack([starts.astype(np.int64), end], axis=1)


def metadata_path(path: str) -> str:
    """The `.csv.gz` document index that OLMo-core reads next to a token file."""
    head, sep, base = path.rpartition("/")
    return head + sep + base.replace(".npy", ".csv.gz")


def fetch_metadata(paths: Sequence[str]) -> list[bytes]:
    """The metadata file of each token file (local paths or URLs), in order, fetched concurrently.

    A mix holds hundreds to thousands of remote files, and one request at a time would pay each
    one's latency in turn. fsspec's `cat_ranges` (whole files: no start or end) gathers the reads of
    one filesystem on its event loop for the async backends (http, gcs) and hands back per-file
    errors, so each failure still names its file.
    """
    from olmax.extras import url_to_fs

    metas = [metadata_path(p) for p in paths]
    by_fs: dict[int, tuple[object, list[tuple[int, str]]]] = {}  # keyed by id: one batch per fs instance
    for i, meta in enumerate(metas):
        fs, p = url_to_fs(meta)
        by_fs.setdefault(id(fs), (fs, []))[1].append((i, p))
    out: list[bytes] = [b""] * len(paths)
    for fs, items in by_fs.values():
        try:
            got = fs.cat_ranges([p for _, p in items], None, None, on_error="return")
        except Exception as exc:  # noqa: BLE001 -- a failure of the whole batch: blame its first file
            got = [exc] * len(items)
        for (i, _), raw in zip(items, got):
            if isinstance(raw, BaseException):
                kind = "the remote file" if is_url(paths[i]) else "the local file"
                what = f"document metadata {metas[i]} (needed to pack {kind} {paths[i]})"
                raise remote_error(what, raw) from raw
            out[i] = raw
    return out


def metadata_spans(raw: bytes, path: str, n_tokens: int) -> np.ndarray:
    """(documents, 2) spans from a gzipped `start,end,...` metadata file, checked against the file."""
    spans = []
    for line_no, line in enumerate(gzip.decompress(raw).decode().splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split(",")
        try:
            start, end = int(fields[0]), int(fields[1])
        except (ValueError, IndexError):
            raise DataSourceError(f"{metadata_path(path)} line {line_no}: not `start,end,...`: {line!r}") from None
        if not 0 <= start < end <= n_tokens:
            raise DataSourceError(
                f"{metadata_path(path)} line {line_no}: document {start}..{end} is empty or outside the "
                f"{n_tokens} tokens of {path}"
            )
        spans.append((start, end))
    return np.asarray(spans, dtype=np.int64).reshape(-1, 2)


def cap_long_documents(spans: np.ndarray, seq_len: int, strategy: str) -> np.ndarray:
    """Documents longer than seq_len: the first seq_len tokens (`truncate`) or pieces of seq_len (`fragment`)."""
    lengths = spans[:, 1] - spans[:, 0]
    if strategy == "truncate":
        return np.stack([spans[:, 0], spans[:, 0] + np.minimum(lengths, seq_len)], axis=1)
    if strategy != "fragment":
        raise DataSourceError(f"long_doc_strategy {strategy!r} is not one of {LONG_DOC_STRATEGIES}")
    pieces = -(-lengths // seq_len)
    first = np.repeat(np.cumsum(pieces) - pieces, pieces)
    starts = np.repeat(spans[:, 0], pieces) + (np.arange(len(first)) - first) * seq_len
    return np.stack([starts, np.minimum(starts + seq_len, np.repeat(spans[:, 1], pieces))], axis=1)


# -- OBFD -----------------------------------------------------------------------------------------


def obfd(lengths: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(order, bin_of): `order` sorts the documents as 3.0.0 does; `bin_of[k]` is the bin of document
    `order[k]`. See the module doc for the rule."""
    order = np.argsort(-1 * lengths.astype(np.int64))
    ordered = lengths[order]
    n = len(ordered)
    bin_of = np.empty(n, dtype=np.int64)
    big = int(np.count_nonzero(ordered > seq_len // 2))  # a prefix: these each open a bin
    bin_of[:big] = np.arange(big)
    bins_with: dict[int, deque] = {}  # free space -> its bins, oldest first
    for b, length in enumerate(ordered[:big].tolist()):
        if length < seq_len:
            bins_with.setdefault(seq_len - length, deque()).append(b)
    spaces = sorted(bins_with)  # the free-space values that some bin has
    n_bins = big
    placed = []
    for length in ordered[big:].tolist():
        k = bisect.bisect_left(spaces, length)
        if k == len(spaces):
            b, free = n_bins, seq_len
            n_bins += 1
        else:
            free = spaces[k]
            queue = bins_with[free]
            b = queue.popleft()
            if not queue:
                del spaces[k], bins_with[free]
        placed.append(b)
        left = free - length
        if left:
            queue = bins_with.get(left)
            if queue is None:
                bins_with[left] = deque((b,))
                bisect.insort(spaces, left)
            else:
                queue.append(b)
    bin_of[big:] = placed
    return order, bin_of


def pack_spans(spans: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(bin_offsets (bins + 1), spans in bin order): bin b holds spans[bin_offsets[b]:bin_offsets[b+1]]
    in the order they entered it."""
    order, bin_of = obfd(spans[:, 1] - spans[:, 0], seq_len)
    by_bin = np.argsort(bin_of, kind="stable")  # within a bin, the order of entry
    counts = np.bincount(bin_of, minlength=int(bin_of.max()) + 1 if len(bin_of) else 0)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return offsets, spans[order[by_bin]]


# -- document lengths -----------------------------------------------------------------------------


def doc_lengths(tokens: np.ndarray, eos: int, bos: Optional[int] = None) -> np.ndarray:
    """3.0.0's `get_document_lengths`: segment lengths of an instance, split after each EOS (with a BOS
    id, after each EOS followed by BOS); a tail that does not end in EOS is one more segment."""
    n = len(tokens)
    if bos is None:
        ends = np.flatnonzero(tokens == eos)
        if n and tokens[-1] != eos:
            ends = np.append(ends, n - 1)
    else:
        ends = np.append(np.flatnonzero((tokens[:-1] == eos) & (tokens[1:] == bos)), n - 1)
    return np.diff(np.concatenate([[-1], ends])).astype(np.int32)


def padded_doc_lens(lengths: np.ndarray, width: int) -> np.ndarray:
    """Segment lengths in a fixed (width,) int32 row, zeros after the last (segments <= tokens)."""
    out = np.zeros(width, dtype=np.int32)
    out[: len(lengths)] = lengths
    return out


# -- the packed source ----------------------------------------------------------------------------


def fingerprint(
    tok: TokenizerFields,
    seq_len: int,
    long_doc_strategy: str,
    group_size: int,
    paths: Sequence[str],
    sizes: Sequence[int],
    metadata_digests: Sequence[tuple[str, str]],
    use_array_if_local: Optional[bool] = None,
) -> str:
    """3.0.0's `NumpyPackedFSLDataset.fingerprint` (fingerprint version v2.0)."""
    fields = [
        ("vocab_size", tok.vocab_size),
        ("pad_token_id", tok.pad_token_id),
        ("eos_token_id", tok.eos_token_id),
        ("dtype", tok.dtype),
        ("long_doc_strategy", long_doc_strategy),
        ("bos_token_id", tok.bos_token_id),
        ("sequence_length", seq_len),
    ]
    if group_size > 1:
        fields.append(("source_group_size", group_size))
    if use_array_if_local is not None:
        fields.append(("use_array_if_local", use_array_if_local))
    if metadata_digests:
        fields.append(("_metadata_fingerprint", tuple(metadata_digests)))
    return dataset_fingerprint("NumpyPackedFSLDataset", fields, paths, sizes)


@dataclass(frozen=True)
class GroupTask:
    """What packing one group takes, and all that is pickled to the process that packs it: that
    group's files and metadata only, so a task's size does not grow with the rest of the mix."""

    paths: tuple[str, ...]
    sizes: tuple[int, ...]
    metadata: tuple[Optional[bytes], ...]  # per file: its .csv.gz when boundaries come from it, else None
    seq_len: int
    tokenizer: TokenizerFields
    long_doc_strategy: str
    out: Path


def build_group(task: GroupTask) -> None:
    """Pack one group and write its index file (layout: module doc)."""
    tok = task.tokenizer
    files = TokenSource(task.paths, task.seq_len, tok, sizes=task.sizes, check=False)
    itemsize = np.dtype(tok.dtype).itemsize
    spans, base = [], 0
    for fi, raw in enumerate(task.metadata):
        n = task.sizes[fi] // itemsize
        if raw is not None:
            file_spans = metadata_spans(raw, task.paths[fi], n)
        else:
            file_spans = eos_spans(
                lambda s, c, fi=fi: files.read_tokens(fi, s, c), n, tok.eos_token_id, tok.bos_token_id
            )
        spans.append(file_spans + base)
        base += n
    capped = cap_long_documents(np.concatenate(spans), task.seq_len, task.long_doc_strategy)
    offsets, packed = pack_spans(capped, task.seq_len)
    out = np.concatenate([[len(offsets) - 1, len(packed)], offsets, packed.reshape(-1)]).astype(np.int64)
    tmp = task.out.with_name(f"{task.out.name}.{os.getpid()}.tmp")
    out.tofile(tmp)
    os.replace(tmp, task.out)


class PackedSource:
    """Random access to the OBFD-packed instances of a list of token files (see the module doc).

    The same surface as TokenSource for the loader: len, `[i]` (tokens, (seq_len,)), `fingerprint`,
    `paths`, `sizes`; plus `read(i)` -> (tokens, doc_lens), `locate(i)` -> (group, bin) and, with
    `label_mask_paths` (one bool file per token file, as 3.0.0's `label_mask_paths`), `label_mask(i)`.
    `use_array_if_local` is 3.0.0's: None or True scan local files for EOS, False reads their `.csv.gz`.
    Picklable: the index files are reopened as memory maps in each process.
    """

    def __init__(
        self,
        paths: Sequence[str],
        seq_len: int,
        tokenizer: TokenizerFields,
        work_dir: str | Path,
        long_doc_strategy: str = "truncate",
        group_size: int = 1,
        sizes: Optional[Sequence[int]] = None,
        check: bool = True,
        label_mask_paths: Optional[Sequence[str]] = None,
        use_array_if_local: Optional[bool] = None,
    ):
        if long_doc_strategy not in LONG_DOC_STRATEGIES:
            raise DataSourceError(f"long_doc_strategy {long_doc_strategy!r} is not one of {LONG_DOC_STRATEGIES}")
        if group_size < 1:
            raise DataSourceError(f"source_group_size must be >= 1, got {group_size}")
        if seq_len < 1 or seq_len & (seq_len - 1):  # the config refuses it first; this guards direct use
            raise DataSourceError(
                f"OBFD packing needs a power-of-2 sequence length, as OLMo-core 3.0.0's packer asserts; got {seq_len}"
            )
        self.files = TokenSource(paths, seq_len, tokenizer, sizes=sizes, check=check)
        self.paths, self.sizes = self.files.paths, self.files.sizes
        self.seq_len, self.tokenizer = seq_len, tokenizer
        self.long_doc_strategy, self.group_size = long_doc_strategy, group_size
        itemsize = np.dtype(tokenizer.dtype).itemsize
        self.tokens = [s // itemsize for s in self.sizes]
        self.label_mask_paths = None if label_mask_paths is None else [str(p) for p in label_mask_paths]
        if self.label_mask_paths is not None:
            self._check_label_masks()
        self.groups = [
            list(range(i, min(i + group_size, len(self.paths)))) for i in range(0, len(self.paths), group_size)
        ]
        self.use_array_if_local = use_array_if_local
        # 3.0.0's `_packed_from_metadata_boundaries`: a URL always, a local file with use_array_if_local=False
        self.from_metadata = {fi for fi, p in enumerate(self.paths) if is_url(p) or use_array_if_local is False}
        listed = sorted(self.from_metadata)
        meta = dict(zip(listed, fetch_metadata([self.paths[fi] for fi in listed])))
        # Keyed by full path, as 3.0.0's `_metadata_hashes`: files named alike in two directories are two
        # entries, and each group's index name follows its own files' metadata. Only the fingerprint
        # names them by basename, as 3.0.0's `_metadata_fingerprint` does.
        self._digests = {self.paths[fi]: hashlib.sha256(raw).hexdigest() for fi, raw in meta.items()}
        digests = [(os.path.basename(path), digest) for path, digest in self._digests.items()]
        self.fingerprint = fingerprint(
            tokenizer, seq_len, long_doc_strategy, group_size, self.paths, self.sizes, digests, use_array_if_local
        )
        self.index_files = [self._index_file(Path(work_dir), g) for g in range(len(self.groups))]
        self._build_missing(meta)  # the metadata is not kept: only building needs it
        bins = [int(np.fromfile(f, dtype=np.int64, count=1)[0]) for f in self.index_files]
        self.offsets = np.concatenate([[0], np.cumsum(bins)]).astype(np.int64)  # global id of each group's bin 0
        self._open: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __repr__(self) -> str:
        return f"PackedSource(fingerprint={self.fingerprint}, seq_len={self.seq_len})"

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_open": {}}

    def _check_label_masks(self) -> None:
        """One mask file per token file, one byte per token (3.0.0 refuses a size mismatch too)."""
        masks = self.label_mask_paths
        if len(masks) != len(self.paths):
            raise DataSourceError(f"{len(masks)} label mask files for {len(self.paths)} token files")
        for path, mask, n in zip(self.paths, masks, self.tokens):
            size = file_size(mask)
            if size != n:
                raise DataSourceError(f"label mask {mask} has {size} entries for the {n} tokens of {path}")

    # building

    def _index_file(self, work_dir: Path, g: int) -> Path:
        h = hashlib.sha256(INDEX_VERSION.encode())
        tok = self.tokenizer
        h.update(f"{self.seq_len},{self.long_doc_strategy},{tok.eos_token_id},{tok.bos_token_id},{tok.dtype}".encode())
        if self.use_array_if_local is not None:  # only when set, as 3.0.0 keys its caches: old indexes stay valid
            h.update(f",use_array_if_local={self.use_array_if_local}".encode())
        for fi in self.groups[g]:
            h.update(f"|{self.paths[fi]},{self.sizes[fi]},{self._digests.get(self.paths[fi])}".encode())
        return work_dir / "packing" / f"obfd-{self.seq_len}-{h.hexdigest()[:32]}.i64"

    def _build_missing(self, meta: dict[int, bytes]) -> None:
        missing = [g for g, f in enumerate(self.index_files) if not f.is_file()]
        if not missing:
            return
        lock_dir = self.index_files[0].parent
        lock_dir.mkdir(parents=True, exist_ok=True)
        with open(lock_dir / "build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the host's other processes wait here, then reuse
            missing = [g for g in missing if not self.index_files[g].is_file()]
            tokens = sum(self.tokens[fi] for g in missing for fi in self.groups[g])
            workers = min(len(missing), os.cpu_count() or 1, 16)
            log.info("packing %d group(s), %d tokens, into %s", len(missing), tokens, lock_dir)
            tasks = [self._task(g, meta) for g in missing]
            if workers > 1 and tokens > _POOL_MIN_TOKENS:
                with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
                    list(pool.map(build_group, tasks))
            else:
                for task in tasks:
                    build_group(task)

    def _task(self, g: int, meta: dict[int, bytes]) -> GroupTask:
        files = self.groups[g]
        return GroupTask(
            paths=tuple(self.paths[fi] for fi in files),
            sizes=tuple(self.sizes[fi] for fi in files),
            metadata=tuple(meta.get(fi) for fi in files),
            seq_len=self.seq_len,
            tokenizer=self.tokenizer,
            long_doc_strategy=self.long_doc_strategy,
            out=self.index_files[g],
        )

    # reading

    def _index(self, g: int) -> np.ndarray:
        if g not in self._open:
            self._open[g] = np.memmap(self.index_files[g], dtype=np.int64, mode="r")
        return self._open[g]

    def locate(self, index: int) -> tuple[int, int]:
        """(group, bin within the group) of global instance `index`."""
        if not 0 <= index < len(self):
            raise IndexError(f"instance {index} out of range for {len(self)} instances")
        g = int(np.searchsorted(self.offsets, index, side="right")) - 1
        return g, int(index - self.offsets[g])

    def documents(self, index: int) -> list[tuple[int, int, int]]:
        """(file index, start, end) token spans of the documents of instance `index`, in instance order."""
        g, b = self.locate(int(index))
        idx = self._index(g)
        n_bins = int(idx[0])
        lo, hi = int(idx[2 + b]), int(idx[3 + b])
        spans = np.asarray(idx[3 + n_bins + 2 * lo : 3 + n_bins + 2 * hi]).reshape(-1, 2)
        files = self.groups[g]
        starts = np.cumsum([0] + [self.tokens[fi] for fi in files])
        which = np.searchsorted(starts, spans[:, 0], side="right") - 1
        return [(files[w], int(s - starts[w]), int(e - starts[w])) for w, (s, e) in zip(which, spans)]

    def __getitem__(self, index: int) -> np.ndarray:
        return self.read(index)[0]

    def label_mask(self, index: int) -> np.ndarray:
        """(seq_len,) bool: the label masks of instance `index`'s documents, False over the padding
        (3.0.0's packed `label_mask` with `label_mask_paths`)."""
        if self.label_mask_paths is None:
            raise DataSourceError("this packed source has no label masks (data.label_masks=false)")
        out = np.zeros(self.seq_len, dtype=np.bool_)
        at = 0
        for fi, s, e in self.documents(index):
            out[at : at + e - s] = read_array(self.label_mask_paths[fi], np.bool_, s, e - s, "label masks")
            at += e - s
        return out

    def read(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens (seq_len,), 3.0.0's doc_lens) of instance `index`."""
        docs = self.documents(index)
        parts = [self.files.read_tokens(fi, s, e - s) for fi, s, e in docs]
        real = sum(len(p) for p in parts)
        pad = np.full(self.seq_len - real, self.tokenizer.pad_token_id, dtype=self.files.dtype)
        tokens = np.concatenate(parts + [pad])
        eos, bos = self.tokenizer.eos_token_id, self.tokenizer.bos_token_id
        group = self.groups[self.locate(int(index))[0]]
        if not any(fi in self.from_metadata for fi in group):
            return tokens, doc_lengths(tokens, eos, bos)
        # A group with a file read through its metadata takes its boundaries from it: a document need not end in
        # EOS, so every instance of the group gets its lengths from the spans (3.0.0 decides per group,
        # not per instance); the padding is scanned as 3.0.0 scans it.
        lens = [e - s for _, s, e in docs]
        padding = self.seq_len - real
        if padding:
            if bos is None:
                lens.extend(doc_lengths(tokens[-padding:], eos).tolist())
            else:
                tail = doc_lengths(tokens[-padding - 1 :], eos, bos).tolist()
                lens[-1] += tail[0] - 1
                lens.extend(tail[1:])
        return tokens, np.asarray(lens, dtype=np.int32)
