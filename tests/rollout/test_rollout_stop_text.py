"""Stop strings on the decoded text (olmax.rollout.text.stop_table, cut_at_stop; the sampler's
`stop_text`), as vLLM matches them: `</answer>` stops a response however the model spells it.

- the table's automaton fires at the first token whose text completes a stop string, checked against
  decoding every prefix (vLLM's definition) on random sequences of answer-like pieces and of a
  character split over byte tokens;
- through the jitted loop, with a scripted step function in place of the model: rows spelling
  `7}</answer>`, `x.</answer>`, `</answer>` + newline and `</ans` + `wer>` with other tokens each stop at
  the token completing the string (finish "stop"), the tokens after it are neither returned nor
  counted, and the text is cut right after `</answer>`; a row without it runs to its limit;
- the RL loader's sampling call with grpo.stop (olmax.rollout.producer): the responses and their
  log-probs end at that token and the verifiers get the cut text;
- dolma2's tokenizer.json gives the pieces tiktoken's dolma2 gives.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import olmax.rollout.sampler as sampler
from olmax.config.model import ModelConfig
from olmax.data.tokenizer import HFJsonTokenizer, load_tokenizer
from olmax.rollout.sampler import FINISH, sample
from olmax.rollout.text import cut_at_stop, stop_table

STOP = "</answer>"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("dolma2")


@pytest.fixture(scope="module")
def table(tok):
    return stop_table(tok, [STOP, "\n\nQ:"])


def first_stop(table, ids):
    """The index of the token at which the automaton stops, or None."""
    state = 0
    for k, i in enumerate(ids):
        state = table[state, i]
        if state < 0:
            return k
    return None


def test_the_automaton_stops_where_the_decoded_text_first_holds_a_stop_string(tok, table):
    # texts with a stop string or a near miss among other pieces, cut at random characters and each
    # part encoded alone: the strings come in many spellings
    pieces = ["</answer>", "\n\nQ:", "</answe", "answer>", "\n\nQ", "<answer>", "7}", "x.", "\n", " ", "é", "答案"]
    rng = np.random.default_rng(0)
    stopped = 0
    for _ in range(300):
        text = "".join(rng.choice(pieces, rng.integers(1, 6)))
        cuts = sorted(set(rng.integers(0, len(text) + 1, rng.integers(0, 4)).tolist()) | {0, len(text)})
        ids = [i for a, b in zip(cuts, cuts[1:]) for i in tok.encode(text[a:b])]
        texts = [tok.decode(ids[: k + 1]) for k in range(len(ids))]
        want = next((k for k, text in enumerate(texts) if STOP in text or "\n\nQ:" in text), None)
        assert first_stop(table, ids) == want, (ids, tok.decode(ids))
        stopped += want is not None
    assert 50 < stopped < 250
    # a stop string of characters split over byte tokens ('答' is three tokens of one byte each)
    split = stop_table(tok, ["答"])
    ids = tok.encode("x 答案")
    assert len(ids) > 3 and first_stop(split, ids) == next(
        k for k in range(len(ids)) if "答" in tok.decode(ids[: k + 1])
    )


def test_cut_at_stop():
    assert cut_at_stop("a <answer>7</answer>\nmore", [STOP]) == "a <answer>7</answer>"
    assert cut_at_stop("no stop here", [STOP]) == "no stop here"
    assert cut_at_stop("x\n\nQ: y</answer>", [STOP, "\n\nQ:"]) == "x\n\nQ:"  # the earliest end


@pytest.fixture
def scripted(monkeypatch):
    """The sampler's model pass replaced by a script: row r's new token t is script[r, t] (greedy
    or sampled from one-hot logits x 1e4), whatever it was fed; row r's prompt has prompt_lengths[r] tokens, and with n
    samples per prompt the prefill's rows are every n-th. The compiled programs are dropped before and
    after."""

    def install(script, prompt_lengths, n=1):
        script, prompt_lengths = jnp.asarray(script, jnp.int32), jnp.asarray(prompt_lengths, jnp.int32)

        def step(params, cache, tokens, time, cfg, first=None, length=None, last_only=False, fresh=False):
            rows, lengths = (script, prompt_lengths) if fresh is False else (script[::n], prompt_lengths[::n])
            # the position whose logits are asked: the call's last token (left-padded rows: time - first)
            position = time + tokens.shape[1] - 1 - first
            t = jnp.clip(position + 1 - lengths, 0, script.shape[1] - 1)
            token = rows[jnp.arange(rows.shape[0]), t]
            return 1e4 * jax.nn.one_hot(token, cfg.vocab_size)[:, None, :], cache  # sampled: still the token

        monkeypatch.setattr(sampler, "cached_forward", step)

    sampler._compiled.cache_clear()
    yield install
    sampler._compiled.cache_clear()


PROMPT = 3
CFG = ModelConfig(
    vocab_size=100278,  # dolma2's
    d_model=16,
    n_layers=2,
    global_every=2,
    n_heads=2,
    n_kv_heads=1,
    head_dim=8,
    mlp_hidden=32,
    sliding_window=4,
    compute_dtype="float32",
)


def test_rows_stop_at_differently_spelled_stop_strings(tok, table, scripted):
    tail = tok.encode(" and then the response runs on")
    spellings = {
        "The value is <answer>7}</answer>": tok.encode("The value is <answer>7}</answer>"),
        "so <answer>x.</answer>": tok.encode("so <answer>x.</answer>"),
        "<answer>42</answer>\n": tok.encode("<answer>42</answer>\n"),
        "<answer>1</ans" + "wer>": tok.encode("<answer>1</ans") + tok.encode("wer>"),
    }
    rows = [*spellings.values(), tok.encode("<answer>no end")]
    assert len({tuple(r[-3:]) for r in rows[:4]}) == 4  # four different token spellings
    limit = max(map(len, rows)) + len(tail)
    script = np.asarray([(r + tail + [tail[-1]] * limit)[:limit] for r in rows])
    scripted(script, [PROMPT] * len(rows))
    params = {"lm_head": np.zeros((CFG.d_model, CFG.vocab_size), np.float32)}  # all the scripted pass reads
    out = sample(params, CFG, [[1] * PROMPT] * len(rows), limit, stop_text=table)
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    finish = [FINISH[f] for f in np.asarray(out.finish)]
    assert finish == ["stop"] * 4 + ["length"]
    for r, (text, ids) in enumerate(spellings.items()):
        assert lengths[r] == len(ids)  # the token completing the string is the last one kept
        assert tokens[r, : lengths[r]].tolist() == ids and not tokens[r, lengths[r] :].any()
        kept = cut_at_stop(tok.decode(ids), [STOP])
        assert kept.endswith(STOP) and kept == text.rstrip("\n")
    assert lengths[4] == limit and tokens[4].tolist() == script[4].tolist()


def test_dolma2_tokenizer_json_gives_the_same_pieces(tok, dolma2_json):
    assert HFJsonTokenizer(dolma2_json).token_bytes() == tok.token_bytes()


def test_grpo_rollouts_end_at_the_stop_string(tok, scripted, tmp_path, monkeypatch):
    """The RL loader's sampling call with grpo.stop (the static stream's call: the sampler it scripts is
    the static one): each response's tokens and log-probs end at the token completing `</answer>`, and its
    verifiers score the text cut right after it."""
    import json
    from dataclasses import replace

    from small_run import SMALL

    from olmax.config.io import apply_overrides
    from olmax.config.recipes import get_recipe
    from olmax.data.chat_corpus import read_rows
    from olmax.model.olmo3 import abstract_params
    from olmax.model.sharding import make_mesh
    from olmax.rewards import verifiers as rewards
    from olmax.rollout.producer import RolloutProducer, prompt_set

    path = tmp_path / "rl.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in read_rows("rl")[:2]))
    overrides = [f"data.work_dir={tmp_path / 'cache'}", f"data.paths=[{path}]", "grpo.max_prompt_len=64"]
    overrides += ["grpo.max_response_len=16", "grpo.prompts_per_step=2", "grpo.samples_per_prompt=2"]
    cfg = apply_overrides(get_recipe("tiny_grpo"), SMALL + overrides + ["data.seq_len=96", "trainer.global_batch=4"])
    cfg = replace(cfg, grpo=replace(cfg.grpo, stop=(STOP,), rollout_engine="static"))
    loader = RolloutProducer(cfg, make_mesh(cfg.mesh, jax.devices()[:1]), prompt_set(cfg, tok), tok)
    # a group's samples draw their first token from the prompt's one prefill: the same first token
    spelled = ["A: <answer>7}</answer> and on", "A: x.</answer>\nmore", "A: </answer>\n\nmore", "A: no answer here"]
    ids = [tok.encode(t) for t in spelled]
    script = np.asarray([(i + i[-1:] * 16)[:16] for i in ids])
    lengths = [len(loader.prompts.prompts[r // 2].ids) for r in range(4)]
    scripted(script, lengths, n=2)
    seen = []

    def score(datasets, ground_truths, response, timeout=None, options=None, *, scale):
        seen.append(response)
        return 0.0, [(d, 0.0, rewards.OK) for d in datasets]

    monkeypatch.setattr(rewards, "reward", score)
    # zeros in the model's shapes: the scripted pass reads none of them (no init program to compile)
    params = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), abstract_params(cfg.model))
    read = [loader.stream.next_group(params, 0) for _ in range(2)]
    responses = [r for g in read for r in g.responses]
    logps = [lp for g in read for lp in g.logps]
    ends = [t.index(STOP) + len(STOP) for t in spelled[:3]]
    kept = [next(k for k in range(1, len(i) + 1) if STOP in tok.decode(i[:k])) for i in ids[:3]]
    assert [len(r) for r in responses] == [len(p) for p in logps] == [*kept, 16]
    assert [responses[r] for r in range(3)] == [ids[r][: kept[r]] for r in range(3)]
    assert seen == [t[:e] for t, e in zip(spelled, ends)] + [tok.decode(script[3].tolist())]
