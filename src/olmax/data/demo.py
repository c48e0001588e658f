"""The demo corpus shipped with olmax (src/olmax/data/demo/, provenance in its README.md).

`olmax train --recipe tiny` reads it through the data path specs `demo` (= `demo:train`) and
`demo:heldout`. The text ships compressed (1.9 MB); on first use it is tokenized with dolma2 into
`<work_dir>/demo/<content hash>/<split>/` (about 6 s on one core), and later runs reuse that.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from olmax.data.tokenize import tokenize_once

DEMO_DIR = Path(__file__).with_name("demo")
SPLITS = ("train", "heldout")
SPECS = {"demo": "train", "demo:train": "train", "demo:heldout": "heldout"}


def is_demo_spec(spec: str) -> bool:
    return spec in SPECS


def demo_text(split: str) -> Path:
    if split not in SPLITS:
        raise ValueError(f"demo split {split!r} is not one of {', '.join(SPLITS)}")
    return DEMO_DIR / f"{split}.jsonl.gz"


def demo_shards(spec: str, cache_dir: str | Path) -> list[str]:
    """Token shard paths of a demo split, tokenizing it into `cache_dir` on first use."""
    text = demo_text(SPECS[spec])
    digest = hashlib.sha256(text.read_bytes()).hexdigest()[:16]
    target = Path(cache_dir) / "demo" / digest / SPECS[spec]
    return [str(target / s["path"]) for s in tokenize_once([text], target, "dolma2")["shards"]]
