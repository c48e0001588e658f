"""The RL loop's group streams (olmax.rollout.stream) on a 2-layer model, with a scorer whose reward is the
parity of the response's last token (a spread in some groups, none in others):

- with grpo.max_staleness=0 the engine stream gives the static stream's groups: the same responses, the
  sampler log-probs within float32 rounding, the same rewards, call after call (with active sampling the
  engine decodes only the groups a step reads, the static stream a whole call);
- with max_staleness=1 groups enter while at most two steps' worth are open: every group is read, in the
  order of the prompts, none dropped, each token's version at most one behind the step that reads it;
- a stream saved mid-flight (rows in the engine's slots, groups scored and not read) and restored on a
  new engine goes on as the one that was not stopped."""

from collections import Counter
from dataclasses import replace

import jax
import numpy as np
import pytest
from models import random_params, small_model

from olmax.config.experiment import ExperimentConfig
from olmax.config.grpo import GRPOConfig
from olmax.data.prompts import Prompt, PromptSet
from olmax.model.olmo3 import abstract_params
from olmax.rollout.scoring import Scored
from olmax.rollout.stream import EngineStream, StaticStream

CFG = small_model(vocab_size=300, global_every=2, sliding_window=4, compute_dtype="float32")
PROMPTS, GROUP = 4, 4
EOS = tuple(range(0, 300, 8))  # one token in 8 ends a row: responses of every length up to the limit


def _experiment(**grpo) -> ExperimentConfig:
    rl = GRPOConfig(
        prompts_per_step=PROMPTS,
        samples_per_prompt=GROUP,
        max_prompt_len=12,
        max_response_len=10,
        temperature=0.9,
        template="instruct",
        sample_prompts=0,  # one static program a call (the producer resolves auto for its devices)
        **grpo,
    )
    return replace(ExperimentConfig(), model=CFG, grpo=rl)


class ParityScorer:
    """Reward 10 when the response's last token is a multiple of 4: a deterministic stand-in for the
    verifiers, under which about a third of the groups of 4 have no reward spread."""

    def __call__(self, rows, responses) -> Scored:
        values = np.asarray([10.0 * (r[-1] % 4 == 0) for r in responses], np.float32)
        return Scored(values, [[("parity", float(v / 10))] for v in values], Counter(verified_here=len(rows)))


class Calls:
    """The prompt order's calls: prompt ids in order, PROMPTS at a time, numbered."""

    def __init__(self):
        self.count = 0

    def __call__(self):
        ids = np.arange(self.count * PROMPTS, (self.count + 1) * PROMPTS) % 16
        self.count += 1
        return self.count - 1, ids


@pytest.fixture(scope="module")
def setup():
    params = random_params(CFG, jax.random.key(3))
    params["lm_head"] = params["lm_head"] * 4
    rng = np.random.default_rng(3)
    prompts = PromptSet(
        tuple(
            Prompt(tuple(rng.integers(0, 300, rng.integers(3, 12)).tolist()), ("parity",), ("",), f"f:{i}")
            for i in range(16)
        ),
        {},
        "instruct",
    )
    return params, prompts


def _streams(prompts, **grpo):
    cfg = _experiment(**grpo)
    static = StaticStream(cfg, None, prompts, ParityScorer(), Calls(), EOS, None)
    engine = EngineStream(cfg, None, prompts, ParityScorer(), Calls(), EOS, None, slots=8)
    return static, engine


def _same(a, b):
    assert a.prompt_id == b.prompt_id and a.responses == b.responses
    np.testing.assert_array_equal(a.rewards, b.rewards)
    for x, y in zip(a.logps, b.logps):
        np.testing.assert_allclose(x, y, atol=1e-5, rtol=0)


def test_synchronous_engine_stream_gives_the_static_streams_groups(setup):
    params, prompts = setup
    static, engine = _streams(prompts, max_staleness=0)
    for step in range(3):
        for _ in range(PROMPTS):
            _same(static.next_group(params, step), engine.next_group(params, step))
        assert static.end_step() == engine.end_step() == 0
    assert engine.timing["useful_tokens"] == static.timing["useful_tokens"]
    assert engine.timing["slot_steps"] < static.timing["slot_steps"]  # fewer slots idle than the static batches
    engine.close()


