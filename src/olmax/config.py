"""Typed, frozen configuration for every part of olmax, composed into one `ExperimentConfig`.

Configs are plain frozen dataclasses; olmax.config_io reads and writes them as YAML and applies dotted
`key=value` overrides (OmegaConf, type-checked). Every check that needs neither devices
nor data runs in the dataclasses' `__post_init__`, so a config that `olmax config` and
`olmax train --dry-run` accept is one the trainer accepts too, up to the device count (the batch split
over devices) and the data.
Named presets live in `olmax.recipes`.

Every field carries its help text as an attribute docstring: the string literal on the line(s) right
under it. `config_io.field_help` reads them and `olmax config --explain` prints them; a new field needs one
(tests/test_config.py fails for a field without it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from olmax.config_dpo import DPOConfig, check_dpo
from olmax.config_grpo import GRPOConfig, RewardsConfig, check_grpo
from olmax.config_run import CheckpointConfig, EvalConfig, WandbConfig
from olmax.config_schedule import ScheduleConfig
from olmax.errors import ConfigError, check_choice, check_non_negative, check_positive
from olmax.remat import check_remat

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
OBJECTIVES = ("lm", "dpo", "grpo")
LOSS_NORMALISATIONS = ("global", "per_rank")

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


def check_context(cfg: "ExperimentConfig", context: int) -> None:
    """What a context axis of `context` devices needs of the rest of the config: the sequence splits
    into `context` equal chunks, the output layer's chunks (trainer.loss_chunk) fit one of them, a
    named backend has a context-parallel form, and a named splash backend's tiles fit its queries.
    `auto` resolves to splash only when the platform is known: the trainer checks it then
    (olmax.train_step.batch_layout)."""
    seq_len, chunk = cfg.data.seq_len, cfg.trainer.loss_chunk
    if cfg.model.attention not in ("auto", *CONTEXT_BACKENDS):
        raise ConfigError(
            f"model.attention={cfg.model.attention} has no context-parallel form (jax's cuDNN call cannot offset "
            f"its causal mask to a chunk of the sequence): with mesh.context={context} use model.attention=auto "
            f"(it runs xla instead of cudnn on GPUs) or one of {', '.join(CONTEXT_BACKENDS)}"
        )
    if seq_len % context:
        raise ConfigError(
            f"data.seq_len={seq_len} is not divisible by mesh.context={context}: the context axis splits every "
            "sequence into that many equal chunks"
        )
    if chunk and (seq_len // context) % chunk:
        raise ConfigError(
            f"trainer.loss_chunk={chunk} does not divide one context chunk of the sequence "
            f"(data.seq_len / mesh.context = {seq_len // context})"
        )
    if cfg.model.attention == "splash":
        cfg.model.splash_blocks.tiles(seq_len, context)


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
    compiler fits in the devices' memory: olmax.remat_search), a name of REMAT_POLICIES (none, full:
    recompute the whole block, save_dots: keep every weight matmul's output, or a policy named by the
    activations it keeps or offloads to host memory), or the activations to keep as comma-separated
    tags of REMAT_TAGS, e.g. q_proj,k_proj,v_proj,attn_context (docs/model.md)."""
    remat_serial: bool = False
    """With remat: the backward pass finishes each block, its weight gradients included, before it
    recomputes the block below (optimization barriers); false leaves that order to the compiler.
    Changes memory, never values; which is leaner depends on the step (docs/performance.md). auto
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


@dataclass(frozen=True)
class DataConfig:
    """Training data (docs/data.md). The tokenizer fields enter OLMo-core's data fingerprint."""

    paths: tuple[str, ...] = ()
    """Training data: token shards (local, gs://, http(s)://), globs, `olmax tokenize` output dirs,
    OLMo-core mix files (*.txt), or the shipped demo corpus "demo" (train split) / "demo:heldout"."""
    seq_len: int = 8192
    """Tokens per training instance."""
    max_target_seq_len: Optional[int] = None
    """OLMo-core's max_target_sequence_length (a multiple of seq_len, or None); AI2's OLMo 3 stage-1 run
    used 8192. It changes instance counts, the order's chunking and the fingerprint."""
    seed: int = 34521
    """Seed of the data order: epoch e is shuffled with PCG64(seed + e), as OLMo-core."""
    tokenizer: str = "dolma2"
    """Tokenizer that jsonl eval sets (eval.data) are tokenized with: "dolma2" or a tokenizer.json path."""
    vocab_size: int = 100278
    """The tokenizer's vocabulary (not the padded embedding): picks the shards' dtype, bounds the token
    check, enters the fingerprint."""
    eos_token_id: int = 100257
    """End-of-document token (dolma2's); enters the fingerprint."""
    pad_token_id: int = 100277
    """Padding token (dolma2's); enters the fingerprint, and is masked from the loss with mask_pad_token."""
    bos_token_id: Optional[int] = None
    """Beginning-of-document token, None for dolma2; enters the fingerprint."""
    mix_base: Optional[str] = None
    """Base that mix-file paths are joined to: a local dir, gs:// or http(s)://."""
    mix_tokenizer_dir: str = "allenai/dolma3-tokenizer"
    """What {TOKENIZER} becomes in mix-file paths."""
    work_dir: str = ""
    """Cache of order memmaps and tokenized demo/eval text; "" = $OLMAX_CACHE or ~/.cache/olmax."""
    mask_pad_token: bool = False
    """Leave pad-token labels out of the loss. OLMo-core does not; the MaxText stage-2 run did."""
    instance_filter: bool = False
    """Mask instances with a long n-gram repetition out of the loss (docs/data.md); off in AI2's official run."""
    num_workers: int = 0
    """Grain worker processes for the loader (0: in the training process); the order does not depend on it."""
    packing: str = "none"
    """How instances are cut: "none" (each file concatenated and chunked, OLMo-core's NumpyFSLDataset) or
    "obfd" (whole documents packed by best-fit decreasing and padded, NumpyPackedFSLDataset; docs/data.md)."""
    source_group_size: int = 1
    """obfd: files packed together as one stream, in consecutive groups of this many (AI2's stage 3: 8)."""
    source_permutation_seed: Optional[int] = None
    """Shuffle the file order with Python's random.Random(seed) before anything else (AI2's stage 3: 123)."""
    long_doc_strategy: str = "truncate"
    """obfd: a document longer than seq_len keeps its first seq_len tokens ("truncate") or is cut into
    pieces ("fragment")."""
    doc_masking: bool = False
    """Send each instance's document lengths with the batch (OLMo-core's generate_doc_lengths); either
    packing. Training keeps attention within each document (docs/attention.md); `olmax data order` shows them."""
    label_masks: bool = False
    """obfd, SFT data: read `labels_mask_part_N.npy` beside each `token_ids_part_N.npy` (AI2's layout,
    `olmax tokenize --chat`) and train only on the tokens it marks (OLMo-core's label_mask_paths)."""
    use_array_if_local: Optional[bool] = None
    """obfd: where a local file's document boundaries come from, as OLMo-core 3.0.0's option of this name:
    null or true scan it for EOS; false reads the `.csv.gz` beside it (a URL always does). Chat parts whose
    manifest counts conversations `without_final_eos` or with `eos_inside` need false (docs/data.md, "Chat
    parts"); set on both sides it enters the fingerprint."""

    def __post_init__(self):
        check_positive("data", self, "seq_len", "vocab_size")
        check_non_negative("data", self, "num_workers")
        self._check_packing()
        target = self.max_target_seq_len
        if target is not None and (target < self.seq_len or target % self.seq_len):
            raise ConfigError(
                f"data.max_target_seq_len={target} must be a multiple of data.seq_len={self.seq_len} (or null)"
            )

    def _check_packing(self) -> None:
        if self.packing not in ("none", "obfd"):
            raise ConfigError(f"data.packing must be none or obfd, got {self.packing!r}")
        if self.long_doc_strategy not in ("truncate", "fragment"):
            raise ConfigError(f"data.long_doc_strategy must be truncate or fragment, got {self.long_doc_strategy!r}")
        if not isinstance(self.source_group_size, int) or self.source_group_size < 1:
            raise ConfigError(f"data.source_group_size must be a positive integer, got {self.source_group_size!r}")
        if self.packing == "none":
            only_packed = (
                ("source_group_size", 1),
                ("long_doc_strategy", "truncate"),
                ("label_masks", False),
                ("use_array_if_local", None),
            )
            for name, default in only_packed:
                if getattr(self, name) != default:
                    raise ConfigError(f"data.{name} applies to packed documents only: set data.packing=obfd")
        elif self.max_target_seq_len is not None:
            raise ConfigError(
                "data.max_target_seq_len does not apply with data.packing=obfd (packed instances are whole "
                "documents, OLMo-core's NumpyPackedFSLDataset has no such field): set it to null"
            )
        # OLMo-core 3.0.0 asserts this in its OBFD packer (olmo_core/data/utils.py, SegmentTree); any
        # other length has no OLMo-core result for olmax to match.
        if self.packing == "obfd" and self.seq_len & (self.seq_len - 1):
            raise ConfigError(
                f"data.seq_len={self.seq_len} with data.packing=obfd must be a power of 2 (OLMo-core 3.0.0's "
                "OBFD packer asserts it)"
            )


