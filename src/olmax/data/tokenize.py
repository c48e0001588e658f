"""Raw text -> token shards + manifest, in the layout OLMo-core reads.

Inputs are .jsonl / .jsonl.gz / .jsonl.zst files (one JSON object per line with a `text` field) or
.txt files (the whole file is one document). Every document is encoded and followed by EOS; the
token stream is cut into shards of about `shard_tokens` tokens, always at a document boundary (a
shard closes after the document that reaches the target). Shards are raw, headerless arrays named
`000000.npy`, ... (the suffix is OLMo's convention; there is no .npy header) in the tokenizer's dtype.

Resumable and atomic: a shard is written to `NAME.tmp` and renamed only when complete, then
`progress.json` records it together with the input position of the next document. A rerun with the
same inputs, tokenizer and shard size continues from there and produces byte-identical shards; a
rerun with different settings into the same directory is refused. `manifest.json` appears last,
when everything is done.

Workers: documents are read in the main process, encoded in a pool of `workers` processes (batches
of lines, results consumed in order, at most a few batches in flight) and written by the main process.

On first use (`cached_text`): jsonl text named in data.paths or eval.data is tokenized by this code
into the olmax cache, in a folder keyed by the file's content and the tokenizer, and read from there
as any `olmax tokenize` output (olmax.data.sources); the shipped demo corpus likewise (olmax.data.demo).
"""

from __future__ import annotations

import collections
import gzip
import hashlib
import io
import json
import os
import re
import shutil
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import BinaryIO, Iterator, Optional, Sequence

import numpy as np

from olmax.data.tokenizer import Encoder, load_tokenizer

MANIFEST = "manifest.json"
PROGRESS = "progress.json"
FORMAT = "olmax-tokens-v1"
DEFAULT_SHARD_TOKENS = 1 << 26  # 64 Mi tokens: 256 MiB per uint32 shard
_LINES_PER_BATCH = 512
# Text that data.paths and eval.data take as it is (tokenized on first use); a .txt there is an OLMo-core
# mix file, so plain text goes through `olmax tokenize` (which takes it as one document) or into jsonl.
TEXT_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")
_SUFFIXES = (*TEXT_SUFFIXES, ".txt")


class TokenizeError(ValueError):
    """Bad input to the tokenizer, named by file (and line)."""


def shard_name(index: int) -> str:
    return f"{index:06d}.npy"


# -- reading inputs -------------------------------------------------------------------------------


def _check_input(path: Path) -> None:
    if not path.is_file():
        raise TokenizeError(f"input {path} does not exist")
    if not path.name.endswith(_SUFFIXES):
        raise TokenizeError(f"input {path}: unsupported file type (expected one of {', '.join(_SUFFIXES)})")


def _open_decompressed(raw: BinaryIO, path: Path) -> BinaryIO:
    if path.name.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw)
    if path.name.endswith(".zst"):
        import zstandard

        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw))
    return raw


@dataclass
class _Batch:
    file_index: int
    first_line: int  # 0-based line number of lines[0] within its file
    lines: list[bytes]
    is_text_file: bool


def _read_batches(inputs: Sequence[Path], start: tuple[int, int], on_bytes) -> Iterator[_Batch]:
    """Batches of raw lines from `start` = (file index, line) on; `on_bytes(n)` reports raw bytes read."""
    for fi in range(start[0], len(inputs)):
        path = inputs[fi]
        first = start[1] if fi == start[0] else 0
        with open(path, "rb") as raw:
            if path.name.endswith(".txt"):
                if first == 0:
                    yield _Batch(fi, 0, [raw.read()], True)
                on_bytes(path.stat().st_size)
                continue
            stream = _open_decompressed(raw, path)
            pos = raw.tell()
            batch: list[bytes] = []
            batch_start = first
            for line_no, line in enumerate(stream):
                if line_no < first:
                    continue
                batch.append(line)
                if len(batch) == _LINES_PER_BATCH:
                    yield _Batch(fi, batch_start, batch, False)
                    batch, batch_start = [], line_no + 1
                    on_bytes(raw.tell() - pos)
                    pos = raw.tell()
            if batch:
                yield _Batch(fi, batch_start, batch, False)
            on_bytes(path.stat().st_size - pos)


# -- encoding (runs in the worker processes) --------------------------------------------------------

_ENCODER: Optional[Encoder] = None


def _init_worker(tokenizer_spec: str) -> None:
    global _ENCODER
    _ENCODER = load_tokenizer(tokenizer_spec)


@dataclass
class _Encoded:
    tokens: np.ndarray  # all documents of the batch, each followed by EOS
    doc_ends: np.ndarray  # cumulative token count after each document
    next_lines: np.ndarray  # for each document, the line number that follows it


