"""The shrunken `tiny` run that the training, checkpoint and fault tests share: 2 layers of d_model 64
at 64 tokens, global batch 8 (divisible by the 8 fake devices), 6 steps, a checkpoint every 3. Tests
append their own overrides (later ones win)."""

from olmax.config import apply_overrides
from olmax.recipes import get_recipe

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


def small_config(tmp_path, *extra):
    """The small run's config, its tokenized demo data cached under tmp_path."""
    return apply_overrides(get_recipe("tiny"), SMALL + [f"data.work_dir={tmp_path / 'cache'}", *extra])
