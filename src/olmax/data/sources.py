"""Token shard files -> fixed-length instances, exactly as OLMo-core's `NumpyFSLDataset` cuts them.

Sources (`resolve_paths`): explicit shard paths or URLs, globs (sorted, per pattern), a directory
written by `olmax tokenize` (its manifest lists the shards), an OLMo-core mix file
(`label,relative/path/with/{TOKENIZER}/000000.npy` per line, always a `.txt`) joined to a base that is
a local directory, `gs://` or `http(s)://`, or local jsonl text (`.jsonl`, `.jsonl.gz`, `.jsonl.zst`,
one `text` field a line), tokenized with data.tokenizer into the cache on first use by the code of
`olmax tokenize` (olmax.data.tokenize.cached_text), as eval.data's text is. Remote files are read by
byte range through fsspec; nothing downloads a whole shard.

A token file is checked when it is opened: not empty, no .npy header, a whole number of tokens, ids
within the vocabulary in its first 4096 tokens, and not text (`looks_like_text`): a jsonl or plain text
given as tokens is refused as text rather than as a size or an id that happens not to fit.

Instances (`TokenSource`): each file is cut on its own into `seq_len`-token instances, the remainder
of a file is dropped, and global instance ids run file by file. With `max_target_seq_len` (OLMo-core's
`max_target_sequence_length`, a multiple of seq_len) a file yields
`floor(tokens / max_target) * (max_target / seq_len)` instances, so a later, longer sequence length
sees the same token boundaries.

The fingerprint is OLMo-core's (`NumpyDatasetBase.fingerprint` for `NumpyFSLDataset`): sha256 over
`class=NumpyFSLDataset`, the fields `vocab_size, pad_token_id, eos_token_id, dtype,
max_target_sequence_length, bos_token_id` as `name=value,`, then `path=<basename>,size=<bytes>,`
per file. Equal fingerprints mean equal instance ids and order for the same seed and batch size.
"""

from __future__ import annotations

import glob as globlib
import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from olmax.data.demo import demo_shards, is_demo_spec
from olmax.data.tokenize import MANIFEST, cached_text, is_text, read_manifest
from olmax.data.tokenizer import TokenizerFields

NPY_MAGIC = b"\x93NUMPY"
SAMPLE_TOKENS = 4096  # ids checked against the vocabulary when a file is opened
DOLMA3_TOKENIZER_DIR = "allenai/dolma3-tokenizer"  # what `{TOKENIZER}` means in OLMo 3's mixes


class DataSourceError(ValueError):
    """A data file or source description that cannot be used; the message names it."""


class RemoteReadError(DataSourceError):
    """A remote read that failed in a way that a later attempt may not (a server error, a timeout, a
    dropped connection), unlike a file that does not exist: `olmax train` exits TRANSIENT on it."""


def is_url(path: str) -> bool:
    return "://" in path


# -- resolving source specs -----------------------------------------------------------------------


