"""The shrunken `tiny` run that the training, checkpoint and fault tests share: 2 layers of d_model 64
at 64 tokens, global batch 8 (divisible by the 8 fake devices), 6 steps, a checkpoint every 3. Tests
append their own overrides (later ones win)."""

import atexit
import shutil
import sys
import tempfile
from functools import cache
from pathlib import Path

from olmax.config.io import apply_overrides
from olmax.config.recipes import get_recipe
from olmax.data.demo import demo_shards

SMALL = [
    "model.d_model=64",
    "model.n_layers=2",
    "model.n_heads=2",
    "model.n_kv_heads=1",
    "model.head_dim=32",
    "model.mlp_hidden=128",
    "model.sliding_window=16",
    "data.seq_len=64",
    "trainer.global_batch=8",
    "trainer.loss_chunk=0",
    "trainer.max_steps=6",
    "schedule.warmup_steps=2",
    "checkpoint.every=3",
]


@cache
def tokenized_demo() -> Path:
    """The demo corpus's `demo/` cache directory, tokenized once per test process (3-6 s a time on 2
    shared cores, and some 25 tests start a run on it)."""
    root = Path(tempfile.mkdtemp(prefix="olmax-demo-"))
    atexit.register(shutil.rmtree, root, True)
    demo_shards("demo:train", root)
    demo_shards("demo:heldout", root)
    return root / "demo"


def small_config(tmp_path, *extra):
    """The small run's config, with the tokenized demo data copied into tmp_path/cache (the test's own
    copy, as a first use would have written it)."""
    work_dir = tmp_path / "cache"
    if not (work_dir / "demo").exists():
        shutil.copytree(tokenized_demo(), work_dir / "demo")
    return apply_overrides(get_recipe("tiny"), SMALL + [f"data.work_dir={work_dir}", *extra])


# The metrics a resumed run logs bit for bit as the uninterrupted run does.
EXACT_KEYS = [
    "train/CE loss",
    "train/Z loss",
    "optim/total grad norm",
    "optim/LR",
    "optim/step skipped",
    "throughput/total tokens",
    "data/instances",
]

# `olmax` as a separate process of this interpreter: the argv before the command's words
OLMAX = [sys.executable, "-m", "olmax.cli"]
