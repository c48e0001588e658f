"""A stdio test's verdict, in the tests' process: the program's output compared upstream's way.

The program runs with the test's input as its descriptor 0 and a file as its descriptor 1
(olmax.rewards.code_runner hands both over); the tests' process (olmax.rewards.code_harness) reads that
file back after the program ended, however it ended, up to a bound, and compares it here with the
expected output, which no process of the program's ever holds.

Standard library only (this module runs inside the sandbox).
"""

from __future__ import annotations

import decimal
import re

_TOKEN = re.compile(r"\S+")


def _lines(text: str):
    """The stripped lines of `text` stripped, one at a time."""
    start = 0
    while True:
        end = text.find("\n", start)
        yield text[start : end if end >= 0 else None].strip()
        if end < 0:
            return
        start = end + 1


def _same_numbers(a: str, b: str) -> bool:
    left, right = _TOKEN.finditer(a), _TOKEN.finditer(b)
    try:
        for x in left:
            y = next(right, None)
            if y is None or decimal.Decimal(x.group()) != decimal.Decimal(y.group()):
                return False
        return next(right, None) is None
    except (decimal.InvalidOperation, ValueError):
        return False


def same_output(got: str, want: str) -> bool:
    """Upstream's stdio comparison (open-instruct `code_utils/testing_util.py`, LiveCodeBench's grader, at
    42aa63c and 9ade62d): the same number of lines, each stripped, equal as text or as whitespace-separated
    Decimals. The line counts are compared before anything is split; a line differing as text is read as
    numbers one token at a time."""
    got, want = str(got).strip(), str(want).strip()
    if got.count("\n") != want.count("\n"):
        return False
    return all(a == b or _same_numbers(a, b) for a, b in zip(_lines(got), _lines(want)))


def judge(spec: dict, exchange, output_bytes: int) -> tuple[str, str, bool]:
    """A `code_stdio` test: `exchange(input bytes)` runs the program on it and returns (its status, its
    output up to `output_bytes` + 1), compared here."""
    status, output = exchange(spec["input"].encode("utf-8", "surrogatepass"))
    if status == 2:
        return "t", "the program ran past its time", False
    if status != 0:
        return "f", "the program raised or exited with an error", False
    if len(output) > output_bytes:
        return "f", f"the program wrote more than {output_bytes} bytes", False
    text = output.decode("utf-8", "replace")
    return ("p", "", False) if same_output(text, spec["output"]) else ("f", "the output differs", False)
