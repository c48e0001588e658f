"""Forward-only scoring of token batches on a device mesh: the pass every eval surface shares.

Given input ids and labels (IGNORE where nothing is scored), `TokenScorer` returns, per token, the
model's negative log-likelihood of the label and whether the label is the model's argmax. The
per-token values come back to the host, and every figure built from them is summed there in float64
in a fixed order, so no figure depends on how a batch was split over devices.

The NLL is olmax.objectives.cross_entropy's cross-entropy (`loss_sums`, applied per token on float32 logits). `vocab`
chooses the softmax support: the padded vocabulary (what training computes, and OLMo-core's
in-loop evaluator) or the tokenizer's real vocabulary (what a HF model computes: the lm-eval adapter
and the KL surface use it, so that a converted checkpoint gives the same numbers in both frameworks).

The output layer runs `chunk` sequence positions at a time (default OUTPUT_CHUNK; the sequence is
padded up to a multiple of it), so a (batch, seq, vocab) block of float32 logits is never held whole
(a 7B eval batch of 8 x 8192 would need 26 GB of logits): the output layer's memory does not grow
with the sequence length. Chunking changes no figure: every position's logits are the same
computation on the same hidden state.

The sequence length an eval scores at (`eval_seq_len`) is, unless the caller gives one, the
data.seq_len of the training run that wrote the checkpoint (its `experiment` item), else the model's
max_position (a converted checkpoint); it is never above max_position.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from olmax.checkpoint.store import read_experiment
from olmax.config.model import ModelConfig
from olmax.model.olmo3 import forward_hidden, lm_head, param_shardings
from olmax.model.sharding import logical_to_spec
from olmax.objectives.cross_entropy import IGNORE, loss_sums

OUTPUT_CHUNK = 256  # sequence positions per output-layer chunk: 8 x 256 x 100k float32 logits are 0.8 GB


def trained_seq_len(ckpt: str | Path, step: int) -> Optional[int]:
    """data.seq_len of the training run that wrote checkpoint `ckpt` at `step` (the experiment item
    every training checkpoint holds), or None for a checkpoint no training run wrote (a conversion)."""
    saved = read_experiment(ckpt, step)
    return None if saved is None else int(saved["data"]["seq_len"])


def eval_seq_len(seq_len: Optional[int], ckpt: str | Path, step: int, cfg: ModelConfig) -> int:
    """The sequence length an eval of checkpoint `ckpt` (at `step`, model `cfg`) scores at: `seq_len`
    when the user set one, else the checkpoint's training data.seq_len, else the model's max_position.
    A length above max_position is refused: the model was not built for positions beyond it."""
    if seq_len is None:
        seq_len = trained_seq_len(ckpt, step) or cfg.max_position
    if seq_len < 2:
        raise ValueError(f"the eval sequence length must be at least 2 tokens, got {seq_len}")
    if seq_len > cfg.max_position:
        raise ValueError(
            f"sequence length {seq_len} exceeds the max_position {cfg.max_position} of {ckpt} (step {step}), "
            f"the longest sequence the model is built for: ask for {cfg.max_position} tokens or fewer"
        )
    return seq_len


def map_seq_chunks(fn: Callable, chunk: int, *arrays):
    """`fn(*arrays)` computed on `chunk`-long slices of axis 1 (the sequence) one after another and
    concatenated back; every output of `fn` must keep (batch, seq) as its leading axes and treat
    positions independently. A sequence that is not a multiple of `chunk` is padded with zeros for
    the computation and cut back; chunk <= 0 computes the whole sequence at once."""
    t = arrays[0].shape[1]
    if chunk <= 0 or chunk >= t:
        return fn(*arrays)
    n = -(-t // chunk)
    pad = lambda a: jnp.pad(a, [(0, 0), (0, n * chunk - t)] + [(0, 0)] * (a.ndim - 2))
    split = [pad(a).reshape(a.shape[0], n, chunk, *a.shape[2:]).swapaxes(0, 1) for a in arrays]
    out = jax.lax.map(lambda xs: fn(*xs), split)
    return jax.tree.map(lambda o: o.swapaxes(0, 1).reshape(o.shape[1], n * chunk, *o.shape[3:])[:, :t], out)


def per_token_nll(logits: jnp.ndarray, labels: jnp.ndarray) -> jnp.ndarray:
    """(batch, seq) float32 cross-entropy of each label, 0 where ignored: olmax.objectives.cross_entropy per token."""
    ce, _ = jax.vmap(jax.vmap(loss_sums))(logits, labels)
    return ce


def _token_stats(params, tokens, labels, *, cfg: ModelConfig, vocab: int, chunk: int):
    hidden = forward_hidden(params, tokens, cfg)

    def head(h, y):
        logits = lm_head(params, h, cfg)[..., :vocab]
        return per_token_nll(logits, y), jnp.argmax(logits, axis=-1) == y

    return map_seq_chunks(head, chunk, hidden, labels)


def _position_stats(params, tokens, positions, labels, *, cfg: ModelConfig, vocab: int):
    """As _token_stats, with the output layer applied only at `positions` (batch, k): scoring a short
    continuation then costs k rows of the 100k-wide output layer instead of the whole sequence."""
    hidden = forward_hidden(params, tokens, cfg)
    picked = jnp.take_along_axis(hidden, positions[..., None], axis=1)
    logits = lm_head(params, picked, cfg)[..., :vocab]
    return per_token_nll(logits, labels), jnp.argmax(logits, axis=-1) == labels


def pad_rows(x: np.ndarray, multiple: int, fill) -> np.ndarray:
    """Append rows of `fill` so the row count is a multiple of `multiple` (at least one row)."""
    rows = max(1, -(-x.shape[0] // multiple)) * multiple
    if rows == x.shape[0]:
        return x
    return np.concatenate([x, np.full((rows - x.shape[0], *x.shape[1:]), fill, x.dtype)])


class TokenScorer:
    """Per-token NLL and greedy hits of one architecture on one mesh (see the module doc).

    Any batch size works on any device count: rows are padded with ignored labels up to a multiple
    of the batch shards and dropped again. Parameters are an argument of each call, so the training
    loop can score its live, already-sharded parameters.
    """

    def __init__(self, cfg: ModelConfig, mesh: Mesh, *, real_vocab: bool, chunk: int = OUTPUT_CHUNK):
        self.cfg, self.mesh = cfg, mesh
        self.vocab = cfg.vocab_size if real_vocab else cfg.padded_vocab_size
        self.batch_shards = mesh.shape["data"] * mesh.shape["fsdp"]
        # Outputs replicated: every process reads whole (batch, seq) results, as a multi-host run needs.
        replicated = NamedSharding(mesh, PartitionSpec())
        self._fn = jax.jit(
            functools.partial(_token_stats, cfg=cfg, vocab=self.vocab, chunk=chunk), out_shardings=replicated
        )
        self._at = jax.jit(functools.partial(_position_stats, cfg=cfg, vocab=self.vocab), out_shardings=replicated)

    def batch_sharding(self, shape: tuple[int, ...]) -> NamedSharding:
        return NamedSharding(self.mesh, logical_to_spec(("batch", "seq"), shape, self.mesh))

    def place(self, params: dict) -> dict:
        return jax.device_put(params, param_shardings(self.cfg, self.mesh))

    def __call__(self, params: dict, tokens: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """tokens, labels (batch, seq) -> (nll float32, greedy bool), both (batch, seq), on the host."""
        if tokens.shape != labels.shape:
            raise ValueError(f"tokens {tokens.shape} and labels {labels.shape} differ in shape")
        rows = tokens.shape[0]
        tokens = pad_rows(np.asarray(tokens, np.int32), self.batch_shards, 0)
        labels = pad_rows(np.asarray(labels, np.int32), self.batch_shards, IGNORE)
        sharding = self.batch_sharding(tokens.shape)
        nll, greedy = self._fn(params, jax.device_put(tokens, sharding), jax.device_put(labels, sharding))
        return np.asarray(nll)[:rows], np.asarray(greedy)[:rows]

    def at_positions(
        self, params: dict, tokens: np.ndarray, positions: np.ndarray, labels: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """tokens (batch, seq); positions, labels (batch, k): the label of position positions[r, j]
        (IGNORE for unused slots) -> (nll, greedy), both (batch, k), as __call__ gives there."""
        if positions.shape != labels.shape or positions.shape[0] != tokens.shape[0]:
            raise ValueError(
                f"positions {positions.shape} and labels {labels.shape} do not match tokens {tokens.shape}"
            )
        rows = tokens.shape[0]
        tokens = pad_rows(np.asarray(tokens, np.int32), self.batch_shards, 0)
        positions = pad_rows(np.asarray(positions, np.int32), self.batch_shards, 0)
        labels = pad_rows(np.asarray(labels, np.int32), self.batch_shards, IGNORE)
        put = lambda x: jax.device_put(x, self.batch_sharding(x.shape))
        nll, greedy = self._at(params, put(tokens), put(positions), put(labels))
        return np.asarray(nll)[:rows], np.asarray(greedy)[:rows]
