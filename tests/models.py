"""Tiny models that several test files share: olmax parameters with random norm weights, and HF /
OLMo-core models built by the references (torch, transformers and ai2-olmo-core are imported inside
the functions, so only the `parity` tests that call them need the `parity` extra)."""

from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from olmax.config.model import ModelConfig
from olmax.config.optimizer import OptimizerConfig
from olmax.convert.olmo_core import olmo3_transformer_config
from olmax.model.olmo3 import abstract_params, init_params


@partial(jax.jit, static_argnums=0)  # one program instead of an op-by-op dispatch of every draw
def random_params(cfg, key) -> dict:
    """OLMo-core's init, but with every norm weight drawn from U(0.5, 1.5) instead of 1, so a norm
    that is applied in the wrong place (or not at all) changes the outputs."""
    params = init_params(cfg, key)
    norms = {"q_norm", "k_norm", "attn_norm", "mlp_norm", "final_norm"}
    flat, treedef = jax.tree.flatten_with_path(params)
    keys = jax.random.split(jax.random.fold_in(key, 1), len(flat))
    out = []
    for (path, leaf), k in zip(flat, keys):
        if path[-1].key in norms:
            leaf = jax.random.uniform(k, leaf.shape, jnp.float32, 0.5, 1.5).astype(leaf.dtype)
        out.append(leaf)
    return jax.tree.unflatten(treedef, out)


def numpy_params(cfg, seed: int, std=None) -> dict:
    """init_params' spread (N(0, std) matrices, default cfg.init_std; unit norms) drawn with numpy: the
    jitted init's compile and its draws over a 100k-row embedding take seconds at the suite's unoptimized
    CPU compile (tests/conftest.py)."""
    rng = np.random.default_rng(seed)
    std = cfg.init_std if std is None else std
    flat, tree = jax.tree.flatten_with_path(abstract_params(cfg))
    leaves = [
        np.ones(a.shape, a.dtype) if path[-1].key.endswith("norm") else rng.normal(0, std, a.shape).astype(a.dtype)
        for path, a in flat
    ]
    return jax.tree.unflatten(tree, leaves)


SLIDING, FULL = "sliding_attention", "full_attention"


def olmax_layer_types(n_layers: int, period: int = 4) -> list[str]:
    return [FULL if (i + 1) % period == 0 or i == n_layers - 1 else SLIDING for i in range(n_layers)]


def randomize_(model, seed: int) -> None:
    """Weights with the spread of a trained model (O(1) activations, logits spread over several
    nats, norm weights far from 1), so that a wrong mapping changes the outputs a lot and argmaxes
    are not near-ties. Linear weights are (out, in) in both HF and OLMo-core."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
            elif "embed" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                scale = (2.0 if "lm_head" in name else 1.0) / p.shape[1] ** 0.5
                p.copy_(torch.randn(p.shape, generator=gen) * scale)


def make_hf_config(
    *,
    vocab=300,
    d_model=64,
    n_layers=5,
    n_heads=4,
    n_kv_heads=2,
    head_dim=None,
    mlp=96,
    window=8,
    rope=None,
    layer_types=None,
    max_position=256,
):
    """A tiny Olmo3Config, set the way transformers 5 needs: nested rope_parameters
    for both layer types, head_dim as an extra field, OLMo 3's eps, explicit eos/pad."""
    from transformers import Olmo3Config

    rope = rope or {"rope_type": "default", "rope_theta": 10000.0}
    if set(rope) != {SLIDING, FULL}:  # one RoPE for both layer types
        rope = {SLIDING: dict(rope), FULL: dict(rope)}
    extra = {"head_dim": head_dim} if head_dim else {}
    return Olmo3Config(
        vocab_size=vocab,
        hidden_size=d_model,
        intermediate_size=mlp,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=n_kv_heads,
        rms_norm_eps=1e-6,
        sliding_window=window,
        layer_types=layer_types or olmax_layer_types(n_layers),
        rope_parameters=rope,
        max_position_embeddings=max_position,
        eos_token_id=vocab - 2,
        pad_token_id=vocab - 1,
        **extra,
    )


def word_tokenizer(directory: Path, vocab: int = 300) -> str:
    """A tokenizer.json of `vocab` word-level tokens with EOS and PAD where make_hf_config puts them."""
    from tokenizers import Tokenizer, models

    words = {f"t{i}": i for i in range(vocab - 2)} | {"<|endoftext|>": vocab - 2, "<|pad|>": vocab - 1}
    path = directory / "tokenizer.json"
    Tokenizer(models.WordLevel(words, unk_token="t0")).save(str(path))
    return str(path)


