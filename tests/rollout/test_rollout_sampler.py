"""The rollout sampler (olmax.rollout.sampler.sample), on a 2-layer model (a window-4 layer and a
global one, global_every 2) so the rings wrap within the rollout:

- the sampler's per-token log-probs equal the trainer's (olmax.model.olmo3.forward on prompt + new
  tokens, log_softmax(logits / T) over the real vocabulary) within 1e-5 in float32: the sampler-trainer
  gap is zero;
- n samples per prompt (prefill once, cache rows repeated): each sample its own draws (and the
  log-prob proof above holds for every one of them);
- rows stop at EOS ids and at a text-stop automaton's end, each with its finish reason;
- on 8 CPU devices (data 2 x fsdp 2 x tensor 2: parameters as the trainer shards them, the cache's
  batch and kv heads split) the tokens and log-probs are those of one device.

Greedy against transformers' `generate` on the HF export: test_hf_export.py and test_evals_chat.py;
the public `generate` keying and stops: test_generate.py."""

import jax
import numpy as np
import pytest
from models import random_params, small_model

from olmax.config.mesh import MeshConfig
from olmax.model.olmo3 import forward, param_shardings
from olmax.model.sharding import make_mesh
from olmax.rollout.sampler import FINISH, Sampling, sample

CFG = small_model(vocab_size=300, global_every=2, sliding_window=4, compute_dtype="float32")
HOT = Sampling(temperature=0.8, top_k=40, top_p=0.95, seed=5)
# an automaton that never stops (olmax.rollout.text.stop_table's form): the rollouts without stop strings
# run the program of those with them (a text table of the same shape), compiled once
NEVER = np.zeros((2, CFG.vocab_size), np.int32)


@pytest.fixture(scope="module")
def setup():
    params = random_params(CFG, jax.random.key(2))
    params["lm_head"] = params["lm_head"] * 20  # peaked distributions, and some spread
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, CFG.vocab_size, n).tolist() for n in (3, 9)]  # ragged: right padding
    rollout = sample(params, CFG, prompts, 12, n=4, sampling=HOT, stop_text=NEVER)
    return params, prompts, rollout


def test_logprobs_equal_the_trainers_forward(setup):
    params, prompts, out = setup
    tokens, logprobs = np.asarray(out.tokens), np.asarray(out.logprobs)
    assert tokens.shape == logprobs.shape == (8, 12) and logprobs.dtype == np.float32
    assert (np.asarray(out.lengths) == 12).all() and {FINISH[f] for f in np.asarray(out.finish)} == {"length"}
    seqs = np.zeros((8, 32), np.int32)  # the trainer's view: prompt + new tokens, right-padded
    for r in range(8):
        prompt = prompts[r // 4]
        seqs[r, : len(prompt) + 12] = prompt + tokens[r].tolist()
    logits = np.asarray(jax.jit(forward, static_argnums=2)(params, seqs, CFG))[..., : CFG.vocab_size]
    logp = jax.nn.log_softmax(logits / HOT.temperature, axis=-1)
    for r in range(8):
        first = len(prompts[r // 4]) - 1  # the logits that chose new token 0
        want = np.take_along_axis(np.asarray(logp[r, first : first + 12]), tokens[r][:, None], axis=1)[:, 0]
        np.testing.assert_allclose(logprobs[r], want, atol=1e-5, rtol=0)
    # each sample its own draws: a prompt's 4 samples differ
    assert all(len({tuple(tokens[r]) for r in range(g * 4, g * 4 + 4)}) == 4 for g in range(2))


def test_rows_stop_at_eos_and_stop_text(setup):
    params, prompts, out = setup
    tokens = np.asarray(out.tokens)  # the draws are keyed by (row, step): stops only cut the rows
    eos = int(tokens[0, 5])  # row 0 ends at its 6th token (or earlier, if that id came before)
    pair = tokens[5, 2:4].tolist()  # row 5 ends after its 3rd and 4th tokens (or an earlier match)
    # the text-stop automaton (olmax.rollout.text.stop_table's form) of a string spelled by this pair
    # alone: state 1 after its first token, -1 where its second completes it
    automaton = NEVER.copy()
    automaton[:, pair[0]] = 1
    automaton[1, pair[1]] = -1
    got = sample(params, CFG, prompts, 12, n=4, sampling=HOT, eos_ids=[eos], stop_text=automaton)
    lengths, finish = np.asarray(got.lengths), [FINISH[f] for f in np.asarray(got.finish)]
    for r in range(8):
        row = tokens[r].tolist()
        at_eos = row.index(eos) + 1 if eos in row else 99
        at_pair = next((k + 2 for k in range(11) if row[k : k + 2] == pair), 99)
        want = min(at_eos, at_pair, 12)
        assert lengths[r] == want and finish[r] == {at_eos: "eos", at_pair: "stop", 12: "length"}[want]
        np.testing.assert_array_equal(np.asarray(got.tokens)[r, :want], tokens[r, :want])
        np.testing.assert_array_equal(np.asarray(got.logprobs)[r, :want], np.asarray(out.logprobs)[r, :want])
        assert (np.asarray(got.tokens)[r, want:] == 0).all() and (np.asarray(got.logprobs)[r, want:] == 0).all()
    assert lengths[0] <= 6 and lengths[5] <= 4


def test_sharded_rollout_equals_one_device(setup):
    params, prompts, out = setup
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, context=1, tensor=2))
    sharded = jax.device_put(params, param_shardings(CFG, mesh))  # as the trainer lays them out
    got = sample(sharded, CFG, prompts, 12, n=4, sampling=HOT, mesh=mesh)
    assert got.tokens.sharding.spec[0] == ("data", "fsdp")
    np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(out.tokens))
    np.testing.assert_allclose(np.asarray(got.logprobs), np.asarray(out.logprobs), atol=1e-5, rtol=0)


