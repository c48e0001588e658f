"""The chat corpus shipped for `olmax demo chat` (src/olmax/data/demo/chat/, described in its README.md).

Small arithmetic conversations whose answers a verifier can check, so every post-training stage has
something to learn and to measure on a tiny model on CPU: SFT teaches the sums and the answers'
mixed formats, DPO prefers the right sum over a near miss, and RL with verifiable rewards is scored by
the math verifier on the boxed answer. The corpus is generated, not collected (there is no free chat data
with checkable answers small enough to ship); `python -m olmax.data.chat_corpus` writes it, and a test
checks that the shipped files are exactly what this module writes.

Problems are sums and differences of numbers below 13, asked in five wordings. Held out by wording, not
by sum: three problems in ten (by a stable hash) each keep one wording out of every training file, and
the held-out files ask those problems in that wording, so a held-out prompt is text the model never
trained on, asking a sum it did. (Sums it never saw are beyond the tiny model: with operands below 25
and one problem in ten held out, SFT taught 5 to 17 of 79 unseen sums, by float rounding, and answered
most of the rest off by one or two; docs/post-training/demo-chat.md, "`olmax demo chat`".)

The demonstrations answering "What is ...?" box their answer (`The answer is \\boxed{7}.`); those in
the other wordings box it in 2 rows of 10 and state it in words (`The answer is 7.`) in the rest, as
demonstrations gathered from several sources mix formats. The math verifier, as open-instruct's, credits
only an answer it can extract (a `\\boxed{}` here), so the SFT model's greedy answers score only where
the question reads "What is"; RL with that verifier as the reward teaches the model to box them all, on
held-out prompts too (docs/post-training/demo-chat.md, "`olmax demo chat`").

Files (gzip level 9, mtime 0; one JSON object per line):
- sft.jsonl.gz, sft_heldout.jsonl.gz: {"messages": [user, assistant]} (the Dolci-*-SFT layout);
- prefs.jsonl.gz, prefs_heldout.jsonl.gz: {"chosen": [...], "rejected": [...]} with the same
  question, the rejected answer a near miss in the same format as the chosen one (the Dolci-*-DPO
  layout: DPO teaches the sum, not the format);
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
FILES = ("sft", "sft_heldout", "prefs", "prefs_heldout", "rl", "rl_heldout")
LIMIT = 13  # operands below this: 169 sums and 91 differences
SEED = 20261204
SFT_COPIES = 4  # each problem's demonstrations in the SFT file, each worded at random
HELD_OUT_PER_10 = 3  # problems, per 10, that keep one wording out of every training file
PHRASINGS = (
    "What is {a} {op} {b}?",
    "Compute {a} {op} {b}.",
    "Calculate {a} {op} {b} and give the result.",
    "Please work out {a} {op} {b}.",
    "Find {a} {op} {b}.",
)
BOXED_WORDING = 0  # the demonstrations answering "What is ...?" always box their answer
BOXED_PER_10 = 2  # the other wordings' demonstrations box it in 2 rows of 10, state it in words in the rest


def _answer(a: int, op: str, b: int, c: int, boxed: bool) -> str:
    return f"{a} {op} {b} = {c}. The answer is " + (f"\\boxed{{{c}}}." if boxed else f"{c}.")


def _boxed(wording: int, row: int) -> bool:
    """Whether row `row` of a file, asked in `wording`, boxes its answer: by position for the wordings
    other than BOXED_WORDING, so a problem's SFT rows box independently of each other."""
    return wording == BOXED_WORDING or row % 10 < BOXED_PER_10


def _problems() -> list[tuple[int, str, int, int]]:
    sums = [(a, "+", b, a + b) for a in range(LIMIT) for b in range(LIMIT)]
    diffs = [(a, "-", b, a - b) for a in range(LIMIT) for b in range(a + 1)]
    return sums + diffs


def held_out_wording(problem: tuple) -> int | None:
    """The index of the wording held out for this problem (HELD_OUT_PER_10 problems in 10), or None, by a
    hash that does not depend on Python's hash seed."""
    digest = hashlib.sha256(repr(problem[:3]).encode()).digest()
    return digest[1] % len(PHRASINGS) if digest[0] % 10 < HELD_OUT_PER_10 else None


def build() -> dict[str, list[dict]]:
    """The corpus as rows per file (deterministic)."""
    rng = random.Random(SEED)
    problems = _problems()
    held = [p for p in problems if held_out_wording(p) is not None]
    rows: dict[str, list[dict]] = {name: [] for name in FILES}

    def question(problem, held_out: bool) -> tuple[int, dict]:
        """The wording (the problem's held-out one, or one of the others at random) and the user turn."""
        a, op, b, _ = problem
        reserved = held_out_wording(problem)
        w = reserved if held_out else rng.choice([i for i in range(len(PHRASINGS)) if i != reserved])
        return w, {"role": "user", "content": PHRASINGS[w].format(a=a, op=op, b=b)}

    def reply(problem, answer: int, wording: int, k: int) -> dict:
        """Row k's assistant turn: `answer` boxed or in words as _boxed says for the wording and row."""
        return {"role": "assistant", "content": _answer(*problem[:3], answer, _boxed(wording, k))}

    def conversation(problem, k: int, held_out: bool) -> list[dict]:
        w, asked = question(problem, held_out)
        return [asked, reply(problem, problem[3], w, k)]

    sft = [p for _ in range(SFT_COPIES) for p in rng.sample(problems, len(problems))]
    rows["sft"] = [{"messages": conversation(p, k, False)} for k, p in enumerate(sft)]
    rows["sft_heldout"] = [{"messages": conversation(p, k, True)} for k, p in enumerate(held)]
    for name, chosen in (("prefs", rng.sample(problems, len(problems))), ("prefs_heldout", held)):
        for k, p in enumerate(chosen):
            w, asked = question(p, name == "prefs_heldout")
            wrong = p[3] + rng.choice((-2, -1, 1, 2))  # a near miss in the same format and wording
            rows[name].append({"chosen": [asked, reply(p, p[3], w, k)], "rejected": [asked, reply(p, wrong, w, k)]})
    for name, chosen in (("rl", rng.sample(problems, len(problems))), ("rl_heldout", held)):
        for p in chosen:
            asked = question(p, name == "rl_heldout")[1]
            rows[name].append({"messages": [asked], "ground_truth": str(p[3]), "dataset": "math"})
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