@dataclass(frozen=True)
class OptimizerConfig:
    """AdamW with OLMo-core's skip-step rule, clipping and z-loss (olmax.optim, docs/training.md)."""

    lr: float = 3e-4
    """Peak learning rate; the schedule scales it."""
    b1: float = 0.9
    """AdamW beta1 (first-moment decay)."""
    b2: float = 0.95
    """AdamW beta2 (second-moment decay)."""
    eps: float = 1e-8
    """AdamW epsilon, added to the bias-corrected sqrt of the second moment."""
    weight_decay: float = 0.1
    """Decoupled weight decay, multiplied by the learning rate."""
    no_decay: tuple[str, ...] = ("embed",)
    """Parameter paths excluded from weight decay (a path or any prefix of one, e.g. "embed"); an entry
    that matches no parameter is an error."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this."""
    z_loss: float = 1e-5
    """Multiplier of the z-loss, logsumexp(logits)^2 per token; 0 turns it off."""
    skip_step: bool = True
    """Skip the update of a step whose loss or gradient norm spikes (OLMo-core's SkipStepAdamW)."""
    skip_window: int = 128
    """Skip-step: how many past steps' loss and gradient norm the spike test compares against."""
    skip_sigma: float = 6.0
    """Skip-step: a step is skipped when its loss or gradient norm exceeds the window's mean by this many stds."""

    def __post_init__(self):
        check_positive("optimizer", self, "lr", "max_grad_norm", "skip_sigma")
        check_non_negative("optimizer", self, "eps", "weight_decay", "z_loss")
        for name in ("b1", "b2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"optimizer.{name} must be in [0, 1), got {getattr(self, name)}")
        if self.skip_window < 2:
            raise ConfigError(f"optimizer.skip_window must be >= 2, got {self.skip_window}")


@dataclass(frozen=True)
class TrainerConfig:
    """The training loop (olmax.train, olmax.train_step)."""

    global_batch: int = 512
    """Instances per optimizer step, over all devices; part of the recipe (it enters the data order)."""
    micro_batch_size: Optional[int] = None
    """Instances per batch shard (data x fsdp device) in one forward/backward, at most the per-device batch;
    None = the whole per-device batch at once. Gradient accumulation steps = per-device batch / micro_batch_size."""
    loss_chunk: int = 0
    """Sequence positions per chunk of the output layer + cross-entropy, so the full fp32 logits are never
    materialised (recomputed in the backward pass); 0 = one chunk. Must divide data.seq_len."""
    max_steps: Optional[int] = 1000
    """The last step of the run (and the schedule's horizon when it has no token or epoch horizon); null =
    the end of the schedule's epoch horizon (schedule.t_max_epochs x the global batches in an epoch, as
    OLMo-core's Duration.epochs ends a run), counted when the run opens its data and written to the run's
    config.yaml."""
    log_every: int = 1
    """A plain progress line every N steps when not on a terminal (metrics.jsonl has every step)."""
    seed: int = 0
    """Seed of the parameter initialisation (the data order has its own, data.seed)."""
    objective: str = "lm"
    """What the step minimises: "lm" (next-token cross-entropy over data.paths), "dpo" (direct
    preference optimisation over `olmax tokenize --chat` preference pairs, the `dpo` section; then
    global_batch and micro_batch_size count pairs, two sequences each) or "grpo" (OlmoRL's policy
    loss over packed rollout rows, the `grpo` section; global_batch counts packed rows per optimizer
    step); docs/post-training.md."""
    loss_normalisation: str = "global"
    """What the LM loss divides by (trainer.objective=lm): "global", the loss tokens of the whole
    global batch (the same step on any mesh or micro-batching); "per_rank", OLMo-core's: the global
    batch is dealt to trainer.loss_ranks data-parallel ranks as OLMo-core's loader deals it (instance i
    to rank i mod loss_ranks), each rank's sums are divided by its own loss tokens and the ranks are
    averaged (docs/post-training.md, "Loss normalisation")."""
    loss_ranks: Optional[int] = None
    """The data-parallel ranks of the OLMo-core run that loss_normalisation=per_rank reproduces (AI2's
    7B Think SFT: 32, 7B Instruct: 16), whatever olmax's mesh; must divide global_batch."""

    def __post_init__(self):
        # Whether the batch splits over the devices is the trainer's check (olmax.train_step.batch_layout).
        check_choice("trainer.objective", self.objective, OBJECTIVES)
        check_positive("trainer", self, "global_batch", "log_every")
        if self.max_steps is not None:
            check_positive("trainer", self, "max_steps")
        check_non_negative("trainer", self, "loss_chunk")
        if self.micro_batch_size is not None:
            check_positive("trainer", self, "micro_batch_size")
        self._check_loss_normalisation()

    def _check_loss_normalisation(self) -> None:
        check_choice("trainer.loss_normalisation", self.loss_normalisation, LOSS_NORMALISATIONS)
        if self.loss_normalisation == "global":
            if self.loss_ranks is not None:  # a rank count without per_rank would be silently unused
                raise ConfigError(
                    f"trainer.loss_ranks={self.loss_ranks} is only used with trainer.loss_normalisation=per_rank"
                )
            return
        if self.objective != "lm":
            raise ConfigError(
                f"trainer.loss_normalisation=per_rank is for trainer.objective=lm, not {self.objective} "
                "(its loss has its own normalisation)"
            )
        if self.loss_ranks is None:
            raise ConfigError(
                "trainer.loss_normalisation=per_rank needs trainer.loss_ranks, the data-parallel ranks of the "
                "OLMo-core run it reproduces"
            )
        check_positive("trainer", self, "loss_ranks")
        if self.global_batch % self.loss_ranks:
            raise ConfigError(
                f"trainer.loss_ranks={self.loss_ranks} does not divide trainer.global_batch={self.global_batch} "
                "(OLMo-core deals the global batch evenly over its ranks)"
            )


@dataclass(frozen=True)
class MeshConfig:
    """Sizes of the device mesh axes (olmax.sharding); -1 means "all remaining devices" (one axis at most).
    The product must be the device count."""

    data: int = 1
    """Data parallelism with replicated parameters: the batch is split over it."""
    fsdp: int = -1
    """Fully sharded data parallelism: the batch is split over it and parameters and optimizer moments
    are sharded along their embed dimension."""
    context: int = 1
    """Context parallelism: every sequence is cut into this many contiguous chunks, one per device along
    the axis (activations, batch and loss stay split so); attention gathers keys and values over it
    (docs/attention.md). data.seq_len must divide by it."""
    tensor: int = 1
    """Tensor parallelism: heads, MLP hidden units and the vocabulary are split over it."""

    def __post_init__(self):
        for name in ("data", "fsdp", "context", "tensor"):
            size = getattr(self, name)
            if not isinstance(size, int) or (size < 1 and size != -1):
                raise ConfigError(
                    f"mesh.{name} must be a positive integer or -1 (the rest of the devices), got {size!r}"
                )


@dataclass(frozen=True)
class ExperimentConfig:
    """Everything a run needs; what `olmax train` resolves from a recipe or YAML file plus overrides."""

    name: str = "olmo3_7b"
    """Name of the experiment (a recipe sets its own name); saved with the config in every checkpoint."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The architecture and its numerics."""
    data: DataConfig = field(default_factory=DataConfig)
    """Training data, tokenizer ids and the data order."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """AdamW, skip-step, clipping, z-loss."""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """The learning-rate schedule."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Batch size, micro-batching, steps, logging, init seed."""
    mesh: MeshConfig = field(default_factory=MeshConfig)
    """How devices are arranged for data, FSDP and tensor parallelism."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Where and how often checkpoints are saved, and what the run starts from."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """In-loop held-out evaluation."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """The optional W&B writer."""
    dpo: DPOConfig = field(default_factory=DPOConfig)
    """The DPO loss (trainer.objective=dpo)."""
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    """GRPO, the RL objective (trainer.objective=grpo): its loss and the RL loop's settings."""
    rewards: RewardsConfig = field(default_factory=RewardsConfig)
    """The verifiers the RL loop scores responses with."""

    def __post_init__(self):
        chunk, seq_len = self.trainer.loss_chunk, self.data.seq_len
        if chunk and seq_len % chunk:
            raise ConfigError(f"trainer.loss_chunk={chunk} does not divide data.seq_len={seq_len}")
        if self.mesh.context > 1:  # -1 (the rest of the devices) is checked when the mesh is built
            check_context(self, self.mesh.context)
        if self.trainer.max_steps is None and self.schedule.t_max_epochs is None:
            raise ConfigError(
                "trainer.max_steps=null ends the run at the schedule's epoch horizon, which needs "
                "schedule.t_max_epochs: set that, or trainer.max_steps to a number of steps"
            )
        model, data = self.model, self.data
        if data.doc_masking and model.attention not in ("auto", *MASKING_BACKENDS):
            raise ConfigError(
                f"data.doc_masking=true needs attention masked within documents, which model.attention="
                f"{model.attention} cannot do (jax's cuDNN call takes no segment ids); use model.attention=auto "
                f"(it runs xla instead of cudnn on GPUs) or one of {', '.join(MASKING_BACKENDS)}"
            )
        if model.rope_positions == "document" and not data.doc_masking:
            raise ConfigError(
                "model.rope_positions=document restarts positions at each document, which needs the documents: "
                "set data.doc_masking=true (or model.rope_positions=absolute)"
            )
        if self.trainer.objective == "dpo":
            check_dpo(self)
        elif self.trainer.objective == "grpo":
            check_grpo(self)

    @property
    def rows_per_step(self) -> int:
        """Sequences of data.seq_len in one optimizer step: trainer.global_batch, twice that for DPO (a pair is
        a chosen and a rejected row; a GRPO row is one packed row)."""
        return self.trainer.global_batch * (2 if self.trainer.objective == "dpo" else 1)
