"""Named experiment presets. `get_recipe(name)` returns a frozen `ExperimentConfig`.

Numbers are from REFERENCE.md (OLMo-core 3.0.0 `TransformerConfig.olmo3_7B/32B` and the official
OLMo 3 stage-1 script).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from olmax.config import (
    ConfigError,
    DataConfig,
    EvalConfig,
    ExperimentConfig,
    MeshConfig,
    ModelConfig,
    ScheduleConfig,
    TrainerConfig,
)

OLMO3_7B = ModelConfig()  # the defaults are the 7B

OLMO3_32B = replace(OLMO3_7B, d_model=5120, n_layers=64, n_heads=40, n_kv_heads=8, mlp_hidden=27648)

# Same parameters and FLOPs as the 7B, 16 heads of 256 (the MaxText write-up's +12.4% variant).
OLMO3_7B_HD256 = replace(OLMO3_7B, n_heads=16, n_kv_heads=16, head_dim=256)

# The embedded default: the real dolma2 vocabulary, a model small enough to train on 2 CPU cores.
TINY = replace(
    OLMO3_7B, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=32, mlp_hidden=384,
    sliding_window=64, max_position=256, compute_dtype="float32",
)

# The benchmark config of the performance issue: fp32 everywhere, windows on 0-2 and 4-6.
BENCH_SMALL = replace(
    OLMO3_7B, d_model=512, n_layers=8, n_heads=8, n_kv_heads=8, head_dim=64, mlp_hidden=1536,
    sliding_window=512, max_position=1024, compute_dtype="float32",
)


# AI2's stage-1 run (OLMo-3-1025-7B-pretrain-1/-2.py): cosine from 5e12 tokens, stitched at step
# 597,047 onto a half-cosine to 7e12 tokens; stopped after step 1,413,814 (the stage-2 start).
STAGE1_SCHEDULE = ScheduleConfig(name="stitched_cosine", warmup_steps=2000, alpha_f=0.1, t_max_tokens=5 * 10**12,
                                 switch_step=597_047, final_t_max_tokens=7 * 10**12)
STAGE1_DATA = DataConfig(seq_len=8192, max_target_seq_len=8192, seed=34521)  # enters the data fingerprint
STAGE1_TRAINER = TrainerConfig(global_batch=512, max_steps=1_413_814)


def _stage1(name: str, model: ModelConfig) -> ExperimentConfig:
    return ExperimentConfig(name=name, model=model, data=STAGE1_DATA, schedule=STAGE1_SCHEDULE,
                            trainer=STAGE1_TRAINER)


def _olmo3_7b() -> ExperimentConfig:
    return _stage1("olmo3_7b", OLMO3_7B)


def _olmo3_32b() -> ExperimentConfig:
    return _stage1("olmo3_32b", OLMO3_32B)


def _olmo3_7b_hd256() -> ExperimentConfig:
    return _stage1("olmo3_7b_hd256", OLMO3_7B_HD256)


def _tiny() -> ExperimentConfig:
    return ExperimentConfig(
        name="tiny",
        model=TINY,
        data=DataConfig(paths=("demo",), seq_len=256, seed=34521),
        eval=EvalConfig(every=10, batches=4, data=("demo:heldout",)),
        schedule=ScheduleConfig(warmup_steps=10),
        trainer=TrainerConfig(global_batch=16, max_steps=40, loss_chunk=64),
        mesh=MeshConfig(data=1, fsdp=-1, tensor=1),
    )


def _bench_small() -> ExperimentConfig:
    return ExperimentConfig(
        name="bench-small",
        model=BENCH_SMALL,
        data=DataConfig(seq_len=1024),
        schedule=ScheduleConfig(name="constant", warmup_steps=0),
        trainer=TrainerConfig(global_batch=4, max_steps=13),
    )


RECIPES: dict[str, Callable[[], ExperimentConfig]] = {
    "olmo3_7b": _olmo3_7b,
    "olmo3_32b": _olmo3_32b,
    "olmo3_7b_hd256": _olmo3_7b_hd256,
    "tiny": _tiny,
    "bench-small": _bench_small,
}


def get_recipe(name: str) -> ExperimentConfig:
    if name not in RECIPES:
        raise ConfigError(f"unknown recipe {name!r}; known: {', '.join(RECIPES)}")
    return RECIPES[name]()


def resolve(recipe: str | None, config_file: str | None, overrides: list[str] | tuple[str, ...] = ()) -> ExperimentConfig:
    """The experiment config a command runs: a recipe or a YAML file, then dotted overrides."""
    from olmax.config import apply_overrides, load_yaml

    if (recipe is None) == (config_file is None):
        raise ConfigError("give exactly one of --recipe NAME or --config FILE")
    cfg = get_recipe(recipe) if recipe is not None else load_yaml(config_file)
    return apply_overrides(cfg, overrides)