def _encode_batch(batch: _Batch, source_name: str) -> _Encoded:
    assert _ENCODER is not None
    eos = _ENCODER.info.eos_token_id
    dtype = _ENCODER.info.dtype
    pieces, ends, next_lines, total = [], [], [], 0
    for k, line in enumerate(batch.lines):
        line_no = batch.first_line + k
        if batch.is_text_file:
            text = line.decode("utf-8", errors="replace")
        else:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise TokenizeError(f"{source_name} line {line_no + 1}: not valid JSON ({e.msg})") from None
            text = record.get("text") if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise TokenizeError(f"{source_name} line {line_no + 1}: no string `text` field")
        if not text:
            continue
        ids = _ENCODER.encode(text)
        ids.append(eos)
        pieces.append(np.asarray(ids, dtype=dtype))
        total += len(ids)
        ends.append(total)
        next_lines.append(line_no + 1)
    tokens = np.concatenate(pieces) if pieces else np.zeros(0, dtype=dtype)
    return _Encoded(tokens, np.asarray(ends, dtype=np.int64), np.asarray(next_lines, dtype=np.int64))


# -- writing shards --------------------------------------------------------------------------------


def _write_atomic_json(path: Path, payload: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1) + "\n")
    os.replace(tmp, path)


class _ShardWriter:
    """Collects whole documents and writes a shard (tmp file, fsync, rename) once it is full."""

    def __init__(self, out_dir: Path, shard_tokens: int, progress: dict):
        self.out_dir = out_dir
        self.shard_tokens = shard_tokens
        self.progress = progress
        self.pending: list[np.ndarray] = []
        self.pending_tokens = 0
        self.pending_docs = 0
        self.counts = [list(c) for c in progress["source_counts"]]  # [docs, tokens] per input
        self.position = tuple(progress["next"])

    def add(self, file_index: int, enc: _Encoded) -> None:
        start = 0
        for end, next_line in zip(enc.doc_ends.tolist(), enc.next_lines.tolist()):
            self.pending.append(enc.tokens[start:end])
            self.pending_tokens += end - start
            self.pending_docs += 1
            self.counts[file_index][0] += 1
            self.counts[file_index][1] += end - start
            self.position = (file_index, next_line)
            start = end
            if self.pending_tokens >= self.shard_tokens:
                self.flush()

    def end_of_file(self, file_index: int) -> None:
        """A file is read to its end: the next document starts the next file."""
        if self.position[0] <= file_index:
            self.position = (file_index + 1, 0)

    def flush(self) -> None:
        if not self.pending_tokens:
            self._commit()  # only the position moved (e.g. trailing empty documents)
            return
        name = shard_name(len(self.progress["shards"]))
        tmp = self.out_dir / (name + ".tmp")
        digest = hashlib.sha256()
        with open(tmp, "wb") as f:
            for piece in self.pending:
                data = piece.tobytes()
                digest.update(data)
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.out_dir / name)
        self.progress["shards"].append(
            {"path": name, "tokens": self.pending_tokens, "documents": self.pending_docs, "sha256": digest.hexdigest()}
        )
        self.pending, self.pending_tokens, self.pending_docs = [], 0, 0
        self._commit()

    def _commit(self) -> None:
        self.progress["next"] = list(self.position)
        self.progress["source_counts"] = [list(c) for c in self.counts]
        _write_atomic_json(self.out_dir / PROGRESS, self.progress)


def _run_config(inputs: Sequence[Path], info: dict, shard_tokens: int) -> dict:
    return {
        "format": FORMAT,
        "tokenizer": info,
        "shard_tokens": shard_tokens,
        "inputs": [{"path": str(p.resolve()), "bytes": p.stat().st_size} for p in inputs],
    }


def _describe_change(old: dict, new: dict) -> str:
    for key in ("tokenizer", "shard_tokens", "inputs"):
        if old.get(key) != new.get(key):
            return f"{key} changed"
    return "format changed"


