"""The chat corpus shipped for `olmax demo chat` (src/olmax/data/demo/chat/, described in its README.md).

Small arithmetic conversations whose answers a verifier can check, so every post-training stage has
something to learn and to measure on a tiny model on CPU: SFT teaches some of the sums and the answers'
mixed formats, DPO prefers the right sum over a near miss, and RL with verifiable rewards is scored by
the math verifier on the boxed answer. The corpus is generated, not collected (there is no free chat data
with checkable answers small enough to ship); `python -m olmax.data.chat_corpus` writes it, and a test
checks that the shipped files are exactly what this module writes.

Problems are sums and differences of numbers below 25 in a few phrasings. A problem (a, op, b) is held
out by a stable hash, so the held-out prompts ask sums the model never saw trained, in phrasings it did.

The demonstrations box their answer (`The answer is \\boxed{7}.`) in 3 rows of 10 and state it in words
in the rest (`The answer is 7.`), as demonstrations gathered from many sources mix formats. The math
verifier, as open-instruct's, credits only an answer it can extract (a `\\boxed{}` here), so the SFT
model answers in words and scores 0, whatever sums it learnt; RL with that verifier as the reward
teaches it to box, a behaviour that carries over to prompts it never trained on (docs/post-training.md,
"`olmax demo chat`").

Files (gzip level 9, mtime 0; one JSON object per line):
- sft.jsonl.gz, sft_heldout.jsonl.gz: {"messages": [user, assistant]} (the Dolci-*-SFT layout);
- prefs.jsonl.gz: {"chosen": [...], "rejected": [...]} with the same question, the rejected answer a
  near miss in the same format as the chosen one (the Dolci-*-DPO layout: DPO teaches the sum, not the
  format);
- rl.jsonl.gz, rl_heldout.jsonl.gz: {"messages": [user], "ground_truth": "c", "dataset": "math"}
  (the Dolci-*-RL layout: the prompt, the answer and the verifier's name).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import random
from pathlib import Path

CHAT_DIR = Path(__file__).with_name("demo") / "chat"
FILES = ("sft", "sft_heldout", "prefs", "rl", "rl_heldout")
LIMIT = 25  # operands below this: 625 sums and 325 differences
SEED = 20261203
BOXED_PER_10 = 3  # demonstrations that box their answer, per 10 rows (the rest state it in words)
PHRASINGS = (
    "What is {a} {op} {b}?",
    "Compute {a} {op} {b}.",
    "Calculate {a} {op} {b} and give the result.",
    "Please work out {a} {op} {b}.",
)


def _answer(a: int, op: str, b: int, c: int, boxed: bool) -> str:
    return f"{a} {op} {b} = {c}. The answer is " + (f"\\boxed{{{c}}}." if boxed else f"{c}.")


def _boxed(row: int) -> bool:
    """Row k of a file boxes its answer when k % 10 < BOXED_PER_10: by position, not by problem, so a
    problem's two SFT rows (one in order, one shuffled) box independently of each other."""
    return row % 10 < BOXED_PER_10


def _problems() -> list[tuple[int, str, int, int]]:
    sums = [(a, "+", b, a + b) for a in range(LIMIT) for b in range(LIMIT)]
    diffs = [(a, "-", b, a - b) for a in range(LIMIT) for b in range(a + 1)]
    return sums + diffs


def _held_out(problem: tuple) -> bool:
    """About one problem in ten, by a hash that does not depend on Python's hash seed."""
    return hashlib.sha256(repr(problem[:3]).encode()).digest()[0] < 26


def build() -> dict[str, list[dict]]:
    """The corpus as rows per file (deterministic)."""
    rng = random.Random(SEED)
    problems = _problems()
    train = [p for p in problems if not _held_out(p)]
    held = [p for p in problems if _held_out(p)]
    rows: dict[str, list[dict]] = {name: [] for name in FILES}

    def user(a, op, b):
        return {"role": "user", "content": rng.choice(PHRASINGS).format(a=a, op=op, b=b)}

    for name, problems in (("sft", train + rng.sample(train, len(train))), ("sft_heldout", held)):
        for k, (a, op, b, c) in enumerate(problems):  # SFT: every trained problem twice, reworded
            answer = {"role": "assistant", "content": _answer(a, op, b, c, _boxed(k))}
            rows[name].append({"messages": [user(a, op, b), answer]})
    for k, (a, op, b, c) in enumerate(rng.sample(train, len(train))):
        question = user(a, op, b)
        wrong = c + rng.choice((-2, -1, 1, 2))
        rows["prefs"].append(
            {
                "chosen": [question, {"role": "assistant", "content": _answer(a, op, b, c, _boxed(k))}],
                "rejected": [question, {"role": "assistant", "content": _answer(a, op, b, wrong, _boxed(k))}],
            }
        )
    for name, chosen in (("rl", rng.sample(train, len(train))), ("rl_heldout", held)):
        for a, op, b, c in chosen:
            rows[name].append({"messages": [user(a, op, b)], "ground_truth": str(c), "dataset": "math"})
    return rows


def encode(rows: list[dict]) -> bytes:
    """One file's bytes: JSON lines, gzip level 9 with mtime 0 (the same bytes on every machine)."""
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode()
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=9, mtime=0) as f:
        f.write(text)
    return out.getvalue()


def chat_file(name: str) -> Path:
    if name not in FILES:
        raise ValueError(f"demo chat file {name!r} is not one of {', '.join(FILES)}")
    return CHAT_DIR / f"{name}.jsonl.gz"


def read_rows(name: str) -> list[dict]:
    with gzip.open(chat_file(name), "rt") as f:
        return [json.loads(line) for line in f]


def write(directory: Path = CHAT_DIR) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, rows in build().items():
        (directory / f"{name}.jsonl.gz").write_bytes(encode(rows))


if __name__ == "__main__":
    write()
    for name in FILES:
        print(f"{chat_file(name)}: {len(read_rows(name))} rows")
