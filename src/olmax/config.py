"""Typed, frozen configuration for every part of olmax, composed into one `ExperimentConfig`.

Configs are plain frozen dataclasses. OmegaConf does the YAML round trip and the dotted
`key=value` overrides with type checking (an unknown key or a value of the wrong type is an error
that names it); values with a fixed set of choices are checked in `__post_init__`.
Named presets live in `olmax.recipes`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence, TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

DTYPES = ("float32", "bfloat16", "float16")
# `auto` picks by the platform the step compiles for (olmax.model.attention.resolve_backend).
ATTENTION_BACKENDS = ("auto", "xla", "cudnn", "splash")
ROPE_TYPES = ("default", "yarn")
YARN_LAYERS = ("global", "all")
WANDB_MODES = ("disabled", "online", "offline")  # W&B's own mode names


class ConfigError(ValueError):
    """A configuration that cannot be built: unknown key, wrong type, or inconsistent values."""


def _check_choice(name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ConfigError(f"{name}={value!r} is not one of {', '.join(choices)}")


@dataclass(frozen=True)
class RematPolicy:
    """What a rematerialised block keeps for its backward pass; the rest is recomputed. Names are
    the activations olmax.model.olmo3 tags (REMAT_NAMES)."""

    save: tuple[str, ...] = ()  # kept in device memory
    offload: tuple[str, ...] = ()  # moved to host memory and back (TPU and GPU only)
    save_dots: bool = False  # also keep every weight matmul's output


REMAT_NAMES = ("q_proj", "k_proj", "v_proj", "attn_out", "o_proj", "mlp_in")
_QKV = ("q_proj", "k_proj", "v_proj")

# The remat table: model.remat -> policy, None = no rematerialisation. Named, as MaxText's
# `remat_policy` is, by what they save (MaxText src/MaxText/layers/decoders.py, get_remat_policy).
REMAT_POLICIES: dict[str, Optional[RematPolicy]] = {
    "none": None,
    "full": RematPolicy(),
    # every weight matmul's output; only the elementwise work and attention are recomputed
    "save_dots": RematPolicy(save_dots=True),
    "save_qkv_proj": RematPolicy(save=_QKV),
    "save_qkv_out_proj": RematPolicy(save=_QKV + ("o_proj",)),
    # the attention half's outputs and the MLP's inputs: the backward pass recomputes attention's
    # projections and the MLP from them (MaxText's "minimal" keeps the MLP's matmuls too)
    "save_attn_mlp_inputs": RematPolicy(save=_QKV + ("attn_out", "mlp_in")),
    "offload_qkv_proj": RematPolicy(offload=_QKV),
    "offload_qkv_out_proj": RematPolicy(offload=_QKV + ("o_proj",)),
}


@dataclass(frozen=True)
class SplashBlocks:
    """Tiles of the splash attention kernel (query rows, key columns per step, key columns per
    compute step); the backward pass uses the same. 2048/2048/1024 compiles on v5p, v6e and
    Ironwood at 8192 tokens once the chip profile raises scoped VMEM to 64 MiB (docs/attention.md)."""

    q: int = 2048
    kv: int = 2048
    kv_compute: int = 1024


@dataclass(frozen=True)
class ModelConfig:
    """The OLMo 3 architecture (REFERENCE.md, Model). Defaults are the 7B."""

    vocab_size: int = 100278  # the tokenizer's vocabulary; the embedding is padded (below)
    vocab_multiple: int = 128  # embedding rows padded to a multiple of this, as OLMo-core does
    d_model: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int = 32
    head_dim: int = 128
    mlp_hidden: int = 11008
    # Layers i with (i + 1) % global_every == 0, and the last layer, attend globally; the others
    # use a window of `sliding_window` tokens (the token itself and the W-1 before it).
    # sliding_window = 0 makes every layer global.
    sliding_window: int = 4096
    global_every: int = 4
    norm_eps: float = 1e-6
    rope_theta: float = 500000.0
    rope_type: str = "default"
    yarn_factor: float = 8.0
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    yarn_original_max_position: int = 8192
    # Which layers YaRN rescales: "global" (the full-attention layers only, as transformers'
    # Olmo3Config and AI2's released long-context configs do; windowed layers keep plain RoPE)
    # or "all".
    yarn_layers: str = "global"
    max_position: int = 8192  # written to HF's max_position_embeddings
    init_std: float = 0.02  # truncated normal, cut at 3 std (OLMo-core)
    param_dtype: str = "float32"
    compute_dtype: str = "bfloat16"
    attention: str = "auto"
    splash_blocks: SplashBlocks = field(default_factory=SplashBlocks)
    remat: str = "none"  # a REMAT_POLICIES name

    def __post_init__(self):
        _check_choice("model.param_dtype", self.param_dtype, DTYPES)
        _check_choice("model.compute_dtype", self.compute_dtype, DTYPES)
        _check_choice("model.attention", self.attention, ATTENTION_BACKENDS)
        _check_choice("model.remat", self.remat, tuple(REMAT_POLICIES))
        _check_choice("model.rope_type", self.rope_type, ROPE_TYPES)
        _check_choice("model.yarn_layers", self.yarn_layers, YARN_LAYERS)
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"model.n_heads={self.n_heads} is not a multiple of model.n_kv_heads={self.n_kv_heads}"
            )
        if self.head_dim % 2:
            raise ConfigError(f"model.head_dim={self.head_dim} must be even for rotary embeddings")
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "head_dim", "mlp_hidden", "global_every"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"model.{name} must be positive, got {getattr(self, name)}")

    @property
    def padded_vocab_size(self) -> int:
        m = self.vocab_multiple
        return -(-self.vocab_size // m) * m

    def layer_rope_scaled(self, layer: int) -> bool:
        """Whether YaRN applies to this layer's rotary embedding."""
        return self.rope_type == "yarn" and (self.yarn_layers == "all" or self.layer_window(layer) is None)

    def layer_window(self, layer: int) -> Optional[int]:
        """The attention window of a layer (None = global)."""
        is_global = (layer + 1) % self.global_every == 0 or layer == self.n_layers - 1
        return None if (is_global or self.sliding_window <= 0) else self.sliding_window