def read_mix_file(path: str, base: Optional[str], tokenizer_dir: str = DOLMA3_TOKENIZER_DIR) -> list[str]:
    """The shard URLs/paths of an OLMo-core mix file, in file order."""
    if base is None:
        raise DataSourceError(f"mix file {path} needs a base (data.mix_base: a directory, gs:// or http(s)://)")
    base = base if base.endswith("/") else base + "/"
    paths = []
    for line_no, line in enumerate(_read_text(path).splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(",")
        if len(parts) != 2 or "{TOKENIZER}" not in parts[1]:
            raise DataSourceError(
                f"mix file {path} line {line_no}: expected `label,relative/path/{{TOKENIZER}}/...`, got "
                f"{line[:80]!r} (a .txt in data.paths is an OLMo-core mix file; plain text goes in as .jsonl with "
                "a `text` field, tokenized on first use, or through `olmax tokenize FILE.txt --out DIR` and DIR)"
            )
        paths.append(base + parts[1].replace("{TOKENIZER}", tokenizer_dir))
    if not paths:
        raise DataSourceError(f"mix file {path} lists no files")
    return paths


def _read_text(path: str) -> str:
    if is_url(path):
        from olmax.extras import url_to_fs

        fs, p = url_to_fs(path)
        try:
            with fs.open(p, "rt") as f:
                return f.read()
        except Exception as exc:  # noqa: BLE001 -- see remote_error
            raise remote_error(f"mix file {path}", exc) from exc
    if not Path(path).is_file():
        raise DataSourceError(f"mix file {path} does not exist")
    return Path(path).read_text()


def _glob(pattern: str) -> list[str]:
    if is_url(pattern):
        from olmax.extras import url_to_fs

        fs, fs_pattern = url_to_fs(pattern)
        matches = [fs.unstrip_protocol(m) for m in fs.glob(fs_pattern)]
    else:
        matches = [m for m in globlib.glob(pattern, recursive=True) if os.path.isfile(m)]
    if not matches:
        raise DataSourceError(f"pattern {pattern} matched no files")
    return sorted(matches)


def resolve_paths(
    specs: Sequence[str],
    mix_base: Optional[str] = None,
    tokenizer_dir: str = DOLMA3_TOKENIZER_DIR,
    cache_dir: Optional[str | Path] = None,
    tokenizer: str = "dolma2",
    tok: Optional[TokenizerFields] = None,
) -> list[str]:
    """Expand shard paths, globs, manifest directories, mix files (`*.txt`), jsonl text (tokenized with
    `tokenizer`) and the demo corpus (`demo`, `demo:heldout`) into shard paths; text is tokenized into
    `cache_dir` on first use. With `tok`, every `olmax tokenize` folder, given or made from text, must
    have been made with that tokenizer."""
    if not specs:
        raise DataSourceError("no data paths given (data.paths is empty)")
    paths: list[str] = []
    for spec in specs:
        spec = str(spec)
        if is_demo_spec(spec):
            if cache_dir is None:
                raise DataSourceError(f"data path {spec!r} needs a cache directory to tokenize into")
            paths.extend(demo_shards(spec, cache_dir))
        elif "*" in spec:
            for match in _glob(spec):
                paths.extend(text_shards(match, cache_dir, tokenizer, tok) if is_text(match) else [match])
        elif is_text(spec):
            paths.extend(text_shards(spec, cache_dir, tokenizer, tok))
        elif spec.endswith(".txt"):
            paths.extend(read_mix_file(spec, mix_base, tokenizer_dir))
        elif not is_url(spec) and Path(spec).is_dir():
            manifest = read_manifest(spec)
            if tok is not None:
                check_made_with(spec, manifest, tok)
            paths.extend(str(Path(spec) / s["path"]) for s in manifest["shards"])
        else:
            paths.append(spec)
    return paths


def text_shards(
    path: str, cache_dir: Optional[str | Path], tokenizer: str, tok: Optional[TokenizerFields]
) -> list[str]:
    """The token shards of a local jsonl text file, tokenized into `cache_dir` on first use."""
    if is_url(path):
        raise DataSourceError(
            f"data path {path}: text is tokenized on first use from a local file only; tokenize it with "
            "`olmax tokenize` and give the output folder (or give a local copy)"
        )
    if not Path(path).is_file():
        raise DataSourceError(f"data file {path} does not exist")
    if cache_dir is None:
        raise DataSourceError(f"data path {path!r} needs a cache directory to tokenize into")
    folder = cached_text(path, cache_dir, tokenizer)
    manifest = read_manifest(folder)
    if tok is not None:
        check_made_with(f"{path} (data.tokenizer={tokenizer})", manifest, tok)
    return [str(folder / s["path"]) for s in manifest["shards"]]


def check_made_with(what: str, manifest: dict, tok: TokenizerFields) -> None:
    """Refuse `olmax tokenize` output (`what`, its manifest) made with another tokenizer than the
    configured one."""
    made = manifest["tokenizer"]
    for field in ("vocab_size", "eos_token_id", "pad_token_id", "bos_token_id"):
        if made.get(field) != getattr(tok, field):
            raise DataSourceError(
                f"{what} was tokenized with {made.get('name')} ({field}={made.get(field)}), but the data "
                f"config says {field}={getattr(tok, field)}"
            )


def check_manifest_tokenizers(specs: Sequence[str], tok: TokenizerFields) -> None:
    """Refuse the `olmax tokenize` folders among `specs` made with another tokenizer than the configured one."""
    for spec in specs:
        if not is_url(str(spec)) and (Path(spec) / MANIFEST).is_file():
            check_made_with(str(spec), read_manifest(spec), tok)


# -- reading files --------------------------------------------------------------------------------


def file_size(path: str) -> int:
    if is_url(path):
        from olmax.extras import url_to_fs

        fs, p = url_to_fs(path)
        try:
            size = fs.size(p)
        except Exception as exc:  # noqa: BLE001 -- see remote_error
            raise remote_error(f"data file {path}", exc) from exc
        if size is None:
            raise DataSourceError(f"data file {path}: the server gives no size (no Content-Length)")
        return int(size)
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        raise DataSourceError(f"data file {path} does not exist") from None


def read_bytes(path: str, start: int, length: int) -> bytes:
    """`length` bytes from byte `start` of a local file or a URL (a range request, never the whole file)."""
    if is_url(path):
        from olmax.extras import url_to_fs

        fs, p = url_to_fs(path)
        try:
            data = fs.cat_file(p, start=start, end=start + length)
        except Exception as exc:  # noqa: BLE001 -- see remote_error
            raise remote_error(f"data file {path} (bytes {start}..{start + length})", exc) from exc
        # fsspec's HTTP backend returns whatever body comes back: a server that ignores `Range`
        # answers 200 with the whole file, which must not be taken for the requested instance.
        if len(data) != length:
            raise DataSourceError(
                f"data file {path}: asked for {length} bytes at {start}, got {len(data)} (a server that "
                "ignores HTTP Range requests, or a file that changed size)"
            )
        return data
    with open(path, "rb") as f:
        f.seek(start)
        return f.read(length)


def read_array(path: str, dtype, start: int, count: int, what: str) -> np.ndarray:
    """`count` items of `dtype` from item `start` of a raw array file (local: pread into a fresh buffer;
    a URL: one range request); `what` names the items in the error of a file that ends early."""
    if is_url(path):
        itemsize = np.dtype(dtype).itemsize
        return np.frombuffer(read_bytes(path, start * itemsize, count * itemsize), dtype=dtype)
    out = np.empty(count, dtype=dtype)
    fd = os.open(path, os.O_RDONLY)
    try:
        got = os.preadv(fd, [out], start * out.itemsize)
    finally:
        os.close(fd)
    if got != out.nbytes:
        raise DataSourceError(
            f"data file {path} ended {out.nbytes - got} bytes early reading {what} "
            f"{start}..{start + count} (truncated after it was indexed?)"
        )
    return out


def looks_like_text(head: bytes) -> Optional[str]:
    """The first characters of `head` (a file's first bytes) when they read as text: UTF-8 with no NUL
    byte, every character printable or a line break or tab; None otherwise. No token file does: a uint32
    id below 2^24 has a zero byte, and a uint16 id below 0x2000 (most of a text's tokens) a control byte."""
    sample = head[:1024]
    if not sample or b"\0" in sample:
        return None
    try:
        text = sample.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(sample) - 3:  # invalid, not a character cut at the sample's end
            return None
        text = sample[: e.start].decode("utf-8")
    return text[:60] if all(c.isprintable() or c in "\t\n\r" for c in text) else None


TOKEN_PART_PREFIX = "token_ids_part_"  # AI2's SFT layout (open-instruct's convert_sft_data_for_olmocore.py)
MASK_PART_PREFIX = "labels_mask_part_"


def label_mask_paths(paths: Sequence[str]) -> list[str]:
    """The label mask beside each token file in AI2's SFT layout: `labels_mask_part_N.npy` for
    `token_ids_part_N.npy`, in the same directory (what OLMo-core's SFT script pairs by globbing both)."""
    out = []
    for path in paths:
        head, sep, base = str(path).rpartition("/")
        if not base.startswith(TOKEN_PART_PREFIX):
            raise DataSourceError(
                f"data.label_masks: {path} is not named {TOKEN_PART_PREFIX}N.npy, so it has no "
                f"{MASK_PART_PREFIX}N.npy beside it (the layout `olmax tokenize --chat` and AI2 write)"
            )
        out.append(head + sep + MASK_PART_PREFIX + base[len(TOKEN_PART_PREFIX) :])
    return out


def remote_error(what: str, exc: Exception) -> DataSourceError:
    """A remote read failure as a DataSourceError naming the URL and the cause: a missing file is
    a DataSourceError, anything else (5xx, a timeout, a reset connection) a RemoteReadError.

    fsspec backends raise their own types (aiohttp's ClientResponseError, gcsfs's HttpError, ...), and
    its HTTP backend turns every failed HEAD/GET of a size lookup, 404 or 500 alike, into
    FileNotFoundError(url) with the HTTP error as its cause; the message keeps that cause.
    """
    cause = exc.__cause__ if isinstance(exc, FileNotFoundError) and exc.__cause__ else exc
    status = getattr(cause, "status", None) or getattr(cause, "code", None)
    if status == 404 or (isinstance(cause, FileNotFoundError) and status is None):
        return DataSourceError(f"{what} does not exist")
    if status in (401, 403):  # credentials or permissions: no retry fixes them
        return DataSourceError(f"{what} cannot be read (HTTP {status}: not allowed): {cause}")
    return RemoteReadError(f"{what} cannot be read: {type(cause).__name__}: {cause}")


def fingerprint(
    tok: TokenizerFields, max_target_seq_len: Optional[int], paths: Sequence[str], sizes: Sequence[int]
) -> str:
    """OLMo-core's `NumpyFSLDataset.fingerprint` (fingerprint version v2.0)."""
    fields = (
        ("vocab_size", tok.vocab_size),
        ("pad_token_id", tok.pad_token_id),
        ("eos_token_id", tok.eos_token_id),
        ("dtype", tok.dtype),
        ("max_target_sequence_length", max_target_seq_len),
        ("bos_token_id", tok.bos_token_id),
    )
    return dataset_fingerprint("NumpyFSLDataset", fields, paths, sizes)


def dataset_fingerprint(
    dataset_class: str, fields: Sequence[tuple[str, object]], paths: Sequence[str], sizes: Sequence[int]
) -> str:
    """How OLMo-core fingerprints its numpy datasets: sha256 over `class=NAME`, then `name=value,` per
    field, then `path=<basename>,size=<bytes>,` per file in order."""
    h = hashlib.sha256(f"class={dataset_class}".encode())
    for name, value in fields:
        h.update(f"{name}={value},".encode())
    for path, size in zip(paths, sizes):
        h.update(f"path={os.path.basename(path)},size={size},".encode())
    return h.hexdigest()


class TokenSource:
    """Random access to the fixed-length instances of a list of token files.

    Local files are read with pread into a fresh buffer, opened per read: no memory map, whose
    touched pages would count in the process's RSS as the dataset grows
    (docs/performance/checkpoint-and-loader.md, "Data loader"), and no open descriptors to run out of
    with thousands of shards. Picklable (it holds no open files), so Grain workers can hold it. `repr`
    is stable (it is the fingerprint), as Grain's state check requires.
    """

    def __init__(
        self,
        paths: Sequence[str],
        seq_len: int,
        tokenizer: TokenizerFields,
        max_target_seq_len: Optional[int] = None,
        sizes: Optional[Sequence[int]] = None,
        check: bool = True,
    ):
        if not paths:
            raise DataSourceError("no data files")
        if seq_len <= 0:
            raise DataSourceError(f"seq_len must be positive, got {seq_len}")
        if max_target_seq_len is not None and (max_target_seq_len < seq_len or max_target_seq_len % seq_len):
            raise DataSourceError(f"max_target_seq_len={max_target_seq_len} must be a multiple of seq_len={seq_len}")
        self.paths = [str(p) for p in paths]
        self.seq_len = seq_len
        self.tokenizer = tokenizer
        self.dtype = tokenizer.dtype
        self.max_target_seq_len = max_target_seq_len
        with ThreadPoolExecutor(8) as pool:
            self.sizes = list(sizes) if sizes is not None else list(pool.map(file_size, self.paths))
            if check:
                list(pool.map(self._check_file, range(len(self.paths))))
        itemsize = np.dtype(self.dtype).itemsize
        counts = []
        for _path, size in zip(self.paths, self.sizes):
            n_tokens = size // itemsize
            if max_target_seq_len is None or max_target_seq_len == seq_len:
                counts.append(n_tokens // seq_len)
            else:
                counts.append((n_tokens // max_target_seq_len) * (max_target_seq_len // seq_len))
        self.instances_per_file = np.asarray(counts, dtype=np.int64)
        self.offsets = np.concatenate(
            [[0], np.cumsum(self.instances_per_file)]
        )  # global id of each file's first instance
        self.fingerprint = fingerprint(tokenizer, max_target_seq_len, self.paths, self.sizes)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __repr__(self) -> str:
        return f"TokenSource(fingerprint={self.fingerprint}, seq_len={self.seq_len})"

    def locate(self, index: int) -> tuple[int, int]:
        """(file index, token offset within the file) of global instance `index`."""
        if not 0 <= index < len(self):
            raise IndexError(f"instance {index} out of range for {len(self)} instances")
        fi = int(np.searchsorted(self.offsets, index, side="right")) - 1
        return fi, int(index - self.offsets[fi]) * self.seq_len

    def __getitem__(self, index: int) -> np.ndarray:
        fi, start = self.locate(int(index))
        return self.read_tokens(fi, start, self.seq_len)

    def read_tokens(self, fi: int, start: int, count: int) -> np.ndarray:
        """`count` tokens of file `fi` from token `start`."""
        return read_array(self.paths[fi], self.dtype, start, count, "tokens")

    def _check_file(self, fi: int) -> None:
        path, size = self.paths[fi], self.sizes[fi]
        itemsize = np.dtype(self.dtype).itemsize
        if size == 0:
            raise DataSourceError(f"data file {path} is empty")
        head = read_bytes(path, 0, min(size, SAMPLE_TOKENS * itemsize))
        # uint8 ids (a vocabulary of at most 256, byte-level) may be text's own bytes: not checked
        text = looks_like_text(head) if itemsize > 1 else None
        if text is not None:
            raise DataSourceError(
                f"data file {path}: this looks like text: {text!r}; data.paths reads token files (jsonl text "
                "goes in as .jsonl, .jsonl.gz or .jsonl.zst, tokenized on first use; other text through "
                "`olmax tokenize`)"
            )
        if head.startswith(NPY_MAGIC):
            raise DataSourceError(
                f"data file {path} is a .npy file with a header; olmax and OLMo-core read raw, headerless "
                "token arrays (write them with ndarray.tofile or `olmax tokenize`)"
            )
        if size % itemsize:
            raise DataSourceError(
                f"data file {path}: {size} bytes is not a multiple of the {np.dtype(self.dtype).name} "
                f"item size {itemsize} (wrong dtype for vocab size {self.tokenizer.vocab_size}, or a truncated file)"
            )
        sample = np.frombuffer(head[: len(head) - len(head) % itemsize], dtype=self.dtype)
        self._check_ids(fi, sample, 0)

    def _check_ids(self, fi: int, ids: np.ndarray, first: int) -> None:
        bad = np.flatnonzero(ids >= self.tokenizer.vocab_size)
        if bad.size:
            pos = first + int(bad[0])
            raise DataSourceError(
                f"data file {self.paths[fi]}: token {int(ids[bad[0]])} at position {pos} is >= the vocab "
                f"size {self.tokenizer.vocab_size} (wrong tokenizer or dtype?)"
            )

    def check_all(self, block_tokens: int = 1 << 24) -> dict:
        """Read every token of every file and check it against the vocabulary (`olmax data check`)."""
        total = 0
        for fi, size in enumerate(self.sizes):
            n = size // np.dtype(self.dtype).itemsize
            for start in range(0, n, block_tokens):
                ids = self.read_tokens(fi, start, min(block_tokens, n - start))
                self._check_ids(fi, ids, start)
            total += n
        return {"files": len(self.paths), "tokens": total, "instances": len(self), "fingerprint": self.fingerprint}
