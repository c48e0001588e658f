"""LR schedules: the stage-1 check values of docs/reference.md, OLMo-core's scheduler classes step by step,
and a horizon of one epoch of the run's data."""

import json
from dataclasses import replace

import numpy as np
import pytest
from reference_values import STAGE1_LR, STAGE1_SETTINGS
from small_run import small_config
from typer.testing import CliRunner

from olmax.cli.common import app
from olmax.config.io import to_yaml
from olmax.config.schedule import ScheduleConfig
from olmax.data.loader import build_source
from olmax.errors import ConfigError
from olmax.rundir.exits import ExitStatus, read_record
from olmax.rundir.progress import read_run_config
from olmax.rundir.report import MetricsReader, run_status
from olmax.step.schedules import make_schedule, steps_for_tokens
from olmax.trainer.run import train

STAGE1_TOKENS_PER_STEP = 512 * 8192  # 4,194,304
# AI2's stage 1 (docs/reference.md): the cosine up to step 596,047, the checkpoint -pretrain-2.py
# resumes from; from step 596,048 HalfCosWithWarmup(warmup 597,046) to 7e12 tokens.
STAGE1 = ScheduleConfig(**STAGE1_SETTINGS)


def stage1_schedule():
    return make_schedule(STAGE1, lr=3e-4, max_steps=1_413_814, tokens_per_step=STAGE1_TOKENS_PER_STEP)


def test_stage1_horizons_from_tokens():
    assert steps_for_tokens(5 * 10**12, STAGE1_TOKENS_PER_STEP) == 1_192_093
    assert steps_for_tokens(7 * 10**12, STAGE1_TOKENS_PER_STEP) == 1_668_931