def tokenize_files(
    inputs: Sequence[str | Path],
    out_dir: str | Path,
    tokenizer: str = "dolma2",
    workers: int = 0,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    show_progress: bool = True,
) -> dict:
    """Tokenize `inputs` into `out_dir`; returns the manifest. Resumes an interrupted run."""
    from tqdm import tqdm

    paths = [Path(p) for p in inputs]
    if not paths:
        raise TokenizeError("no input files given")
    for p in paths:
        _check_input(p)
    if shard_tokens <= 0:
        raise TokenizeError(f"shard_tokens must be positive, got {shard_tokens}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    encoder = load_tokenizer(tokenizer)
    config = _run_config(paths, encoder.info.to_dict(), shard_tokens)

    manifest_path, progress_path = out / MANIFEST, out / PROGRESS
    if manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("config") != config:
            raise TokenizeError(
                f"{out} already holds a finished tokenization with other settings "
                f"({_describe_change(manifest.get('config', {}), config)}); use a new --out"
            )
        return manifest
    if progress_path.is_file():
        progress = json.loads(progress_path.read_text())
        if progress.get("config") != config:
            raise TokenizeError(
                f"{out} holds an interrupted tokenization with other settings "
                f"({_describe_change(progress.get('config', {}), config)}); use a new --out"
            )
    else:
        progress = {"config": config, "shards": [], "next": [0, 0], "source_counts": [[0, 0] for _ in paths]}

    writer = _ShardWriter(out, shard_tokens, progress)
    start = tuple(progress["next"])
    done_bytes = sum(p.stat().st_size for p in paths[: start[0]])
    bar = tqdm(
        total=sum(p.stat().st_size for p in paths),
        initial=done_bytes,
        unit="B",
        unit_scale=True,
        desc="tokenize",
        disable=not show_progress,
    )

    def consume(file_index: int, enc: _Encoded, last_of_file: bool) -> None:
        writer.add(file_index, enc)
        if last_of_file:
            writer.end_of_file(file_index)

    batches = _read_batches(paths, start, bar.update)
    if workers <= 0:
        global _ENCODER
        _ENCODER = encoder
        for batch, last in _mark_last_of_file(batches):
            consume(batch.file_index, _encode_batch(batch, str(paths[batch.file_index])), last)
    else:
        with ProcessPoolExecutor(
            workers, mp_context=get_context("spawn"), initializer=_init_worker, initargs=(tokenizer,)
        ) as pool:
            in_flight: collections.deque = collections.deque()
            for batch, last in _mark_last_of_file(batches):
                name = str(paths[batch.file_index])
                in_flight.append((batch.file_index, last, pool.submit(_encode_batch, batch, name)))
                if len(in_flight) >= 2 * workers + 2:
                    fi, lst, fut = in_flight.popleft()
                    consume(fi, fut.result(), lst)
            while in_flight:
                fi, lst, fut = in_flight.popleft()
                consume(fi, fut.result(), lst)
    writer.flush()
    bar.close()

    manifest = {
        "format": FORMAT,
        "config": config,
        "tokenizer": encoder.info.to_dict(),
        "dtype": np.dtype(encoder.info.dtype).name,
        "shards": progress["shards"],
        "total_tokens": sum(s["tokens"] for s in progress["shards"]),
        "sources": [
            {"path": str(p), "bytes": p.stat().st_size, "documents": d, "tokens": t}
            for p, (d, t) in zip(paths, progress["source_counts"])
        ],
    }
    _write_atomic_json(manifest_path, manifest)
    progress_path.unlink()
    return manifest


def _mark_last_of_file(batches: Iterator[_Batch]) -> Iterator[tuple[_Batch, bool]]:
    """Pairs each batch with whether it is the last one of its file (one batch of lookahead)."""
    prev: Optional[_Batch] = None
    for batch in batches:
        if prev is not None:
            yield prev, prev.file_index != batch.file_index
        prev = batch
    if prev is not None:
        yield prev, True


def read_manifest(directory: str | Path) -> dict:
    """The manifest of a finished tokenization, with a clear error if there is none."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        hint = (
            " (an interrupted run: rerun `olmax tokenize` to finish it)"
            if (Path(directory) / PROGRESS).is_file()
            else ""
        )
        raise TokenizeError(f"{directory} has no {MANIFEST}{hint}")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT:
        raise TokenizeError(f"{path}: unknown format {manifest.get('format')!r}")
    return manifest


def is_text(spec: str) -> bool:
    """Whether a data path names jsonl text (TEXT_SUFFIXES), which is tokenized on first use."""
    return str(spec).endswith(TEXT_SUFFIXES)


def tokenize_once(inputs: Sequence[Path], target: Path, tokenizer: str) -> dict:
    """The manifest of `target`, tokenizing `inputs` into it first unless it holds a finished
    tokenization. Tokenized in a private folder and renamed into place, so concurrent first uses (the
    processes of one host) never see half a folder."""
    if not (target / MANIFEST).is_file():
        tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tokenize_files(inputs, tmp, tokenizer=tokenizer, workers=0, show_progress=False)
        try:
            os.replace(tmp, target)
        except OSError:  # another process finished first
            shutil.rmtree(tmp, ignore_errors=True)
    return read_manifest(target)


def _file_digest(path: Path, h) -> None:
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)


def cached_text(path: str | Path, cache_dir: str | Path, tokenizer: str) -> Path:
    """The `olmax tokenize` folder of the jsonl text file `path`, made in `cache_dir/text/` on first use
    (tokenize_once) and named by the file's content and the tokenizer (its name, and a tokenizer.json's
    content), so a changed file or tokenizer is never read stale."""
    src = Path(path)
    if not src.is_file():
        raise TokenizeError(f"data file {path} does not exist")
    h = hashlib.sha256(f"tokenizer={tokenizer}\n".encode())
    if tokenizer != "dolma2" and Path(tokenizer).is_file():
        _file_digest(Path(tokenizer), h)
    _file_digest(src, h)
    stem = src.name
    for suffix in TEXT_SUFFIXES:
        stem = stem.removesuffix(suffix)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", stem).strip("-.") or "text"
    target = Path(cache_dir) / "text" / f"{name}-{h.hexdigest()[:16]}"
    tokenize_once([src], target, tokenizer)
    return target