def _read_a_step(stream, params, step):
    """What an active-sampling step reads: groups until PROMPTS of them have a reward spread."""
    read = []
    while sum(len(set(g.rewards.tolist())) > 1 for g in read) < PROMPTS:
        read.append(stream.next_group(params, step))
    return read


def test_active_sampling_decodes_only_what_a_step_reads(setup):
    params, prompts = setup
    static, engine = _streams(prompts, max_staleness=0, active_sampling=True)
    for step in range(2):
        by_static, by_engine = _read_a_step(static, params, step), _read_a_step(engine, params, step)
        assert len(by_static) == len(by_engine) > PROMPTS  # some groups had no spread: a second call was read
        for a, b in zip(by_static, by_engine):
            _same(a, b)
        # the static stream decoded the whole second call and drops its rest; the engine stream admitted
        # just the groups the step read, and gives the call's other prompts back: the same ones
        left = static.end_step()
        assert engine.end_step() == left == -len(by_static) % PROMPTS
    assert engine.timing["useful_tokens"] < static.timing["useful_tokens"]
    engine.close()


def test_in_flight_groups_are_read_in_order_within_the_staleness(setup):
    params, prompts = setup
    _, engine = _streams(prompts, max_staleness=1)
    read = []
    for step in range(4):
        for _ in range(PROMPTS):
            read.append(engine.next_group(params, step))
            assert len(engine.open) <= 2 * PROMPTS  # admission control: two steps' worth at most
        for group in read[-PROMPTS:]:
            assert all(step - 1 <= v <= step for r in group.versions for v in r)
        engine.end_step()
    assert [g.prompt_id for g in read] == [i % 16 for i in range(4 * PROMPTS)]  # every group, in order
    assert any(v == step - 1 for g in read[-PROMPTS:] for r in g.versions for v in r)  # some rows did carry over
    engine.close()


def test_a_stream_saved_mid_flight_goes_on_as_the_one_not_stopped(setup):
    params, prompts = setup
    _, going = _streams(prompts, max_staleness=1)
    _, stopped = _streams(prompts, max_staleness=1)
    for _ in range(PROMPTS):
        going.next_group(params, 0), stopped.next_group(params, 0)
    going.end_step(), stopped.end_step()
    going.state()  # a checkpoint: the running stream re-prefills its rows in flight as a resumed one does
    json_state, arrays = stopped.state()
    assert len(arrays["engine"]["index"]) or len(arrays["finished"]["index"])  # something was in flight
    _, resumed = _streams(prompts, max_staleness=1)
    resumed.take.count = stopped.take.count
    resumed.restore(json_state, arrays)
    for _ in range(2 * PROMPTS):
        _same(going.next_group(params, 1), resumed.next_group(params, 1))
    going.close(), stopped.close(), resumed.close()


class FickleScorer(ParityScorer):
    """The parity reward the first time a response is scored, 0 after (a verifier that answers otherwise
    on a second call: an LLM judge, a program near its time limit). `seen` counts the calls, shared by
    the scorers of a run and of its resumption, as a judge outside the process would count them."""

    def __init__(self, seen: Counter):
        self.seen = seen

    def __call__(self, rows, responses) -> Scored:
        scored = super().__call__(rows, responses)
        again = np.asarray([self.seen[tuple(r)] > 0 for r in responses])
        self.seen.update(tuple(r) for r in responses)
        return scored._replace(rewards=np.where(again, 0.0, scored.rewards).astype(np.float32))


def test_a_resumed_stream_scores_nothing_again(setup):
    """The checkpoint keeps the scores of the groups scored and not yet read: the resumed stream reads the
    rewards the first scoring gave, as the stream that went on does."""
    params, prompts = setup
    cfg = _experiment(max_staleness=2)
    judge = Counter()  # the stopped run's and its resumption's
    going = EngineStream(cfg, None, prompts, FickleScorer(Counter()), Calls(), EOS, None, slots=8)
    stopped = EngineStream(cfg, None, prompts, FickleScorer(judge), Calls(), EOS, None, slots=8)
    for step in range(2):  # the 8 slots (the other tests' programs) hold a scored group after step 1
        for _ in range(PROMPTS):
            going.next_group(params, step), stopped.next_group(params, step)
        going.end_step(), stopped.end_step()
    going.state()
    json_state, arrays = stopped.state()
    # groups scored and not read, with rewards a second scoring would have made 0
    assert any(entry[5] is not None and any(entry[5][0]) for entry in json_state["open"])
    resumed = EngineStream(cfg, None, prompts, FickleScorer(judge), Calls(), EOS, None, slots=8)
    resumed.take.count = stopped.take.count
    resumed.restore(json_state, arrays)
    read = [(going.next_group(params, 2), resumed.next_group(params, 2)) for _ in range(2 * PROMPTS)]
    for a, b in read:
        _same(a, b)
    going.close(), stopped.close(), resumed.close()


