"""LR schedules: the stage-1 check values of docs/reference.md, OLMo-core's scheduler classes step by step,
and a horizon of one epoch of the run's data."""

from dataclasses import replace

import numpy as np
import pytest
from reference_values import STAGE1_LR
from small_run import small_config

from olmax.config import ConfigError, ScheduleConfig
from olmax.data.loader import build_source
from olmax.schedules import make_schedule, steps_for_tokens
from olmax.train import train

STAGE1_TOKENS_PER_STEP = 512 * 8192  # 4,194,304
STAGE1 = ScheduleConfig(
    name="stitched_cosine",
    warmup_steps=2000,
    alpha_f=0.1,
    t_max_tokens=5 * 10**12,
    switch_step=597_047,
    final_t_max_tokens=7 * 10**12,
)


def stage1_schedule():
    return make_schedule(STAGE1, lr=3e-4, max_steps=1_413_814, tokens_per_step=STAGE1_TOKENS_PER_STEP)


def test_stage1_horizons_from_tokens():
    assert steps_for_tokens(5 * 10**12, STAGE1_TOKENS_PER_STEP) == 1_192_093
    assert steps_for_tokens(7 * 10**12, STAGE1_TOKENS_PER_STEP) == 1_668_931


# STAGE1_LR (tests/reference_values.py). 2e-7 relative: float32 reproduces them to ~1e-7, and the two
# values either side of the switch (597046 / 597047) differ by 2.3e-6 relative, so a one-step
# error in the switch or in the 1-based numbering fails.
@pytest.mark.parametrize("step,expected", STAGE1_LR)
def test_stage1_check_values(step, expected):
    assert float(stage1_schedule()(step)) == pytest.approx(expected, rel=2e-7)


def test_schedule_is_traceable_on_device():
    import jax
    import jax.numpy as jnp

    sched = stage1_schedule()
    steps = jnp.array([s for s, _ in STAGE1_LR], jnp.int32)
    got = jax.jit(jax.vmap(sched))(steps)
    np.testing.assert_allclose(np.asarray(got), [v for _, v in STAGE1_LR], rtol=2e-7)


def test_bad_configs_are_errors():
    with pytest.raises(ConfigError, match="schedule.name"):
        ScheduleConfig(name="cosin")
    with pytest.raises(ConfigError, match="switch_step"):
        ScheduleConfig(name="stitched_cosine")
    with pytest.raises(ConfigError, match="switch_step < t_max"):
        make_schedule(
            replace(STAGE1, switch_step=1_300_000), lr=3e-4, max_steps=1, tokens_per_step=STAGE1_TOKENS_PER_STEP
        )


def test_an_epoch_horizon_needs_the_epoch_and_excludes_a_token_horizon():
    with pytest.raises(ConfigError, match="t_max_epochs must be a positive number of epochs"):
        ScheduleConfig(t_max_epochs=0)
    with pytest.raises(ConfigError, match="excludes schedule.t_max_tokens"):
        ScheduleConfig(t_max_epochs=1, t_max_tokens=10**9)
    with pytest.raises(ConfigError, match="schedule.t_max_epochs=1 sets the horizon from the batches in an epoch"):
        make_schedule(ScheduleConfig(t_max_epochs=1), lr=6e-4, max_steps=656_000, tokens_per_step=2**23)
    lr = make_schedule(ScheduleConfig(t_max_epochs=2), lr=6e-4, max_steps=5, tokens_per_step=1, epoch_batches=10_000)
    assert float(lr(20_000)) == pytest.approx(6e-5, rel=1e-6) and float(lr(19_000)) > 6.1e-5  # t_max = 2 x 10,000


def test_a_run_with_an_epoch_horizon_follows_the_cosine_of_its_epoch(tmp_path):
    """OLMo-core 3.0.0's trainer turns Duration.epochs(1) into max_steps = its loader's total_batches,
    the whole global batches in the epoch (instances // global batch), and the scheduler's t_max is that.
    A tiny run with schedule.t_max_epochs=1 logs the LR curve of that explicit horizon in tokens, and
    neither the curve one step either side nor that of trainer.max_steps."""
    cfg = small_config(tmp_path, "data.paths=[demo:heldout]", "schedule.t_max_epochs=1")
    tokens = cfg.trainer.global_batch * cfg.data.seq_len
    epoch = len(build_source(cfg.data)) // cfg.trainer.global_batch
    logged = [row["optim/LR"] for row in train(cfg, tmp_path / "run", progress=False)]

    def curve(t_max_tokens):
        schedule = replace(cfg.schedule, t_max_epochs=None, t_max_tokens=t_max_tokens)
        lr = make_schedule(schedule, lr=cfg.optimizer.lr, max_steps=cfg.trainer.max_steps, tokens_per_step=tokens)
        return [float(lr(step)) for step in range(1, cfg.trainer.max_steps + 1)]

    assert logged == pytest.approx(curve(epoch * tokens), rel=1e-6)
    for other in (epoch - 1, epoch + 1, cfg.trainer.max_steps):
        assert logged != pytest.approx(curve(other * tokens), rel=1e-6), other


