"""Token-level KL: exactly 0 for a checkpoint against itself, and for a perturbed copy the figures a
float64 numpy computation of KL(A||B) from the two models' logits gives, bucketed by position."""

import copy
from dataclasses import replace

import jax
import numpy as np
import pytest
from models import numpy_params, tiny_eval_model

from olmax.checkpoint.inference import eval_mesh
from olmax.checkpoint.store import save_params
from olmax.config.data import DataConfig
from olmax.evals.kl import default_buckets, eval_kl, token_kl
from olmax.model.olmo3 import abstract_params, forward

CFG = tiny_eval_model(vocab_size=300)
SEQ = 24


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kl")
    params = numpy_params(CFG, 0)
    perturbed = jax.tree.map(lambda p: p, params)
    noise = jax.random.normal(jax.random.key(1), params["lm_head"].shape) * 0.02
    perturbed["lm_head"] = params["lm_head"] + noise
    a = save_params(tmp / "a", params, CFG, {})
    b = save_params(tmp / "b", perturbed, CFG, {})
    tokens = np.random.default_rng(0).integers(0, CFG.vocab_size, 6 * SEQ).astype(np.uint16)
    shard = tmp / "000000.npy"
    tokens.tofile(shard)
    return {
        "a": str(a),
        "b": str(b),
        "params": params,
        "perturbed": perturbed,
        "data": str(shard),
        "data_cfg": DataConfig(vocab_size=CFG.vocab_size, work_dir=str(tmp / "cache")),
        "instances": tokens.reshape(6, SEQ).astype(np.int32),
    }


def run(setup, a, b):
    return eval_kl(
        setup[a],
        setup[b],
        [setup["data"]],
        seq_len=SEQ,
        batch=4,
        max_batches=None,
        buckets=[0, 4, 16],
        data_cfg=setup["data_cfg"],
    )


def test_self_kl_is_exactly_zero(setup):
    r = run(setup, "a", "a")
    assert r["instances"] == 4  # one whole batch of 4 from 6 instances
    assert r["kl_mean"] == 0.0 and r["kl_max"] == 0.0 and r["top1_agreement"] == 1.0
    assert r["loss_a"] == r["loss_b"]
    assert [b["positions"] for b in r["by_position"]] == ["0-3", "4-15", "16-23"]


def test_perturbed_kl_matches_numpy(setup):
    r = run(setup, "a", "b")
    inst = setup["instances"][:4]
    logits = jax.jit(forward, static_argnums=2)  # compiled once for both: op by op is slower
    la = np.asarray(logits(setup["params"], inst, CFG))[..., : CFG.vocab_size].astype(np.float64)
    lb = np.asarray(logits(setup["perturbed"], inst, CFG))[..., : CFG.vocab_size].astype(np.float64)
    log_a = la - np.log(np.exp(la - la.max(-1, keepdims=True)).sum(-1, keepdims=True)) - la.max(-1, keepdims=True)
    log_b = lb - np.log(np.exp(lb - lb.max(-1, keepdims=True)).sum(-1, keepdims=True)) - lb.max(-1, keepdims=True)
    kl = (np.exp(log_a) * (log_a - log_b)).sum(-1)
    assert r["kl_mean"] > 1e-5
    assert r["kl_mean"] == pytest.approx(kl.mean(), rel=1e-3)
    assert r["kl_p99"] == pytest.approx(np.percentile(kl, 99), rel=1e-3)
    assert r["top1_agreement"] == pytest.approx(float((la.argmax(-1) == lb.argmax(-1)).mean()))
    late = r["by_position"][2]
    assert late["tokens"] == 4 * 8 and late["kl_mean"] == pytest.approx(kl[:, 16:].mean(), rel=1e-3)
    assert sum(b["tokens"] for b in r["by_position"]) == r["tokens"] == 4 * SEQ
    nll_a = -np.take_along_axis(log_a[:, :-1], inst[:, 1:, None], -1).mean()
    assert r["loss_a"] == pytest.approx(nll_a, rel=1e-5)


def test_architecture_mismatch_and_buckets(setup):
    other = replace(CFG, d_model=64)
    with pytest.raises(ValueError, match="d_model: A 32, B 64"):
        token_kl(setup["params"], CFG, {}, other, setup["instances"], batch=2, mesh=eval_mesh())
    assert default_buckets(8192) == [0, 16, 64, 256, 1024, 4096]


def chunked_kl(setup, chunk):
    return token_kl(
        setup["params"],
        CFG,
        setup["perturbed"],
        CFG,
        setup["instances"],
        batch=3,
        mesh=eval_mesh(),
        buckets=[0, 4, 16],
        chunk=chunk,
    )


@pytest.fixture(scope="module")
def unchunked(setup):
    """The unchunked pass that every chunked one is compared with, computed once."""
    return chunked_kl(setup, 0)


@pytest.mark.parametrize("chunk", [5, 8])  # 5 does not divide the 24 positions: the last chunk is padded
def test_chunked_figures_are_the_unchunked_ones(setup, unchunked, chunk):
    whole, chunked = copy.deepcopy(unchunked), chunked_kl(setup, chunk)  # a copy: the comparison pops entries
    assert whole["kl_mean"] > 1e-5
    # The same figures up to float32 rounding: XLA's output-layer matmul sums in an order that depends
    # on its shape (1e-7 of a logit); a chunk scored at the wrong positions moves them by ~100%.
    buckets = chunked.pop("by_position"), whole.pop("by_position")
    for a, b in [(chunked, whole), *zip(*buckets)]:
        assert a["tokens"] == b["tokens"] and a["top1_agreement"] == b["top1_agreement"]
        assert a.pop("positions", None) == b.pop("positions", None)
        assert a == pytest.approx(b, rel=1e-6, abs=1e-6)


def test_memory_does_not_hold_the_whole_logits():
    """`olmax eval kl` at 8192 tokens on a 100k vocabulary: compiled with token_kl's default chunk, the
    pass needs less scratch memory than half of ONE (batch, seq, vocab) float32 logits block; unchunked
    it holds several (39 GB for 4 x 8192)."""
    import functools
    import inspect

    import jax.numpy as jnp

    from olmax.evals.kl import _pair_stats

    big = replace(CFG, vocab_size=100278, n_layers=1)
    chunk = inspect.signature(token_kl).parameters["chunk"].default
    params, tokens = abstract_params(big), jax.ShapeDtypeStruct((1, 8192), jnp.int32)
    fn = jax.jit(functools.partial(_pair_stats, cfg_a=big, cfg_b=big, chunk=chunk))
    scratch = fn.lower(params, params, tokens, tokens).compile().memory_analysis().temp_size_in_bytes
    assert scratch < 0.5 * 8192 * big.padded_vocab_size * 4


def test_the_cli_loss_chunk_default_is_the_library_default():
    from olmax.cli.common import LossChunkOpt
    from olmax.evals.scoring import OUTPUT_CHUNK

    assert f"default {OUTPUT_CHUNK};" in LossChunkOpt.help
