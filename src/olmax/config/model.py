"""The `model` section: the OLMo 3 architecture and its numerics (precision, attention backend,
rematerialisation), with the checks that need neither devices nor data, and the one answer to "is
this the same model?" (ModelConfig.architecture_changes). docs/model.md."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from olmax.config.remat import check_remat
from olmax.errors import ConfigError, check_choice, check_positive

DTYPES = ("float32", "bfloat16", "float16")

# `auto` picks by the platform the step compiles for (olmax.model.attention.resolve_backend).
ATTENTION_BACKENDS = ("auto", "xla", "cudnn", "splash")
MASKING_BACKENDS = ("xla", "splash")  # those that take segment ids (attention within documents)

# Those with a context-parallel form (keys and values gathered over `context` in a shard_map). jax's
# cuDNN call aligns its causal mask at the first key, so a chunk of queries against the whole
# sequence's keys cannot be written as one call (docs/attention.md, "Context parallelism").
CONTEXT_BACKENDS = ("xla", "splash")
ROPE_TYPES = ("default", "yarn")
ROPE_POSITIONS = ("absolute", "document")
YARN_LAYERS = ("global", "all")

# "Is this the same model?" has one answer, ModelConfig.architecture_changes. A run that continues
# from another run's weights (a resume, checkpoint.init_from, a warm start) may change:
# - how the same weights are computed: precision, attention kernel, rematerialisation;
RUNTIME_FIELDS = ("param_dtype", "compute_dtype", "attention", "splash_blocks", "remat", "remat_serial")

# - the context it is trained for, as AI2's long-context stage extends the stage-2 model with YaRN
#   and a longer max_position (a resume of the same run lists these as config changes);
CONTEXT_FIELDS = (
    "rope_type",
    "yarn_factor",
    "yarn_beta_fast",
    "yarn_beta_slow",
    "yarn_original_max_position",
    "yarn_layers",
    "max_position",
    "rope_positions",
)

# - the random init, which a continued run does not use.
# Every other ModelConfig field is the architecture.
NOT_ARCHITECTURE = frozenset(RUNTIME_FIELDS + CONTEXT_FIELDS + ("init_std",))


@dataclass(frozen=True)
class SplashBlocks:
    """Tiles of the splash attention kernel (query rows, key columns per step, key columns per
    compute step); the backward pass uses the same. 2048/2048/1024 compiles on v5p, v6e and
    Ironwood at 8192 tokens once the chip profile raises scoped VMEM to 64 MiB (docs/attention.md)."""

    q: int = 2048
    """Query rows per tile."""
    kv: int = 2048
    """Key columns per tile."""
    kv_compute: int = 1024
    """Key columns per compute step within a tile (divides kv)."""

    def tiles(self, seq_len: int, context: int = 1) -> tuple[int, int, int]:
        """The (q, kv, kv_compute) tiles for a sequence whose queries are split into `context` chunks (a
        tile longer than its span becomes the span), or a ConfigError naming the knobs: each tile a
        multiple of 128 (the kernel's lane width) that divides its span; kv_compute divides kv."""
        spans = {"q": seq_len // context, "kv": seq_len, "kv_compute": seq_len}
        tiles = {name: min(getattr(self, name), span) for name, span in spans.items()}
        for name, tile in tiles.items():
            if spans[name] % tile or tile % 128:
                span = f"seq_len={seq_len}" + (f" / mesh.context={context}" if name == "q" and context > 1 else "")
                raise ConfigError(
                    f"attention backend 'splash': its {name} tile {tile} (model.splash_blocks.{name}, at most "
                    f"the span) must be a multiple of 128 that divides {span}"
                )
        if tiles["kv"] % tiles["kv_compute"]:
            raise ConfigError(
                f"model.splash_blocks.kv_compute={tiles['kv_compute']} must divide model.splash_blocks.kv={tiles['kv']}"
            )
        return tiles["q"], tiles["kv"], tiles["kv_compute"]


@dataclass(frozen=True)
class ModelConfig:
    """The OLMo 3 architecture (docs/reference.md, "Model"). Defaults are the 7B."""

    vocab_size: int = 100278
    """Tokens in the tokenizer's vocabulary (dolma2: 100278); the embedding and LM head have
    `padded_vocab_size` rows."""
    vocab_multiple: int = 128
    """Embedding and LM-head rows are padded up to a multiple of this, as OLMo-core does (100278 -> 100352)."""
    d_model: int = 4096
    """Width of the residual stream."""
    n_layers: int = 32
    """Number of transformer blocks."""
    n_heads: int = 32
    """Query heads per layer."""
    n_kv_heads: int = 32
    """Key/value heads per layer; n_heads must be a multiple of it (fewer than n_heads: grouped-query attention)."""
    head_dim: int = 128
    """Width of one attention head (even, for rotary embeddings)."""
    mlp_hidden: int = 11008
    """Hidden width of the SwiGLU MLP (the gate and up projections)."""
    sliding_window: int = 4096
    """Attention window of the windowed layers, in tokens: a token sees itself and the W-1 before it.
    0 makes every layer global."""
    global_every: int = 4
    """Layers i with (i + 1) % global_every == 0, and the last layer, attend globally; the others use
    `sliding_window`."""
    norm_eps: float = 1e-6
    """Epsilon of every RMSNorm (computed in float32)."""
    rope_theta: float = 500000.0
    """Base of the rotary embedding frequencies."""
    rope_type: str = "default"
    """Rotary embedding: "default" (plain RoPE) or "yarn" (YaRN context extension, the yarn_* fields)."""
    yarn_factor: float = 8.0
    """YaRN: how many times longer than `yarn_original_max_position` the extended context is."""
    yarn_beta_fast: float = 32.0
    """YaRN: frequencies that turn more often than this over the original context keep their RoPE value."""
    yarn_beta_slow: float = 1.0
    """YaRN: frequencies that turn less often than this are divided by `yarn_factor`; those between
    the two betas are blended."""
    yarn_original_max_position: int = 8192
    """YaRN: the context length the model was trained at before the extension."""
    yarn_layers: str = "global"
    """Which layers YaRN rescales: "global" (the full-attention layers only, as transformers'
    Olmo3Config and AI2's released long-context configs do; windowed layers keep plain RoPE) or "all"."""
    rope_positions: str = "absolute"
    """Rotary positions of packed documents (with data.doc_masking): "absolute" (0..seq_len-1 across the
    instance, as AI2's stage-3 run had them) or "document" (each document's positions start at 0;
    docs/model.md)."""
    max_position: int = 8192
    """The context length the model is meant for, written to HF's max_position_embeddings on export;
    the forward pass does not enforce it."""
    init_std: float = 0.02
    """Std of the truncated-normal initialisation (cut at 3 std) of every linear and embedding weight, as OLMo-core."""
    param_dtype: str = "float32"
    """dtype the parameters are stored and updated in (the master weights); optimizer moments are float32 always."""
    compute_dtype: str = "bfloat16"
    """dtype of the matmuls and activations; norms, RoPE, softmax statistics and the loss stay float32."""
    attention: str = "auto"
    """Attention backend: auto (splash on TPU, cudnn on GPU, xla on CPU, from the platform the step
    compiles for; xla on GPU with documents masked or a context axis), xla (any device), cudnn (NVIDIA
    GPUs; no document mask, no mesh.context) or splash (TPUs); docs/attention.md."""
    splash_blocks: SplashBlocks = field(default_factory=SplashBlocks)
    """Tile sizes of the splash attention kernel (TPU)."""
    remat: str = "none"
    """Per-block recomputation in the backward pass: auto (the least recompute, and the order, that the
    compiler fits in the devices' memory: olmax.fit.remat_search), a name of REMAT_POLICIES (none, full:
    recompute the whole block, save_dots: keep every weight matmul's output, or a policy named by the
    activations it keeps or offloads to host memory), or the activations to keep as comma-separated
    tags of REMAT_TAGS, e.g. q_proj,k_proj,v_proj,attn_context (docs/model.md)."""
    remat_serial: bool = False
    """With remat: the backward pass finishes each block, its weight gradients included, before it
    recomputes the block below (optimization barriers); false leaves that order to the compiler.
    Changes memory, never values; which is leaner depends on the step (docs/performance/remat.md). auto
    chooses it."""

    def __post_init__(self):
        check_choice("model.param_dtype", self.param_dtype, DTYPES)
        check_choice("model.compute_dtype", self.compute_dtype, DTYPES)
        check_choice("model.attention", self.attention, ATTENTION_BACKENDS)
        check_remat(self.remat, self.remat_serial)  # a clear error for an unknown name or tag
        check_choice("model.rope_type", self.rope_type, ROPE_TYPES)
        check_choice("model.yarn_layers", self.yarn_layers, YARN_LAYERS)
        check_choice("model.rope_positions", self.rope_positions, ROPE_POSITIONS)
        sizes = (
            "vocab_size",
            "vocab_multiple",
            "d_model",
            "n_layers",
            "n_heads",
            "n_kv_heads",
            "head_dim",
            "mlp_hidden",
        )
        check_positive("model", self, *sizes, "global_every")  # first: the checks below divide by them
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"model.n_heads={self.n_heads} is not a multiple of model.n_kv_heads={self.n_kv_heads}")
        if self.head_dim % 2:
            raise ConfigError(f"model.head_dim={self.head_dim} must be even for rotary embeddings")

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

    def changes_from(self, stored: "ModelConfig", fields=None) -> str:
        """'mlp_hidden 128 -> 256, ...' for the fields (default: all) where `stored` differs ('' when none)."""
        names = [f for f in sorted(self.__dataclass_fields__) if fields is None or f in fields]
        return ", ".join(
            f"{f} {getattr(stored, f)} -> {getattr(self, f)}" for f in names if getattr(stored, f) != getattr(self, f)
        )

    def architecture_changes(self, stored: "ModelConfig") -> str:
        """The architecture fields (all but NOT_ARCHITECTURE) where `stored`, the model a checkpoint
        holds, differs from this one; '' when this model may continue from its weights."""
        return self.changes_from(stored, set(self.__dataclass_fields__) - NOT_ARCHITECTURE)
