"""Generation (olmax.rollout.sampler, `olmax generate`): greedy equals argmax-and-append on the full
forward pass; sampling is reproducible from its seed, does not depend on the batch size, gives copies
of one prompt their own draws, and top-k=1 or a tiny top-p is greedy. The
reference test (parity) checks `olmax generate` against transformers' `generate` on the HF export."""

import jax
import numpy as np
import pytest
from models import random_params, small_model

from olmax.model.olmo3 import forward
from olmax.rollout.sampler import Sampling, generate, generate_in_batches
from olmax.rollout.text import read_prompts

CFG = small_model(vocab_size=300, n_layers=3, sliding_window=4, compute_dtype="float32")


@pytest.fixture(scope="module")
def setup():
    params = random_params(CFG, jax.random.key(1))
    params["lm_head"] = params["lm_head"] * 20  # distributions with a clear top token, and some spread
    rng = np.random.default_rng(1)
    prompts = [list(rng.integers(0, CFG.vocab_size, n)) for n in (3, 9, 17)]  # ragged: right padding
    full = jax.jit(lambda p, x: forward(p, x, CFG))  # the reference: the full forward pass, one (1, 32) shape
    return params, prompts, full


def test_greedy_equals_argmax_and_append(setup):
    params, prompts, run = setup
    generated = generate(params, CFG, prompts, 12, limits=[12, 12, 5])  # row 2: its own max_new_tokens
    for row, (prompt, out) in enumerate(zip(prompts, generated)):
        seq = list(prompt)
        for _ in range(5 if row == 2 else 12):
            padded = np.zeros((1, 32), np.int32)  # causal: the padding is unseen
            padded[0, : len(seq)] = seq
            logits = np.asarray(run(params, padded))
            seq.append(int(logits[0, len(seq) - 1, : CFG.vocab_size].argmax()))
        assert out == seq[len(prompt) :]


def test_rows_stop_at_eos(setup):
    params, prompts, _ = setup
    greedy = generate(params, CFG, prompts, 12)
    eos = greedy[1][3]  # the 4th token of row 1 becomes "EOS": row 1 ends there, with it
    out = generate(params, CFG, prompts, 12, eos_ids=[eos])
    assert out[1] == greedy[1][: greedy[1].index(eos) + 1]
    for row in (0, 2):
        assert out[row] == (greedy[row][: greedy[row].index(eos) + 1] if eos in greedy[row] else greedy[row])


def test_sampling_is_reproducible_and_narrows_to_greedy(setup):
    params, prompts, run = setup
    greedy = generate(params, CFG, prompts, 10)
    hot = Sampling(temperature=1.5, seed=7)
    a, b = generate(params, CFG, prompts, 10, sampling=hot), generate(params, CFG, prompts, 10, sampling=hot)
    assert a == b
    other = generate(params, CFG, prompts, 10, sampling=Sampling(temperature=1.5, seed=8))
    assert a != greedy and other != a  # 30 draws at temperature 1.5: not all the argmax, not seed-independent
    assert generate(params, CFG, prompts, 10, sampling=Sampling(temperature=1.5, top_k=1, seed=3)) == greedy
    assert generate(params, CFG, prompts, 10, sampling=Sampling(temperature=1.0, top_p=1e-6, seed=3)) == greedy
    # top-k 5: every sampled token is among the 5 most likely at its position
    top5 = generate(params, CFG, prompts, 10, sampling=Sampling(temperature=2.0, top_k=5, seed=4))
    for prompt, out in zip(prompts, top5):
        seq = np.zeros((1, 32), np.int32)
        seq[0, : len(prompt) + len(out)] = list(prompt) + out
        logits = np.asarray(run(params, seq))[0, :, : CFG.vocab_size]
        for t, tok in enumerate(out):
            assert tok in np.argsort(logits[len(prompt) + t - 1])[-5:]


def test_sampling_does_not_depend_on_the_batch_size(setup):
    params, prompts, _ = setup
    hot = Sampling(temperature=1.0, seed=0)
    # two samples of one prompt and a longer one (ragged rows); prompts of 17 to 32 tokens keep one
    # prompt and cache width (those of the test above), so only the batch sizes 1, 2 and 3 are
    # compiled, and 3 is the sampled program of the test above
    request = [prompts[2], prompts[2], prompts[0] + prompts[2]]
    by_batch = {b: generate_in_batches(params, CFG, request, 8, b, sampling=hot) for b in (1, 2, 3)}
    assert by_batch[1] == by_batch[2] == by_batch[3]
    assert by_batch[2][0] != by_batch[2][1]  # each copy its own draws
    assert by_batch[3] == generate(params, CFG, request, 8, sampling=hot)  # one batch: positions 0, 1, ...
    # a batch's draws are keyed by the positions it is given
    assert generate(params, CFG, request[1:], 8, sampling=hot, index=[1, 2]) == by_batch[1][1:]
    with pytest.raises(ValueError, match="one position per prompt"):
        generate(params, CFG, request, 8, sampling=hot, index=[0, 1])


def test_bad_settings_and_prompts(tmp_path):
    with pytest.raises(ValueError, match="top_p"):
        Sampling(temperature=1.0, top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        Sampling(temperature=-1.0)
    (tmp_path / "p.jsonl").write_text('{"prompt": "a"}\n{"text": "b"}\n')
    with pytest.raises(ValueError, match="p.jsonl:2"):
        read_prompts(tmp_path / "p.jsonl")
    (tmp_path / "p.txt").write_text("first prompt\n\nsecond prompt\n")
    assert read_prompts(tmp_path / "p.txt") == ["first prompt", "second prompt"]
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        read_prompts(tmp_path / "missing.txt")


def test_cli_generate_needs_one_source_of_prompts(tmp_path):
    from typer.testing import CliRunner

    from olmax.cli.common import app

    for args in ([], ["--prompt", "a", "--prompts", str(tmp_path / "p.txt")]):
        result = CliRunner().invoke(app, ["generate", "--ckpt", str(tmp_path), *args])
        assert result.exit_code == 2 and "give --prompt" in result.output
    result = CliRunner().invoke(app, ["generate", "--ckpt", str(tmp_path / "none"), "--prompt", "a"])
    assert result.exit_code == 2 and "generate error" in result.output and "none" in result.output