@dataclass(frozen=True)
class DataConfig:
    """Training data (docs/data.md). The tokenizer fields enter OLMo-core's data fingerprint."""

    # token shards, globs, `olmax tokenize` output dirs, OLMo-core mix files (*.txt), or the
    # shipped demo corpus: "demo" (train split) / "demo:heldout"
    paths: tuple[str, ...] = ()
    seq_len: int = 8192
    # OLMo-core's max_target_sequence_length (a multiple of seq_len, or None); AI2's OLMo 3
    # stage-1 run used 8192. It changes instance counts, the order's chunking and the fingerprint.
    max_target_seq_len: Optional[int] = None
    seed: int = 34521
    tokenizer: str = "dolma2"
    vocab_size: int = 100278  # the tokenizer's vocabulary (not the padded embedding); picks the dtype
    eos_token_id: int = 100257
    pad_token_id: int = 100277
    bos_token_id: Optional[int] = None
    mix_base: Optional[str] = None  # base of mix-file paths: local dir, gs:// or http(s)://
    mix_tokenizer_dir: str = "allenai/dolma3-tokenizer"  # what {TOKENIZER} becomes in mix files
    work_dir: str = ""  # order memmaps and the tokenized demo; "" = $OLMAX_CACHE or ~/.cache/olmax
    mask_pad_token: bool = False  # OLMo-core does not; the MaxText stage-2 run did
    instance_filter: bool = False  # n-gram repetition filter; off in AI2's official run
    num_workers: int = 0  # Grain worker processes; the order does not depend on it


@dataclass(frozen=True)
class OptimizerConfig:
    lr: float = 3e-4
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    no_decay: tuple[str, ...] = ("embed",)  # parameter paths excluded from weight decay
    max_grad_norm: float = 1.0
    z_loss: float = 1e-5
    skip_step: bool = True
    skip_window: int = 128
    skip_sigma: float = 6.0


SCHEDULES = ("cosine", "stitched_cosine", "wsd", "linear", "constant")


