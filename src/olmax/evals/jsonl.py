"""Reading .jsonl / .jsonl.gz files with errors that name the file and line (eval text, metrics logs)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Iterator


def read_jsonl(path: Path, error: type[Exception] = ValueError) -> Iterator[tuple[int, dict]]:
    """(1-based line number, object) for every non-blank line; a line that is not a JSON object
    raises `error` naming the file and line."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise error(f"{path} line {line_no}: not valid JSON ({e.msg})") from None
            if not isinstance(record, dict):
                raise error(f"{path} line {line_no}: not a JSON object")
            yield line_no, record