def test_prompts_in_chunks_give_the_one_programs_rollout(setup):
    """GRPOConfig.sample_prompts: 3 prompts sampled one at a time (3 calls of one program, each with the
    whole request's widths) or two at a time (a short last chunk: its own program) give the tokens,
    lengths and finish reasons of one program over all three, and its log-probs to float32 rounding
    (XLA's matmuls of another batch size may sum in another order). The programs of 1 and 2 prompts
    are setup's shapes (the 2 prompts' is setup's program)."""
    params, prompts, out = setup
    three = prompts + [prompts[0][::-1]]
    stops = dict(eos_ids=[int(np.asarray(out.tokens)[1, 4])], stop_text=NEVER)  # row 1 stops by its 5th token
    whole = sample(params, CFG, three, 12, n=4, sampling=HOT, **stops)
    for chunk in (1, 2):
        got = sample(params, CFG, three, 12, n=4, sampling=HOT, **stops, prompts_per_program=chunk)
        for name in ("tokens", "lengths", "finish"):
            np.testing.assert_array_equal(np.asarray(getattr(got, name)), np.asarray(getattr(whole, name)))
        np.testing.assert_allclose(np.asarray(got.logprobs), np.asarray(whole.logprobs), atol=1e-5, rtol=0)
    assert np.asarray(whole.tokens).shape == (12, 12) and 1 < len(set(np.asarray(whole.lengths).tolist()))


def test_temperature_only_sampling_compiles_no_sort(setup):
    """Sampling.draw: GRPO's temperature-only sampling is compiled without top-k / top-p's sort over the
    vocabulary (most of a sampled program's compile on a TPU), and draws the tokens that the program
    with the cut compiled in draws when the cut keeps every token (top_k = the vocabulary)."""
    from olmax.rollout.sampler import _compiled, _eos_table, _text_table

    params, prompts, _ = setup
    plain, cut = Sampling(temperature=0.8, seed=5), Sampling(temperature=0.8, top_k=CFG.vocab_size, seed=5)
    assert (plain.draw, cut.draw, Sampling().draw) == ("sample", "truncate", "greedy")
    args = (
        np.zeros((2, 16), np.int32),
        np.ones(2, np.int32),
        np.full(8, 4, np.int32),
        np.arange(8, dtype=np.int32),
        np.asarray(jax.random.key_data(jax.random.key(0))),
        np.asarray([0.8, 0, 1], np.float32),
        _eos_table(()),
        _text_table(NEVER, CFG.vocab_size),
    )
    sorts = {
        d: "stablehlo.sort" in _compiled(CFG, 4, 16, d).lower(params, *args).as_text() for d in ("sample", "truncate")
    }
    assert sorts == {"sample": False, "truncate": True}
    a, b = (sample(params, CFG, prompts, 12, n=4, sampling=s, stop_text=NEVER) for s in (plain, cut))
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    # the uncut draw scores its token from its own sums (olmax.rollout.draw.draw_scored), the cutting one
    # by log_softmax: the same log-probs to float32 rounding of a sum over the vocabulary
    np.testing.assert_allclose(np.asarray(a.logprobs), np.asarray(b.logprobs), atol=1e-5, rtol=0)