@dataclass(frozen=True)
class ScheduleConfig:
    """LR schedules, OLMo-core semantics and 1-based step numbering (olmax.schedules, docs/training.md)."""

    name: str = "cosine"
    warmup_steps: int = 2000
    alpha_f: float = 0.1  # final LR as a fraction of optimizer.lr (cosine, stitched_cosine, wsd, linear)
    t_max_tokens: Optional[int] = None  # horizon in tokens (OLMo-core style); None = trainer.max_steps
    # stitched_cosine (AI2's stage 1): from `switch_step` on, the second half of a cosine that ends
    # at alpha_f * lr after `final_t_max_tokens` tokens.
    switch_step: int = 0
    final_t_max_tokens: Optional[int] = None
    decay_fraction: float = 0.1  # wsd: the last fraction of the horizon decays linearly

    def __post_init__(self):
        _check_choice("schedule.name", self.name, SCHEDULES)
        if self.warmup_steps < 0:
            raise ConfigError(f"schedule.warmup_steps must be >= 0, got {self.warmup_steps}")
        if not 0.0 <= self.alpha_f <= 1.0:
            raise ConfigError(f"schedule.alpha_f must be in [0, 1], got {self.alpha_f}")
        if not 0.0 <= self.decay_fraction <= 1.0:
            raise ConfigError(f"schedule.decay_fraction must be in [0, 1], got {self.decay_fraction}")
        if self.name == "stitched_cosine" and (self.switch_step <= 0 or self.final_t_max_tokens is None):
            raise ConfigError("schedule.name=stitched_cosine needs schedule.switch_step > 0 and "
                              "schedule.final_t_max_tokens")


@dataclass(frozen=True)
class TrainerConfig:
    global_batch: int = 512  # instances per optimizer step; fixed by the recipe
    # Instances per batch shard (data x fsdp device) in one forward/backward, at most the per-device
    # batch; None = the whole per-device batch at once. Accumulation steps = per-device batch / micro.
    micro_batch_size: Optional[int] = None
    # Sequence positions per chunk of the output layer + cross-entropy, so the full fp32 logits are
    # never materialised (recomputed in the backward pass); 0 = one chunk. Must divide data.seq_len.
    loss_chunk: int = 0
    max_steps: int = 1000
    log_every: int = 1  # a plain progress line every N steps when not on a terminal (metrics.jsonl has every step)
    seed: int = 0


@dataclass(frozen=True)
class MeshConfig:
    # Sizes of the mesh axes; -1 means "all remaining devices". The product must be the device count.
    data: int = 1
    fsdp: int = -1
    tensor: int = 1


@dataclass(frozen=True)
class CheckpointConfig:
    every: int = 1000
    keep: int = 3
    # parameters to start from with a fresh optimizer, or a checkpoint written by `olmax ckpt
    # warm-start` (then its moments and bias-correction counter come along too)
    init_from: Optional[str] = None
    # where the run's checkpoints go: a local path or a gs:// URL (logs and metrics stay in the run
    # directory); None: RUN_DIR/checkpoints
    dir: Optional[str] = None


@dataclass(frozen=True)
class EvalConfig:
    every: int = 0
    batches: int = 8
    data: tuple[str, ...] = ()


@dataclass(frozen=True)
class WandbConfig:
    # disabled: no W&B run; online: log to the W&B server; offline: write RUN_DIR/wandb/ only (no network;
    # upload later with `wandb sync`). Needs the `wandb` extra.
    mode: str = "disabled"
    project: str = "olmax"
    entity: Optional[str] = None
    name: Optional[str] = None  # default: the run directory's name

    def __post_init__(self):
        _check_choice("wandb.mode", self.mode, WANDB_MODES)


@dataclass(frozen=True)
class ExperimentConfig:
    name: str = "olmo3_7b"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)


C = TypeVar("C")


def _merge(base: C, *others) -> C:
    structured = OmegaConf.structured(base)
    OmegaConf.set_readonly(structured, False)
    try:
        merged = OmegaConf.merge(structured, *others)
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        # OmegaConf's message names the key and the expected type; drop its multi-line footer.
        raise ConfigError(str(e).split("\n")[0]) from None
    except TypeError as e:
        raise ConfigError(str(e)) from None


def apply_overrides(cfg: C, overrides: Sequence[str]) -> C:
    """Apply dotted `key=value` overrides (values parsed as YAML: `model.n_layers=4`, `data.paths=[a,b]`)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
    return _merge(cfg, OmegaConf.from_dotlist(list(overrides))) if overrides else cfg


def to_yaml(cfg) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_dict(cfg) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(cfg))


def save_yaml(cfg, path: str | Path) -> None:
    Path(path).write_text(to_yaml(cfg))


def load_yaml(path: str | Path, schema: type[C] = ExperimentConfig) -> C:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    return _merge(schema(), OmegaConf.load(path))


def from_dict(d: dict, schema: type[C] = ExperimentConfig) -> C:
    return _merge(schema(), OmegaConf.create(d))
