"""Chat tokenizing rate: `olmax tokenize --chat` against open-instruct's masking rule run through transformers.

    .venv/bin/python benchmarks/chat_tokenize.py [--rows demo,multiturn --conversations 2000 --template instruct
                                                  --max-seq-len 32768 --repeats 3 --json out.json]

Both turn the same conversations into dolma2 token ids and label masks by the same rule, AI2's: open-
instruct's `sft_tulu_tokenize_and_truncate_v1` (open_instruct/dataset_transformation.py, commit e6c3044),
which renders the conversation with the chat template up to and including every non-assistant message
(with the generation prompt when an assistant turn follows), tokenizes each prefix and masks the tokens
between consecutive prefix lengths. The reference re-runs that rule as open-instruct calls it:
transformers 5.24's `apply_chat_template(..., tokenize=True, return_tensors="pt", truncation=True,
max_length=--max-seq-len)` on every prefix, with olmax's OLMo 3 template passed as `chat_template`, on a
`PreTrainedTokenizerFast` over dolma2's tokenizer.json (olmax.convert.hf_tokenizer builds AI2's file).
olmax rows:
- `olmax sft_example`: olmax.data.chat.sft_example per conversation, in memory (the same rule, with
  olmax's Jinja environment and the tiktoken-based dolma2 encoder);
- `olmax tokenize --chat`: olmax.data.chat_files.tokenize_chat, the command's whole path: reading the
  rows from JSONL, checking them, tokenizing and writing the token, mask and offset files.
Before timing, every conversation's ids and mask from both olmax rows are checked equal to the
reference's (the script stops otherwise), so all rows do the same work. No row builds a tokenizer:
the reference's is built once, and dolma2 is built once per process (olmax.data.tokenizer.load_tokenizer)
before the timed passes. The lines after the table give both builds' times and the command's ratio
with one build a run added (what a fresh `olmax tokenize --chat` process pays), against the
reference without and with its own build.

Rows: `demo`, the shipped demo SFT corpus (src/olmax/data/demo/chat/sft.jsonl.gz: 1,040 one-question
arithmetic conversations; 1,742 before 2026-12-04); `multiturn`, `--conversations` generated
conversations: a system message in a third of them, 1-4 user/assistant exchanges, a tool turn after some
assistant turns, every message a span of the demo pre-training text (src/olmax/data/demo/train.jsonl.gz)
of 20-1,500 characters. Each figure is the median of `--repeats` passes (the three rows interleaved per
pass); one process, one core (neither side runs in parallel). Prints a table; asserts nothing but the
equality.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from olmax.data import chat
from olmax.data.chat_files import read_documents, tokenize_chat
from olmax.data.demo import DEMO_DIR
from olmax.data.tokenizer import Dolma2Tokenizer, load_tokenizer

REFERENCE = "open-instruct rule (transformers)"


def demo_rows() -> list[list[dict]]:
    with gzip.open(DEMO_DIR / "chat" / "sft.jsonl.gz", "rt") as f:
        return [json.loads(line)["messages"] for line in f]


def multiturn_rows(n: int, seed: int = 0) -> list[list[dict]]:
    with gzip.open(DEMO_DIR / "train.jsonl.gz", "rt") as f:
        text = " ".join(json.loads(line)["text"] for line in f)
    rng = np.random.default_rng(seed)

    def span():
        length = int(rng.integers(20, 1501))
        start = int(rng.integers(0, len(text) - length))
        return text[start : start + length]

    rows = []
    for _ in range(n):
        messages = [{"role": "system", "content": span()}] if rng.random() < 1 / 3 else []
        for _ in range(int(rng.integers(1, 5))):
            messages += [{"role": "user", "content": span()}, {"role": "assistant", "content": span()}]
            if rng.random() < 0.2:
                messages += [{"role": "tool", "content": span()}, {"role": "assistant", "content": span()}]
        rows.append(messages)
    return rows


def reference_tokenizer(path: Path):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(path), eos_token="<|endoftext|>", pad_token="<|pad|>")


def median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def reference_example(hf_tok, template: str, messages: list[dict], max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, trained) by open-instruct's rule: every prefix rendered and tokenized by transformers."""

    def encode(upto: int, generation: bool):
        out = hf_tok.apply_chat_template(
            messages[:upto],
            chat_template=template,
            tokenize=True,
            return_tensors="pt",
            padding=False,
            truncation=True,
            max_length=max_len,
            add_generation_prompt=generation,
        )
        return out["input_ids"]  # transformers 5 returns a BatchEncoding here

    ids = encode(len(messages), False)
    labels = ids.clone()
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            continue
        start = 0 if i == 0 else encode(i, False).shape[1]
        end = encode(i + 1, i + 1 < len(messages) and messages[i + 1]["role"] == "assistant").shape[1]
        labels[:, start:end] = -100
        if end >= max_len:
            break
    return ids[0].numpy(), labels[0].numpy() != -100


