"""`olmax tokenize --chat`: chat rows -> token and label-mask files in the layout OLMo-core's SFT reads.

The files are those AI2's `scripts/data/convert_sft_data_for_olmocore.py` (allenai/open-instruct,
commit 5e5c93d, the version of OLMo 3's release) writes, so either side reads the other's:
- `token_ids_part_NNNN.npy`: the documents' token ids back to back, raw (np.memmap, no .npy header),
  in the tokenizer's dtype (OLMo-core's smallest-unsigned rule: uint32 for dolma2);
- `token_ids_part_NNNN.csv.gz`: one `start,end` line per document, token offsets within the part;
- `labels_mask_part_NNNN.npy`: one np.bool_ byte per token, True where the token is trained on.
OLMo-core 3.0.0 reads them with `NumpyPackedFSLDataset(paths, label_mask_paths=...)`
(olmo_core/data/numpy_dataset.py), with `use_array_if_local=False` when some conversation's documents
are not exactly its EOS-terminated spans (`eos_reading_note`). AI2 cuts a part every 1 GiB of token bytes, even inside a
document; olmax closes a part after the document that reaches `shard_tokens` tokens, so no document
spans two parts. `manifest.json` (olmax's tokenize manifest, so `data.paths` takes the directory) adds
per part its mask file and, under `chat`, the template and the counts of truncated and skipped rows.

Inputs: `.jsonl` / `.jsonl.gz` / `.jsonl.zst` or `.parquet`, one conversation per row: a `messages`
list (SFT) or `chosen` and `rejected` lists (preference). Preference rows go to `chosen/` and
`rejected/`, two such directories whose document i is pair i. A row's numbers and booleans beside its
conversation (a `label`, a `weight`) are kept per document in `item_fields.npz` (olmax.data.item_fields).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path
from typing import Iterator, Optional, Sequence

import numpy as np

from olmax.data.chat import (
    ChatError,
    ChatExample,
    ChatSkip,
    check_chat_tokenizer,
    check_messages,
    preference_examples,
    sft_example,
)
from olmax.data.item_fields import FieldWriter
from olmax.data.sources import MASK_PART_PREFIX, TOKEN_PART_PREFIX, is_url
from olmax.data.tokenize import FORMAT, MANIFEST, TokenizeError, _open_decompressed, read_manifest
from olmax.data.tokenizer import Encoder, TokenizerError, load_tokenizer

TOKENS = TOKEN_PART_PREFIX + "{:04d}.npy"
METADATA = TOKEN_PART_PREFIX + "{:04d}.csv.gz"
MASKS = MASK_PART_PREFIX + "{:04d}.npy"
CHAT_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet")


def chat_rows(path: Path) -> Iterator[tuple[int, dict]]:
    """(1-based row number, row) of a JSONL or Parquet file."""
    if path.name.endswith(".parquet"):
        from olmax.extras import require

        pq = require("pyarrow.parquet", f"reading {path}")
        for batch_start, batch in _parquet_batches(pq.ParquetFile(path)):
            for k, row in enumerate(batch):
                yield batch_start + k + 1, row
        return
    with open(path, "rb") as raw:
        for n, line in enumerate(_open_decompressed(raw, path), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise TokenizeError(f"{path} row {n}: not valid JSON ({e.msg})") from None
            yield n, row


def _parquet_batches(pf) -> Iterator[tuple[int, list[dict]]]:
    start = 0
    for batch in pf.iter_batches(batch_size=1024):
        rows = batch.to_pylist()
        yield start, rows
        start += len(rows)


class _PartWriter:
    """Documents and masks into parts of about `shard_tokens` tokens, each written to a temp name and renamed."""

    def __init__(self, out: Path, shard_tokens: int, dtype):
        self.out, self.shard_tokens, self.dtype = out, shard_tokens, dtype
        self.ids: list[np.ndarray] = []
        self.masks: list[np.ndarray] = []
        self.tokens = 0  # in self.ids: a running count, since a part may hold millions of documents
        self.parts: list[dict] = []

    def add(self, ex: ChatExample) -> None:
        self.ids.append(ex.ids)
        self.masks.append(ex.mask)
        self.tokens += len(ex.ids)
        if self.tokens >= self.shard_tokens:
            self.flush()

    def flush(self) -> None:
        if not self.ids:
            return
        k = len(self.parts)
        ids = np.concatenate(self.ids).astype(self.dtype, copy=False)
        mask = np.concatenate(self.masks).astype(np.bool_, copy=False)
        ends = np.cumsum([len(a) for a in self.ids])
        starts = ends - np.asarray([len(a) for a in self.ids])
        _write_atomic(self.out / TOKENS.format(k), ids.tobytes())
        _write_atomic(self.out / MASKS.format(k), mask.tobytes())
        lines = "".join(f"{s},{e}\n" for s, e in zip(starts.tolist(), ends.tolist()))
        _write_atomic(self.out / METADATA.format(k), gzip.compress(lines.encode(), mtime=0))
        self.parts.append(
            {
                "path": TOKENS.format(k),
                "label_mask": MASKS.format(k),
                "tokens": int(len(ids)),
                "documents": len(self.ids),
                "trainable_tokens": int(mask.sum()),
                "sha256": hashlib.sha256(ids.tobytes()).hexdigest(),
                "label_mask_sha256": hashlib.sha256(mask.tobytes()).hexdigest(),
            }
        )
        self.ids, self.masks, self.tokens = [], [], 0


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def tokenize_chat(
    inputs: Sequence[str | Path],
    out_dir: str | Path,
    template: str,
    tokenizer: str = "dolma2",
    max_seq_len: Optional[int] = None,
    shard_tokens: int = 1 << 26,
) -> dict:
    """Tokenize chat rows into `out_dir`; returns the manifest of each directory written: {"": ...} for
    SFT rows, {"chosen": ..., "rejected": ...} for preference rows."""
    paths = [Path(p) for p in inputs]
    if not paths:
        raise TokenizeError("no input files given")
    for p in paths:
        if not p.is_file():
            raise TokenizeError(f"input {p} does not exist")
        if not p.name.endswith(CHAT_SUFFIXES):
            raise TokenizeError(f"input {p}: unsupported file type for --chat (expected {', '.join(CHAT_SUFFIXES)})")
    if max_seq_len is not None and max_seq_len <= 0:
        raise TokenizeError(f"--max-seq-len must be positive, got {max_seq_len}")
    try:
        tok = load_tokenizer(tokenizer)
        eos = check_chat_tokenizer(tok)
    except (TokenizerError, ChatError) as e:
        raise TokenizeError(str(e)) from None
    out = Path(out_dir)
    if (out / MANIFEST).is_file() or (out / "chosen" / MANIFEST).is_file():
        raise TokenizeError(f"{out} already holds a tokenization; use a new --out")

    # without_final_eos: conversations that do not end with an assistant turn, or were truncated; a
    # reader that infers boundaries from EOS (OLMo-core's default for local files) joins each to the
    # next document. eos_inside: conversations whose text holds the EOS string, encoded as EOS (as HF
    # tokenizers encode added tokens in any text), which that reader splits. One that reads the .csv.gz
    # does neither (docs/data.md, "Chat parts").
    counts = {"rows": 0, "written": 0, "truncated": 0, "without_final_eos": 0, "eos_inside": 0, "skipped": {}}
    writers: dict[str, _PartWriter] = {}
    fields = FieldWriter()
    kind: Optional[str] = None
    for path in paths:
        for n, row in chat_rows(path):
            counts["rows"] += 1
            row_kind = "preference" if isinstance(row, dict) and "chosen" in row else "sft"
            if kind is None:
                kind = row_kind
                for sub in ("chosen", "rejected") if kind == "preference" else ("",):
                    (out / sub).mkdir(parents=True, exist_ok=True)
                    writers[sub] = _PartWriter(out / sub, shard_tokens, tok.info.dtype)
            elif row_kind != kind:
                raise TokenizeError(f"{path} row {n}: a {row_kind} row among {kind} rows (one kind per run)")
            try:
                if kind == "sft":
                    if not isinstance(row, dict):
                        raise ChatError("not a JSON object")
                    examples = {"": sft_example(template, check_messages(row.get("messages")), tok, eos, max_seq_len)}
                else:
                    pair = preference_examples(template, row, tok, eos, max_seq_len)
                    examples = dict(zip(("chosen", "rejected"), pair))
            except ChatError as e:
                raise TokenizeError(f"{path} row {n}: {e}") from None
            except ChatSkip as s:
                counts["skipped"][s.reason] = counts["skipped"].get(s.reason, 0) + 1
                continue
            counts["written"] += 1
            fields.add(row)
            counts["truncated"] += any(ex.truncated for ex in examples.values())
            counts["without_final_eos"] += any(ex.ids[-1] != tok.info.eos_token_id for ex in examples.values())
            counts["eos_inside"] += any((ex.ids[:-1] == tok.info.eos_token_id).any() for ex in examples.values())
            for sub, ex in examples.items():
                writers[sub].add(ex)
    if kind is None:
        raise TokenizeError("the inputs hold no rows")
    manifests = {}
    for sub, w in writers.items():
        w.flush()
        manifests[sub] = _manifest(w, tok, paths, template, max_seq_len, counts)
        manifests[sub]["chat"].update(fields.write(out / sub))
        _write_atomic(out / sub / MANIFEST, (json.dumps(manifests[sub], indent=1) + "\n").encode())
    return manifests


def _manifest(w: _PartWriter, tok: Encoder, paths: list[Path], template: str, max_seq_len, counts: dict) -> dict:
    return {
        "format": FORMAT,
        "tokenizer": tok.info.to_dict(),
        "dtype": np.dtype(tok.info.dtype).name,
        "shards": w.parts,
        "total_tokens": sum(p["tokens"] for p in w.parts),
        "sources": [{"path": str(p), "bytes": p.stat().st_size} for p in paths],
        "chat": {
            "template": template,
            "max_seq_len": max_seq_len,
            "trainable_tokens": sum(p["trainable_tokens"] for p in w.parts),
            **counts,
        },
    }


def eos_reading_note(chat_counts: dict) -> Optional[str]:
    """What to set when EOS scanning would not find a chat directory's conversations (its manifest's
    `chat` counts), or None when it finds them exactly."""
    joined, split = chat_counts.get("without_final_eos", 0), chat_counts.get("eos_inside", 0)
    if not joined and not split:
        return None
    return (
        f"{joined} conversation(s) without a final EOS and {split} with an EOS inside: finding documents by "
        "EOS joins or splits them, so read these parts by their .csv.gz (olmax: data.use_array_if_local=false; "
        'OLMo-core: use_array_if_local=False; docs/data.md, "Chat parts")'
    )


def eos_reading_notes(specs: Sequence[str]) -> list[str]:
    """`eos_reading_note` of each local `olmax tokenize --chat` directory among data path specs."""
    notes = []
    for spec in specs:
        if is_url(str(spec)) or not (Path(spec) / MANIFEST).is_file():
            continue
        note = eos_reading_note(read_manifest(spec).get("chat") or {})
        if note:
            notes.append(f"{spec}: {note}")
    return notes


def read_documents(directory: str | Path, dtype) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every document of a chat directory (olmax's or AI2's: the part files, not the manifest) as
    (token ids, label mask), in part and document order; boundaries from each part's .csv.gz."""
    d = Path(directory)
    docs = []
    k = 0
    while (d / TOKENS.format(k)).is_file():
        ids = np.fromfile(d / TOKENS.format(k), dtype=dtype)
        mask = np.fromfile(d / MASKS.format(k), dtype=np.bool_)
        if len(mask) != len(ids):
            raise TokenizeError(f"{d / MASKS.format(k)} has {len(mask)} entries for {len(ids)} tokens")
        with gzip.open(d / METADATA.format(k), "rt") as f:
            for line in f:
                s, e = (int(x) for x in line.split(",")[:2])
                docs.append((ids[s:e], mask[s:e]))
        k += 1
    if k == 0:
        raise TokenizeError(f"{d} has no {TOKENS.format(0)}")
    return docs