def byte_level_tokenizer(path: Path, texts, vocab: int) -> str:
    """A byte-level BPE tokenizer.json of at most `vocab` ids learnt on `texts` (any text encodes), with
    <|endoftext|> as its EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok.train_from_iterator(
        list(texts), trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"], initial_alphabet=alphabet)
    )
    tok.save(str(path))
    return str(path)


def vocab_size(tokenizer_json) -> int:
    """The ids of a tokenizer.json, special tokens included."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer_json)).get_vocab_size()


def make_hf_checkpoint(path: Path, *, dtype="float32", seed=0, max_shard_size=None, **shape) -> Path:
    """Save a random tiny Olmo3ForCausalLM to `path` (save_pretrained, as the hub checkpoints are)."""
    import torch
    from transformers import Olmo3ForCausalLM

    model = Olmo3ForCausalLM(make_hf_config(**shape))
    randomize_(model, seed)
    model.to(getattr(torch, dtype)).save_pretrained(
        path, **({"max_shard_size": max_shard_size} if max_shard_size else {})
    )
    return path


def make_olmo_core_model(*, vocab=384, d_model=64, n_layers=5, n_heads=4, n_kv_heads=2, window=8, theta=10000, seed=0):
    """A tiny OLMo 3 built by ai2-olmo-core, with randomized weights."""
    cfg = olmo3_transformer_config(
        d_model=d_model,
        vocab_size=vocab,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        window=window,
        rope_theta=theta,
    )
    model = cfg.build(init_device="cpu")
    randomize_(model, seed)
    return model.eval()


def olmax_config_of(model, vocab_size: int, **fields) -> ModelConfig:
    """The ModelConfig of an OLMo-core model built by make_olmo_core_model (what a recipe would say)."""
    attn = model.blocks["0"].attention
    return ModelConfig(
        vocab_size=vocab_size,
        d_model=model.d_model,
        n_layers=model.n_layers,
        n_heads=attn.n_heads,
        n_kv_heads=attn.n_kv_heads,
        head_dim=attn.head_dim,
        mlp_hidden=model.blocks["0"].feed_forward.hidden_size,
        norm_eps=1e-6,
        **fields,
    )


def tiny_eval_model(**fields) -> ModelConfig:
    """The evaluation tests' float32 model: tiny sizes over the given vocabulary (the full dolma2 one by
    default, so the real tokenizer scores real text); `fields` change any of them."""
    sizes = dict(vocab_size=100278, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16, mlp_hidden=64)
    return ModelConfig(**{**sizes, "sliding_window": 8, "compute_dtype": "float32", **fields})


def small_model(**fields) -> ModelConfig:
    """The export and chat tests' model: 2 layers of 4 query heads of 8 over 2 key/value heads, d_model 32,
    MLP 64, window 8, over the full dolma2 vocabulary (its tokenizer's ids); `fields` change any of them."""
    sizes = dict(vocab_size=100278, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, mlp_hidden=64)
    return ModelConfig(**{**sizes, "sliding_window": 8, **fields})


# The one-layer model the train-step tests (LM, SFT, DPO, GRPO) run on one device and on eight.
STEP_MODEL = ModelConfig(
    vocab_size=250,
    d_model=32,
    n_layers=1,
    n_heads=4,
    n_kv_heads=2,
    head_dim=8,
    mlp_hidden=64,
    sliding_window=8,
    compute_dtype="float32",
)
# For "the step equals its loss + AdamW by hand" tests: eps 1 makes the first AdamW step g / (|g| + 1),
# a well-conditioned function of the gradient, so equal parameters after it mean equal gradients (at
# torch's 1e-8 it is ~sign(g): ill-conditioned wherever g is near 1e-8); lr 1 keeps the step's size
# that of the gradient.
ONE_STEP_ADAMW = OptimizerConfig(lr=1.0, b2=0.999, eps=1.0, weight_decay=0.0, z_loss=0.0, skip_step=False)


def one_train_step(cfg, n_devices: int, params: dict, batch: dict) -> tuple[dict, dict]:
    """One olmax train step from `params` on the first n_devices devices: (parameters after, metrics)."""
    from olmax.model.sharding import make_mesh
    from olmax.step.state import init_train_state
    from olmax.step.train_step import make_train_step

    mesh = make_mesh(cfg.mesh, jax.devices()[:n_devices])
    with jax.set_mesh(mesh):
        state = init_train_state(cfg, mesh, jax.random.key(0), params=params)
        state, metrics = make_train_step(cfg, mesh)(state, {k: jnp.asarray(v) for k, v in batch.items()})
    return jax.device_get(state.params), {k: float(v) for k, v in metrics.items()}