def test_groups_read_in_completion_order_stay_within_the_staleness(setup):
    """grpo.read_order=completion: each read takes the open group whose rows stopped first, unless the
    oldest open group entered max_staleness rollouts ago; every group is read once, none is dropped, and
    a saved and restored stream goes on as the one that was not stopped."""
    params, prompts = setup
    cfg = _experiment(max_staleness=2, read_order="completion")
    streams = [EngineStream(cfg, None, prompts, ParityScorer(), Calls(), EOS, None, slots=8) for _ in range(2)]
    going, stopped = streams
    read = []
    for step in range(5):
        for _ in range(PROMPTS):
            group = going.next_group(params, step)
            read.append(group)
            assert all(step - 2 <= v <= step for r in group.versions for v in r)
            if step < 2:
                assert stopped.next_group(params, step).responses == group.responses
        going.end_step()
        if step < 2:
            stopped.end_step()
        if step == 1:
            going.state()
            json_state, arrays = stopped.state()
            resumed = EngineStream(cfg, None, prompts, ParityScorer(), Calls(), EOS, None, slots=8)
            resumed.take.count = stopped.take.count
            resumed.restore(json_state, arrays)
            streams.append(resumed)
        if step >= 2:
            for group in read[-PROMPTS:]:
                _same(group, resumed.next_group(params, step))
            resumed.end_step()
    ids = [g.prompt_id for g in read]
    assert ids != [i % 16 for i in range(len(ids))]  # overtaken: not the prompts' order
    # every group once: the admitted ones are a prefix of the prompt order, less what is still open
    admitted = [i % 16 for i in range(len(ids) + len(going.open))]
    assert sorted(ids + [a.prompt_id for a in going.open]) == sorted(admitted)
    for stream in streams:
        stream.close()


def test_synchronous_engine_equals_static_rollouts_at_the_real_vocabulary(setup):
    """The same groups at dolma2's 100,278 tokens from a random model, whose next-token distribution is
    nearly flat: the engine's logits and the static sampler's differ in their last bits (other batch
    shapes), and the draw (olmax.rollout.draw) moves only where one of its 17 ratios crosses its random
    word, so both draw the same tokens (a flat inverse CDF moved with any logit before the token). The
    model is setup's layers with an embedding and output layer over the real vocabulary drawn on the
    host at the init's scale (no parameter program to compile for this shape)."""
    cfg = replace(_experiment(max_staleness=0), model=replace(CFG, vocab_size=100_278))
    rng = np.random.default_rng(5)
    padded = abstract_params(cfg.model)["lm_head"].shape  # (d_model, the padded vocabulary)
    params = {
        **setup[0],
        "embed": (rng.standard_normal(padded[::-1]) * cfg.model.init_std).astype(np.float32),
        "lm_head": (rng.standard_normal(padded) * cfg.model.init_std).astype(np.float32),
    }
    prompts = PromptSet(
        tuple(Prompt(tuple(rng.integers(0, 100_000, 6).tolist()), ("parity",), ("",), f"f:{i}") for i in range(8)),
        {},
        "instruct",
    )
    static = StaticStream(cfg, None, prompts, ParityScorer(), Calls(), EOS, None)
    # 4 slots: the engine decodes 4 rows where the static program decodes 16 (the flat inverse CDF drew
    # token 34,755 for prompt 7's third sample where the static sampler drew 34,756)
    engine = EngineStream(cfg, None, prompts, ParityScorer(), Calls(), EOS, None, slots=4)
    for step in range(2):
        for _ in range(PROMPTS):
            _same(static.next_group(params, step), engine.next_group(params, step))
        static.end_step(), engine.end_step()
    engine.close()