# STAGE1_LR (tests/reference_values.py). 2e-7 relative: float32 reproduces them to ~1e-7, and
# neighbouring steps around the resume differ by more (597,045 / 597,046 by 1.7e-6 relative on the
# ramp, 597,046 / 597,047 by 1.2e-6; 596,047 / 596,048 by 3.8e-3), so a one-step error in the switch,
# the ramp's end or the 1-based numbering fails.
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
    with pytest.raises(ConfigError, match="half_cos_warmup > 0"):
        replace(STAGE1, half_cos_warmup=0)
    with pytest.raises(ConfigError, match="switch_step < t_max"):
        make_schedule(
            replace(STAGE1, switch_step=1_300_000), lr=3e-4, max_steps=1, tokens_per_step=STAGE1_TOKENS_PER_STEP
        )
    with pytest.raises(ConfigError, match="half_cos_warmup < final t_max"):
        make_schedule(
            replace(STAGE1, half_cos_warmup=1_668_931), lr=3e-4, max_steps=1, tokens_per_step=STAGE1_TOKENS_PER_STEP
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


@pytest.mark.slow  # ~12 s on 2 cores: a training run (the next test keeps an epoch-horizon run in the default suite)
def test_a_run_with_an_epoch_horizon_follows_the_cosine_of_its_epoch(tmp_path):
    """OLMo-core 3.0.0's trainer turns Duration.epochs(1) into max_steps = its loader's total_batches,
    the whole global batches in the epoch (instances // global batch), and the scheduler's t_max is that.
    A tiny run with schedule.t_max_epochs=1 logs the LR curve of that explicit horizon in tokens, and
    neither the curve one step either side nor that of a horizon of the steps run. The run ends at
    trainer.max_steps, here short of the horizon, as AI2's 32B stage 1 stopped at step 656,000 of its
    epoch's cosine."""
    cfg = small_config(tmp_path, "data.paths=[demo:heldout]", "schedule.t_max_epochs=1")
    tokens = cfg.trainer.global_batch * cfg.data.seq_len
    epoch = len(build_source(cfg.data)) // cfg.trainer.global_batch
    steps = cfg.trainer.max_steps
    assert steps < epoch
    logged = [row["optim/LR"] for row in train(cfg, tmp_path / "run", progress=False)]
    assert len(logged) == steps

    def curve(t_max_tokens):
        schedule = replace(cfg.schedule, t_max_epochs=None, t_max_tokens=t_max_tokens)
        lr = make_schedule(schedule, lr=cfg.optimizer.lr, max_steps=epoch, tokens_per_step=tokens)
        return [float(lr(step)) for step in range(1, steps + 1)]

    assert logged == pytest.approx(curve(epoch * tokens), rel=1e-6)
    for other in (epoch - 1, epoch + 1, steps):
        assert logged != pytest.approx(curve(other * tokens), rel=1e-6), other


@pytest.mark.slow  # the default suite's 10 minutes (docs/testing.md)
def test_a_run_to_the_end_of_its_epochs_stops_there_and_resumes_to_it(tmp_path):
    """trainer.max_steps=null, the SFT and DPO recipes' end: the run stops after schedule.t_max_epochs x
    the whole global batches in an epoch (OLMo-core's Duration.epochs), counted once the data is open;
    the run's config.yaml records that step for olmax status, the launcher and the CLI, and a resume
    (here the CLI's, which must record the run as done, not preempted) counts the same end."""
    tokens = tmp_path / "part-0.npy"  # 5 global batches and a bit of 8 x 64 tokens
    np.random.default_rng(0).integers(0, 1000, size=8 * 64 * 5 + 100).astype(np.uint32).tofile(tokens)
    overrides = [f"data.paths=[{tokens}]", "schedule.t_max_epochs=1", "trainer.max_steps=null", "eval.every=0"]
    cfg = small_config(tmp_path, *overrides)
    epoch = len(build_source(cfg.data)) // cfg.trainer.global_batch
    assert epoch == 5
    run = tmp_path / "run"
    first = train(cfg, run, progress=False, stop_at=3)
    assert read_run_config(str(run)).trainer.max_steps == epoch
    (tmp_path / "run.yaml").write_text(to_yaml(cfg))
    out = CliRunner().invoke(app, ["train", "--config", str(tmp_path / "run.yaml"), "--run-dir", str(run)])
    assert out.exit_code == 0, out.output
    assert read_record(str(run))["status"] == ExitStatus.DONE
    rest = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][len(first) :]
    assert [row["step"] for row in first + rest] == list(range(1, epoch + 1))
    assert train(cfg, run, progress=False) == []
    assert run_status(str(run), MetricsReader(str(run), window=3))["total_steps"] == epoch


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
        (  # AI2's SFT: round(500 * 0.03) = 15 warmup steps
            ScheduleConfig(name="linear", warmup_steps=0, warmup_fraction=0.03, alpha_f=0.0),
            LinearWithWarmup(warmup_fraction=0.03, alpha_f=0.0),
        ),
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
def test_stage1_across_the_resume_as_olmo_core_ran_it():
    """AI2's two stage-1 scripts, run through OLMo-core's own scheduler, optimizer config and trainer
    step logic: -pretrain-1.py's CosWithWarmup up to its step-596,047 checkpoint; -pretrain-2.py loads
    that checkpoint with its trainer and optimizer state (global step, tokens seen, the param groups)
    and sets the LR with HalfCosWithWarmup(warmup = 5e12 tokens // batch // 2 + 2000 // 2) against the
    7e12-token max_duration. olmax's stage-1 schedule gives the LR of every step around the resume and
    of steps sampled over the whole run."""
    import jax.numpy as jnp
    import torch
    from olmo_core.optim import CosWithWarmup, HalfCosWithWarmup, OptimGroupOverride, SkipStepAdamWConfig
    from olmo_core.train import Duration
    from olmo_core.train.trainer import Trainer

    from olmax.config.recipes import STAGE1_SCHEDULE

    class TrainerClock:
        """What OLMo-core's step schedulers read from the Trainer (Scheduler.set_lr: global_step and
        max_steps), with max_steps computed by the Trainer's own property from a tokens max_duration."""

        max_steps = Trainer.max_steps
        _get_max_steps = Trainer._get_max_steps
        tokens_per_batch = Trainer.tokens_per_batch

        def __init__(self, max_duration, global_batch_size, global_step=0, global_train_tokens_seen=0):
            self.max_duration, self.global_batch_size = max_duration, global_batch_size
            self.global_step, self.global_train_tokens_seen = global_step, global_train_tokens_seen

        def step(self):
            """Trainer._fit_epoch's bookkeeping before a batch's optimizer step (every batch is full)."""
            self.global_step += 1
            self.global_train_tokens_seen += self.global_batch_size

    assert STAGE1 == STAGE1_SCHEDULE
    batch, lr, resume_step, end_step = 8192 * 512, 3e-4, 596_047, 1_413_814
    watch = set(range(1, 2101)) | set(range(595_900, 597_200))
    watch |= {int(s) for s in np.linspace(1, end_step, 2001)} | {1_668_931}

    def optimizer():
        model = torch.nn.Module()
        model.embeddings, model.w = torch.nn.Embedding(4, 2), torch.nn.Linear(2, 2)
        return SkipStepAdamWConfig(
            lr=lr,
            weight_decay=0.1,
            betas=(0.9, 0.95),
            group_overrides=[OptimGroupOverride(params=["embeddings.weight"], opts=dict(weight_decay=0.0))],
        ).build(model)

    def run(clock, scheduler, optim, stop):
        lrs = {}
        while clock.global_step < stop:
            clock.step()
            if clock.global_step in watch:
                lrs[clock.global_step] = [float(scheduler.set_lr(g, clock)) for g in optim.param_groups]
        return lrs

    optim1 = optimizer()
    clock1 = TrainerClock(Duration.tokens(int(5e12)), batch)
    part1 = run(clock1, CosWithWarmup(warmup=2000), optim1, resume_step)
    assert clock1.max_steps == 1_192_093

    optim2 = optimizer()
    optim2.load_state_dict(optim1.state_dict())  # the checkpoint's param groups; initial_lr stays 3e-4
    assert [g["initial_lr"] for g in optim2.param_groups] == [lr, lr]
    clock2 = TrainerClock(Duration.tokens(int(7e12)), batch, clock1.global_step, clock1.global_train_tokens_seen)
    half = HalfCosWithWarmup(warmup=int(5e12) // batch // 2 + 2000 // 2)
    assert (half.warmup, clock2.max_steps) == (597_046, 1_668_931)
    part2 = run(clock2, half, optim2, end_step)

    ref = {**part1, **part2}
    assert all(a == b for a, b in ref.values())  # both param groups follow the one schedule
    steps = np.array(sorted(ref))
    got = np.asarray(stage1_schedule()(jnp.asarray(steps)))
    np.testing.assert_allclose(got, [ref[s][0] for s in steps], rtol=1e-6)
    # the resume lands on HalfCosWithWarmup's warmup ramp, 0.38% below the cosine's last value
    assert ref[596_048][0] == pytest.approx(1.65e-4 * 596_048 / 597_046, rel=1e-12)
    assert ref[596_048][0] / ref[596_047][0] == pytest.approx(1 - 3.82e-3, abs=1e-5)
