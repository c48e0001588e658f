"""Per-domain perplexity and bits per byte, Paloma-style (docs/verification.md).

Input: a directory of held-out `.jsonl` / `.jsonl.gz` files (or one such file), one JSON object per
line with a `text` field. Documents are grouped by their `domain` field when they have one, else by
the file they are in (`--by field|file` forces one rule: a directory of one file per source whose
documents also carry a `domain` field can be scored either way).

Each document is scored on its own, never packed with another (packing would let one document's
tokens condition another's): dolma2 ids of the text after an EOS token (OLMo has no BOS; in training
a document starts after the previous one's EOS), every text token scored once. A document longer
than `seq_len` is cut into windows of `seq_len` that overlap by one token, so each window's first
input is the previous window's last target: no token is scored twice or skipped (Paloma's
non-overlapping evaluation). Per domain:

  loss = sum of token NLLs / scored tokens     (nats per token, the real vocabulary's softmax)
  ppl  = exp(loss)
  bpb  = sum of token NLLs / (ln 2 * UTF-8 bytes of the texts)   (tokenizer-independent)

Macro averages are the unweighted means over domains of each figure; micro figures pool every token
(and byte) of every domain. Rows are batched by length (padded to a power of two, at least 16) so
short documents do not pay for a full `seq_len` row.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
from jax.sharding import Mesh

from olmax.checkpoint.inference import eval_mesh, load_checkpoint
from olmax.data.tokenizer import load_tokenizer
from olmax.evals.jsonl import read_jsonl
from olmax.evals.scoring import TokenScorer, eval_seq_len
from olmax.objectives.cross_entropy import IGNORE

GROUPINGS = ("auto", "field", "file")
MIN_BUCKET = 16


def _jsonl_files(data: Path) -> list[Path]:
    if data.is_file():
        return [data]
    if not data.is_dir():
        raise FileNotFoundError(f"domain data {data} is neither a directory nor a file")
    files = sorted(p for p in data.iterdir() if p.name.endswith((".jsonl", ".jsonl.gz")))
    if not files:
        raise FileNotFoundError(f"domain data directory {data} has no .jsonl or .jsonl.gz files")
    return files


def _file_domain(path: Path) -> str:
    name = path.name
    return name[: -len(".jsonl.gz")] if name.endswith(".jsonl.gz") else name[: -len(".jsonl")]


def _records(path: Path) -> Iterator[tuple[int, dict]]:
    for line_no, record in read_jsonl(path):
        if not isinstance(record.get("text"), str):
            raise ValueError(f"{path} line {line_no}: no string `text` field")
        yield line_no, record


def read_domains(data: str | Path, by: str = "auto", max_docs: Optional[int] = None) -> dict[str, list[str]]:
    """{domain: [texts]} in file and line order; at most `max_docs` documents per domain."""
    if by not in GROUPINGS:
        raise ValueError(f"--by {by!r} is not one of {', '.join(GROUPINGS)}")
    domains: dict[str, list[str]] = defaultdict(list)
    for path in _jsonl_files(Path(data)):
        for line_no, record in _records(path):
            if by == "file" or (by == "auto" and "domain" not in record):
                domain = _file_domain(path)
            elif not isinstance(record.get("domain"), str):
                raise ValueError(f"{path} line {line_no}: no string `domain` field (use --by file)")
            else:
                domain = record["domain"]
            if record["text"] and (max_docs is None or len(domains[domain]) < max_docs):
                domains[domain].append(record["text"])
    return dict(sorted(domains.items()))


def document_windows(ids: list[int], prefix: int, seq_len: int) -> list[np.ndarray]:
    """[prefix] + ids cut into windows of at most seq_len tokens overlapping by one, so every id is
    a target exactly once (the first input of a window is the last target of the one before)."""
    seq = np.asarray([prefix] + ids, np.int32)
    step = seq_len - 1
    return [seq[s : s + seq_len] for s in range(0, len(seq) - 1, step)]


@dataclass
class _Totals:
    docs: int = 0
    tokens: int = 0
    bytes: int = 0
    nll: float = 0.0


def _bucket(n: int, seq_len: int) -> int:
    return min(seq_len, max(MIN_BUCKET, 1 << (n - 1).bit_length()))


def _figures(nll: float, tokens: int, n_bytes: int) -> dict:
    loss = nll / tokens
    return {"loss": loss, "ppl": math.exp(loss), "bpb": nll / (math.log(2) * n_bytes)}


def score_domains(
    scorer: TokenScorer,
    params: dict,
    domains: dict[str, list[str]],
    *,
    seq_len: int,
    batch: int,
    tokenizer: str = "dolma2",
) -> dict:
    """Per-domain figures plus macro and micro averages (see the module doc)."""
    if seq_len < 2:
        raise ValueError(f"seq_len must be at least 2, got {seq_len}")
    tok = load_tokenizer(tokenizer)
    prefix = tok.info.eos_token_id
    totals = {d: _Totals() for d in domains}
    rows: list[tuple[str, np.ndarray]] = []
    for domain, texts in domains.items():
        t = totals[domain]
        for text in texts:
            t.docs += 1
            t.bytes += len(text.encode("utf-8"))
            rows += [(domain, w) for w in document_windows(tok.encode(text), prefix, seq_len)]
    # Longest first, stable: batches of similar length, in an order fixed by the data alone.
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i][1]))
    for start in range(0, len(order), batch):
        chunk = [rows[i] for i in order[start : start + batch]]
        width = _bucket(max(len(w) for _, w in chunk), seq_len)
        tokens = np.zeros((len(chunk), width), np.int32)
        labels = np.full((len(chunk), width), IGNORE, np.int32)
        for r, (_, w) in enumerate(chunk):
            tokens[r, : len(w)] = w
            labels[r, : len(w) - 1] = w[1:]
        nll, _ = scorer(params, tokens, labels)
        for r, (domain, w) in enumerate(chunk):
            totals[domain].nll += float(np.sum(nll[r], dtype=np.float64))
            totals[domain].tokens += len(w) - 1
    per_domain = {
        d: {"docs": t.docs, "tokens": t.tokens, "bytes": t.bytes, **_figures(t.nll, t.tokens, t.bytes)}
        for d, t in totals.items()
        if t.tokens
    }
    if not per_domain:
        raise ValueError("no document has any text to score")
    macro = {k: float(np.mean([r[k] for r in per_domain.values()])) for k in ("loss", "ppl", "bpb")}
    all_nll = sum(t.nll for t in totals.values())
    micro = {
        "docs": sum(t.docs for t in totals.values()),
        "tokens": sum(t.tokens for t in totals.values()),
        "bytes": sum(t.bytes for t in totals.values()),
    }
    micro.update(_figures(all_nll, micro["tokens"], micro["bytes"]))
    return {"domains": per_domain, "macro": macro, "micro": micro}


def eval_domains(
    ckpt: str,
    data: str,
    *,
    seq_len: Optional[int],
    batch: int,
    by: str = "auto",
    max_docs: Optional[int] = None,
    tokenizer: str = "dolma2",
    step: Optional[int] = None,
    compute_dtype: Optional[str] = None,
    mesh: Optional[Mesh] = None,
) -> dict:
    """`olmax eval domains`: per-domain loss, perplexity and bits per byte of a checkpoint; windows of
    `seq_len` tokens (None: the checkpoint's training length, olmax.evals.scoring.eval_seq_len)."""
    mesh = mesh or eval_mesh()
    params, cfg, meta = load_checkpoint(ckpt, mesh, step=step, compute_dtype=compute_dtype)
    seq_len = eval_seq_len(seq_len, ckpt, meta["step"], cfg)
    scorer = TokenScorer(cfg, mesh, real_vocab=True)
    report = score_domains(
        scorer, params, read_domains(data, by, max_docs), seq_len=seq_len, batch=batch, tokenizer=tokenizer
    )
    return {
        "ckpt": str(ckpt),
        "step": meta["step"],
        "data": str(data),
        "by": by,
        "seq_len": seq_len,
        "compute_dtype": cfg.compute_dtype,
        **report,
    }


def format_domains(report: dict) -> str:
    """A markdown table of the per-domain figures and the two averages."""
    lines = ["| domain | docs | tokens | bytes | loss | ppl | bits/byte |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in report["domains"].items():
        lines.append(
            f"| {name} | {r['docs']} | {r['tokens']} | {r['bytes']} | {r['loss']:.4f} | "
            f"{r['ppl']:.2f} | {r['bpb']:.4f} |"
        )
    m, mi = report["macro"], report["micro"]
    lines.append(f"| **macro** | | | | {m['loss']:.4f} | {m['ppl']:.2f} | {m['bpb']:.4f} |")
    lines.append(
        f"| **micro** | {mi['docs']} | {mi['tokens']} | {mi['bytes']} | {mi['loss']:.4f} | "
        f"{mi['ppl']:.2f} | {mi['bpb']:.4f} |"
    )
    return "\n".join(lines)
