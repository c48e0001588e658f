"""grpo.kv_gib: the RL loop's slot engine on a paged KV cache (olmax.rollout.pages) on the trainer's
one-device mesh. The engine's resident bytes that the train step's fit reserves are the pages the
stream's engine allocates; pages on a mesh of several devices and pages for the static sampler are
refused with a message naming grpo.kv_gib. Slow: synchronous (max_staleness 0), with a pool of half
the whole rings so that rows wait for pages, the stream gives the same groups as whole rings (the
responses, the sampler's log-probs within float32 rounding, the rewards)."""

from dataclasses import replace

import jax
import numpy as np
import pytest
from models import random_params, small_model
from test_rollout_stream import PROMPTS, Calls, ParityScorer  # 4 prompts a call, parity rewards

from olmax.config.experiment import ExperimentConfig
from olmax.config.grpo import GRPOConfig
from olmax.config.recipes import get_recipe
from olmax.data.prompts import Prompt, PromptSet
from olmax.errors import ConfigError
from olmax.model.sharding import make_mesh
from olmax.rollout.decode_attention import page_size
from olmax.rollout.pages import page_bytes
from olmax.rollout.producer import engine_state_bytes
from olmax.rollout.stream import EngineStream

CFG = small_model(vocab_size=300, global_every=2, sliding_window=8, compute_dtype="float32")
GROUP, SLOTS = 4, 8
PROMPT_LEN, RESPONSE_LEN = 12, 12
EOS = tuple(range(0, 300, 16))  # one token in 16 ends a row: most rows run long


def _experiment(kv_gib: float = 0.0, **grpo) -> ExperimentConfig:
    rl = GRPOConfig(
        prompts_per_step=PROMPTS,
        samples_per_prompt=GROUP,
        max_prompt_len=PROMPT_LEN,
        max_response_len=RESPONSE_LEN,
        temperature=0.9,
        template="instruct",
        sample_prompts=0,
        slots=SLOTS,
        max_staleness=0,
        kv_gib=kv_gib,
        **grpo,
    )
    return replace(get_recipe("tiny_grpo"), model=CFG, grpo=rl)


def _some_of_the_rings(slots: int) -> float:
    """GiB of pages for `slots` slots' whole rings (each ring size's pool: its pages + the trash)."""
    costs = page_bytes(CFG, PROMPT_LEN + RESPONSE_LEN)
    return sum(c * (slots * (s // page_size(s)) + 1) for s, c in costs.items()) / 2**30


def _prompts() -> PromptSet:
    rng = np.random.default_rng(3)
    rows = tuple(
        Prompt(tuple(rng.integers(0, 300, rng.integers(3, PROMPT_LEN)).tolist()), ("parity",), ("",), f"f:{i}")
        for i in range(16)
    )
    return PromptSet(rows, {}, "instruct")


def _streams(gib: float):
    mesh = make_mesh(get_recipe("tiny_grpo").mesh, jax.devices()[:1])
    rings = EngineStream(_experiment(), mesh, _prompts(), ParityScorer(), Calls(), EOS, None, slots=SLOTS)
    paged = EngineStream(_experiment(gib), mesh, _prompts(), ParityScorer(), Calls(), EOS, None, slots=SLOTS)
    return mesh, rings, paged


def test_the_stream_pages_its_engine_and_the_fit_reserves_what_it_allocates():
    gib = _some_of_the_rings(SLOTS // 2)
    mesh, rings, paged = _streams(gib)
    assert paged.engine._pages is not None and rings.engine._pages is None
    allocated = sum(x.nbytes for x in jax.tree.leaves(paged.engine._state))
    assert engine_state_bytes(_experiment(gib), mesh) == allocated < engine_state_bytes(_experiment(), mesh)
    rings.close()
    paged.close()


@pytest.mark.slow  # two engines' programs compiled; the paged engine's tokens: tests/rollout/test_rollout_pages.py
def test_a_paged_stream_gives_the_whole_rings_groups():
    _, rings, paged = _streams(_some_of_the_rings(SLOTS // 2))
    params = random_params(CFG, jax.random.key(3))
    params["lm_head"] = params["lm_head"] * 4
    for step in range(2):
        for _ in range(PROMPTS):
            a, b = rings.next_group(params, step), paged.next_group(params, step)
            assert a.prompt_id == b.prompt_id and a.responses == b.responses
            np.testing.assert_array_equal(a.rewards, b.rewards)
            for x, y in zip(a.logps, b.logps):
                np.testing.assert_allclose(x, y, atol=1e-5, rtol=0)
        assert rings.end_step() == paged.end_step() == 0
    # the pool held half the rows' rings: rows waited for pages, so the paged engine took more steps
    assert paged.engine.totals.decode_steps > rings.engine.totals.decode_steps
    rings.close()
    paged.close()


def test_pages_on_several_devices_or_the_static_sampler_are_refused():
    cfg = _experiment(_some_of_the_rings(SLOTS // 2))
    mesh = make_mesh(cfg.mesh, jax.devices()[:2])
    with pytest.raises(ConfigError, match=r"grpo.kv_gib=.* one device's KV cache and this mesh has 2 devices"):
        engine_state_bytes(cfg, mesh)
    with pytest.raises(ConfigError, match="grpo.kv_gib=.*static sampler keeps whole rings"):
        GRPOConfig(kv_gib=1.0, rollout_engine="static")
    with pytest.raises(ConfigError, match="grpo.kv_gib must be >= 0"):
        GRPOConfig(kv_gib=-1.0)
