"""Learning-rate schedules with OLMo-core's semantics (docs/reference.md, "Recipe and schedules").

A schedule maps the 1-based optimizer step to a learning rate: the first optimizer step is step 1,
as in OLMo-core's trainer (so with 2000 warmup steps, step 1 uses lr/2000 and step 2000 the peak).
The functions are written in jax.numpy so the train step evaluates them on device from its traced
step counter; they also accept plain Python ints.

Precision: everything is float32 (JAX's default). Step differences are taken in int32 and the
fraction (step - start) / length is one correctly rounded division of two integers below 2^24, so
the 1.6M-step stage-1 horizon reproduces OLMo-core's float64 values to ~1e-7 relative.

Horizons are given in tokens (OLMo-core style) and converted to steps with ceil(tokens / tokens per
step), e.g. ceil(5e12 / 4194304) = 1,192,093, or in epochs of the run's data (the batches in an
epoch, once the data is opened); without either the trainer's max_steps is used.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import jax.numpy as jnp

from olmax.config.schedule import ScheduleConfig
from olmax.errors import ConfigError

Schedule = Callable[[jnp.ndarray], jnp.ndarray]


def _fraction(step, start: int, length: int):
    """(step - start) / length in float32, clipped to [0, 1]."""
    num = (jnp.asarray(step, jnp.int32) - start).astype(jnp.float32)
    return jnp.clip(num / jnp.float32(max(length, 1)), 0.0, 1.0)


def _warmup(step, lr: float, warmup: int):
    """Linear from 0: lr * step / warmup (OLMo-core `_linear_warmup` with warmup_min_lr 0)."""
    return lr * _fraction(step, 0, warmup)


def _cosine(step, lr: float, final: float, start: int, t_max: int):
    """From lr at `start` to `final` at t_max along half a cosine period; `final` after t_max."""
    x = _fraction(step, start, t_max - start)
    # (1 + cos(pi x)) / 2 written as cos^2(pi x / 2): the smaller float32 argument keeps ~1e-7.
    return final + (lr - final) * jnp.cos(0.5 * jnp.pi * x) ** 2


def cosine_with_warmup(step, *, lr: float, warmup: int, t_max: int, alpha_f: float):
    """OLMo-core `CosWithWarmup`: warmup while step < warmup, then cosine to alpha_f * lr at t_max."""
    step = jnp.asarray(step, jnp.int32)
    cos = _cosine(step, lr, alpha_f * lr, warmup, t_max)
    return jnp.where(step < warmup, _warmup(step, lr, warmup), cos) if warmup > 0 else cos


def stitched_cosine(
    step,
    *,
    lr: float,
    warmup: int,
    t_max: int,
    switch_step: int,
    half_cos_warmup: int,
    final_t_max: int,
    alpha_f: float,
):
    """AI2's stage 1 across its resume: `cosine_with_warmup` before switch_step, then from switch_step on
    OLMo-core's `HalfCosWithWarmup(warmup=half_cos_warmup, t_max=final_t_max, alpha_f)` of the same
    1-based step. That scheduler ramps linearly from 0 to the midpoint m = (lr + alpha_f * lr) / 2
    over its warmup, so a resume before half_cos_warmup lands on the ramp (m * step / half_cos_warmup);
    from half_cos_warmup on it is the second half of a cosine from m to alpha_f * lr at final_t_max.
    AI2: switch_step 596,048 (the step after the checkpoint it resumed from), half_cos_warmup 597,046,
    so 596,047 -> 1.6535619e-4, 596,048 -> 1.6472419e-4, 597,046 -> 1.65e-4 (docs/reference.md).
    """
    step = jnp.asarray(step, jnp.int32)
    final = alpha_f * lr
    mid = 0.5 * (lr + final)
    ramp = mid * _fraction(step, 0, half_cos_warmup)
    # Half a cosine from the midpoint, x = (step - half_cos_warmup) / (T - half_cos_warmup):
    # (1 + cos(pi (1 + x) / 2)) / 2 = (1 - sin(pi x / 2)) / 2, the form with the accurate float32 argument.
    x = _fraction(step, half_cos_warmup, final_t_max - half_cos_warmup)
    half = final + (lr - final) * 0.5 * (1.0 - jnp.sin(0.5 * jnp.pi * x))
    part2 = jnp.where(step < half_cos_warmup, ramp, half)
    part1 = cosine_with_warmup(step, lr=lr, warmup=warmup, t_max=t_max, alpha_f=alpha_f)
    return jnp.where(step < switch_step, part1, part2)


def wsd(step, *, lr: float, warmup: int, t_max: int, decay: int, alpha_f: float):
    """OLMo-core `WSD`: warmup while step <= warmup, constant, then linear to alpha_f * lr over the
    last `decay` steps before t_max (decay_min_lr = alpha_f * lr)."""
    step = jnp.asarray(step, jnp.int32)
    final = alpha_f * lr
    remaining = _fraction(t_max - step, 0, decay)  # 1 at the start of the decay, 0 at t_max
    decayed = final + (lr - final) * remaining
    out = jnp.where(step >= t_max - decay, decayed, lr)
    return jnp.where(step <= warmup, _warmup(step, lr, warmup), out) if warmup > 0 else out


def linear_with_warmup(step, *, lr: float, warmup: int, t_max: int, alpha_f: float):
    """OLMo-core `LinearWithWarmup`: warmup while step < warmup, then linear to alpha_f * lr at t_max
    (stage 2: alpha_f = 0, no warmup, so step 1 already uses lr * (1 - 1/t_max))."""
    step = jnp.asarray(step, jnp.int32)
    final = alpha_f * lr
    lin = lr - (lr - final) * _fraction(step, warmup, t_max - warmup)
    return jnp.where(step < warmup, _warmup(step, lr, warmup), lin) if warmup > 0 else lin


def constant_with_warmup(step, *, lr: float, warmup: int):
    """OLMo-core `ConstantWithWarmup` (warmup while step <= warmup); warmup 0 is `ConstantScheduler`."""
    step = jnp.asarray(step, jnp.int32)
    flat = jnp.full(step.shape, lr, jnp.float32)
    return jnp.where(step <= warmup, _warmup(step, lr, warmup), flat) if warmup > 0 else flat


def steps_for_tokens(tokens: int, tokens_per_step: int) -> int:
    return math.ceil(tokens / tokens_per_step)


def _horizon(cfg: ScheduleConfig, *, max_steps: int, tokens_per_step: int, epoch_batches: Optional[int] = None) -> int:
    """The schedule's t_max in steps: from schedule.t_max_tokens, schedule.t_max_epochs x `epoch_batches`
    (the whole global batches in one epoch of the run's data; OLMo-core 3.0.0's trainer takes an epochs
    duration's max_steps from its data loader's total_batches the same way), else trainer.max_steps."""
    if cfg.t_max_epochs is not None:
        if epoch_batches is None:
            raise ConfigError(
                f"schedule.t_max_epochs={cfg.t_max_epochs} sets the horizon from the batches in an epoch, "
                "known once the data is opened (olmax train does); give schedule.t_max_tokens instead where "
                "no data is read"
            )
        return cfg.t_max_epochs * epoch_batches
    return steps_for_tokens(cfg.t_max_tokens, tokens_per_step) if cfg.t_max_tokens else max_steps


def make_schedule(
    cfg: ScheduleConfig, *, lr: float, max_steps: int, tokens_per_step: int, epoch_batches: Optional[int] = None
) -> Schedule:
    """The schedule a config describes: step (1-based, int) -> learning rate (float32)."""
    # A horizon inside the warmup is allowed (a short benchmark of a full-size recipe never leaves
    # the warmup); past the horizon every schedule holds its final value.
    t_max = _horizon(cfg, max_steps=max_steps, tokens_per_step=tokens_per_step, epoch_batches=epoch_batches)
    w, a = cfg.warmup_steps, cfg.alpha_f
    if cfg.warmup_fraction is not None:  # OLMo-core's Scheduler: warmup = round(t_max * warmup_fraction)
        w = round(t_max * cfg.warmup_fraction)
    if cfg.name == "cosine":
        return lambda s: cosine_with_warmup(s, lr=lr, warmup=w, t_max=t_max, alpha_f=a)
    if cfg.name == "stitched_cosine":
        final_t_max = steps_for_tokens(cfg.final_t_max_tokens, tokens_per_step)
        if not (w < cfg.switch_step < t_max < final_t_max and cfg.half_cos_warmup < final_t_max):
            raise ConfigError(
                f"stitched_cosine needs warmup_steps < switch_step < t_max < final t_max and half_cos_warmup "
                f"< final t_max, got {w}, {cfg.switch_step}, {t_max}, {final_t_max}, {cfg.half_cos_warmup}"
            )
        return lambda s: stitched_cosine(
            s,
            lr=lr,
            warmup=w,
            t_max=t_max,
            switch_step=cfg.switch_step,
            half_cos_warmup=cfg.half_cos_warmup,
            final_t_max=final_t_max,
            alpha_f=a,
        )
    if cfg.name == "wsd":
        decay = round(t_max * cfg.decay_fraction)
        return lambda s: wsd(s, lr=lr, warmup=w, t_max=t_max, decay=decay, alpha_f=a)
    if cfg.name == "linear":
        return lambda s: linear_with_warmup(s, lr=lr, warmup=w, t_max=t_max, alpha_f=a)
    if cfg.name == "constant":
        return lambda s: constant_with_warmup(s, lr=lr, warmup=w)
    raise ConfigError(f"unknown schedule {cfg.name!r}")