def run_rows(name: str, rows: list[list[dict]], args, tok, hf_tok) -> dict:
    template = chat.template_text(args.template)
    eos = chat.check_chat_tokenizer(tok)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "rows.jsonl"
        src.write_text("".join(json.dumps({"messages": m}) + "\n" for m in rows))

        def ours():
            return [chat.sft_example(args.template, m, tok, eos, args.max_seq_len) for m in rows]

        runs = itertools.count()

        def command():
            out = Path(tmp) / f"out-{next(runs)}"
            tokenize_chat([src], out, args.template, max_seq_len=args.max_seq_len)
            return out

        def theirs():
            return [reference_example(hf_tok, template, m, args.max_seq_len) for m in rows]

        want = theirs()
        got = ours()
        files = read_documents(command(), tok.info.dtype)
        for i, ((ids, mask), ex, (fids, fmask)) in enumerate(zip(want, got, files, strict=True)):
            same = np.array_equal(ex.ids, ids) and np.array_equal(ex.mask, mask)
            if not (same and np.array_equal(fids, ids) and np.array_equal(fmask, mask)):
                raise SystemExit(f"{name} row {i}: olmax's ids or mask differ from the reference's")
        tokens = sum(len(ids) for ids, _ in want)
        trained = sum(int(mask.sum()) for _, mask in want)
        times = {"olmax sft_example": [], "olmax tokenize --chat": [], REFERENCE: []}
        for _ in range(args.repeats):
            for label, fn in zip(times, (ours, command, theirs)):
                start = time.perf_counter()
                fn()
                times[label].append(time.perf_counter() - start)
    return {
        "rows": name,
        "conversations": len(rows),
        "messages": sum(len(m) for m in rows),
        "tokens": tokens,
        "trained_tokens": trained,
        "seconds": times,
        "median_s": {k: statistics.median(v) for k, v in times.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="demo,multiturn")
    ap.add_argument("--conversations", type=int, default=2000, help="multiturn: how many")
    ap.add_argument("--template", choices=tuple(chat.TEMPLATES), default="instruct")
    ap.add_argument("--max-seq-len", type=int, default=32768, help="AI2's SFT length (OLMo 3 Think SFT: 32768)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from olmax.convert.hf_tokenizer import dolma2_tokenizer_json

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        hf_json = Path(tmp) / "tokenizer.json"
        hf_json.write_text(json.dumps(dolma2_tokenizer_json(), ensure_ascii=False))
        tok, hf_tok = load_tokenizer("dolma2"), reference_tokenizer(hf_json)
        sets = {"demo": demo_rows, "multiturn": lambda: multiturn_rows(args.conversations)}
        reports = [run_rows(name, sets[name](), args, tok, hf_tok) for name in args.rows.split(",")]
        builds = {
            "dolma2": median_seconds(Dolma2Tokenizer, args.repeats),
            "reference": median_seconds(lambda: reference_tokenizer(hf_json), args.repeats),
        }
    load_after = os.getloadavg()
    print(
        f"# template {args.template}, dolma2, max_seq_len {args.max_seq_len}; median of {args.repeats} passes; "
        f"load average {load_before[0]:.1f} before / {load_after[0]:.1f} after; ids and masks identical: True"
    )
    print("| rows | conversations (messages, tokens) | implementation | conv/s | tokens/s | ratio |")
    print("|---|---|---|---|---|---|")
    for r in reports:
        ref = r["median_s"][REFERENCE]
        for label, s in r["median_s"].items():
            shape = f"{r['conversations']:,} ({r['messages']:,}, {r['tokens']:,})"
            print(
                f"| {r['rows']} | {shape} | {label} | {r['conversations'] / s:,.0f} | {r['tokens'] / s:,.0f} "
                f"| {ref / s:.2f}x |"
            )
    print(
        f"\ntokenizer builds, once per process and in no row above: dolma2 {builds['dolma2']:.3f} s, "
        f"transformers' {builds['reference']:.3f} s; tokenize --chat with one build a run:"
    )
    for r in reports:
        ours, ref = r["median_s"]["olmax tokenize --chat"] + builds["dolma2"], r["median_s"][REFERENCE]
        print(f"- {r['rows']}: {ref / ours:.2f}x, {(ref + builds['reference']) / ours:.2f}x with one on each side")
    if args.json:
        report = {"args": {k: str(v) for k, v in vars(args).items()}, "load_average": [load_before, load_after]}
        report["tokenizer_build_s"] = builds
        args.json.write_text(json.dumps({**report, "rows": reports}, indent=1))


if __name__ == "__main__":
    main()