def test_horizon_inside_the_warmup_stays_in_warmup():
    """bench-small runs the 7B's 2000-step warmup for 13 steps: the LR is the warmup's, never NaN."""
    sched = make_schedule(ScheduleConfig(warmup_steps=2000), lr=3e-4, max_steps=13, tokens_per_step=1)
    assert [float(sched(s)) for s in (1, 13)] == pytest.approx([1.5e-7, 13 * 1.5e-7], rel=1e-6)


# ----------------------------------------------------------------------------------------------
# Against OLMo-core's classes


def _olmo_core_lr(scheduler, lr, steps, t_max):
    return np.array([float(scheduler.get_lr(lr, s, t_max)) for s in steps])


def _ours(cfg, lr, steps, max_steps):
    import jax.numpy as jnp

    return np.asarray(make_schedule(cfg, lr=lr, max_steps=max_steps, tokens_per_step=1)(jnp.asarray(steps)))


@pytest.mark.parity
def test_against_olmo_core_schedulers():
    from olmo_core.optim import WSD, ConstantWithWarmup, CosWithWarmup, LinearWithWarmup

    lr, t_max = 2e-3, 500
    steps = np.arange(1, t_max + 1)
    cases = [
        (ScheduleConfig(name="cosine", warmup_steps=37, alpha_f=0.1), CosWithWarmup(warmup=37, alpha_f=0.1)),
        (ScheduleConfig(name="cosine", warmup_steps=0, alpha_f=0.0), CosWithWarmup(warmup=0, alpha_f=0.0)),
        (ScheduleConfig(name="linear", warmup_steps=0, alpha_f=0.0), LinearWithWarmup(warmup=0, alpha_f=0.0)),
        (ScheduleConfig(name="linear", warmup_steps=20, alpha_f=0.0), LinearWithWarmup(warmup=20, alpha_f=0.0)),
        (
            ScheduleConfig(name="wsd", warmup_steps=25, alpha_f=0.0, decay_fraction=0.2),
            WSD(warmup=25, decay_fraction=0.2),
        ),
        (
            ScheduleConfig(name="wsd", warmup_steps=25, alpha_f=0.1, decay_fraction=0.1),
            WSD(warmup=25, decay_fraction=0.1, decay_min_lr=0.1 * lr),
        ),
        (ScheduleConfig(name="constant", warmup_steps=10), ConstantWithWarmup(warmup=10)),
    ]
    # float32 resolves the schedule's fraction of the peak to ~1e-7: 2e-7 * lr absolute (relative
    # error grows where a schedule approaches 0), far below what a one-step shift changes (~1e-3 * lr).
    for cfg, ref in cases:
        np.testing.assert_allclose(
            _ours(cfg, lr, steps, t_max),
            _olmo_core_lr(ref, lr, steps, t_max),
            rtol=1e-6,
            atol=2e-7 * lr,
            err_msg=str(cfg),
        )


@pytest.mark.parity
def test_stage1_against_olmo_core_cosine_and_half_cosine():
    """Part 1 is CosWithWarmup(2000, t_max 1,192,093); part 2 equals HalfCosWithWarmup with its
    'warmup' at the last part-1 step, ending at 1,668,931. Sampled over the whole stage-1 range."""
    from olmo_core.optim import CosWithWarmup, HalfCosWithWarmup

    part1 = CosWithWarmup(warmup=2000, alpha_f=0.1, t_max=1_192_093)
    part2 = HalfCosWithWarmup(warmup=597_046, alpha_f=0.1, t_max=1_668_931)
    steps = np.unique(
        np.concatenate(
            [np.linspace(1, 1_668_931, 2001).astype(int), np.arange(596_990, 597_100), np.arange(1, 2100, 7)]
        )
    )
    ref = np.array([float((part1 if s < 597_047 else part2).get_lr(3e-4, int(s), 1_668_931)) for s in steps])
    import jax.numpy as jnp

    got = np.asarray(stage1_schedule()(jnp.asarray(steps)))
    np.testing.assert_allclose(got, ref, rtol=1e-6)
