"""AdamW with skip-step, weight-decay mask and global-norm clipping: OLMo-core's `SkipStepAdamW`
as AI2 trained OLMo 3 with it (docs/reference.md, "Skip-step AdamW").

One optimizer step, `Optimizer.step(grads, state, params, lr=, loss=)`:
1. total gradient norm (before clipping), then clipping as torch's `clip_grads_with_norm_`:
   grads *= min(1, max_norm / (norm + 1e-6));
2. the skip decision from the rolling window of (CE loss, pre-clip norm): factor f = 0 when either
   value lies more than `sigma` unbiased standard deviations ABOVE the mean of the previous values,
   else 1; never 0 before max(2, window // 2) values (this one included) have been seen. The new
   values then enter the window, skipped or not;
3. AdamW in OLMo-core's update order, applied only when f = 1:
       p *= 1 - lr * wd;  m += (1-b1)(g - m);  v = b2 v + (1-b2) g^2
       p -= lr / (1 - b1^(t+1)) * m / (sqrt(v) / sqrt(1 - b2^(t+1)) + eps);  t += 1
   so a skipped step leaves parameters, moments and the bias-correction counter t untouched.

Differences from OLMo-core, all deliberate: the window lives in the optimizer state (so it is
checkpointed and a resumed run can skip at once; OLMo-core keeps it in memory and cannot skip for 64
steps after a resume); the grad-norm test is always on (OLMo-core drops it when clipping is off); a
skip selects the old values where OLMo-core multiplies the update by 0 (identical for finite
gradients; a NaN gradient cannot reach the moments of a skipped step).
The moments are float32 whatever the parameter dtype (a bf16 second moment cost the MaxText run
+0.93 loss). Everything is jax.numpy: no host sync.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from olmax.config.optimizer import OptimizerConfig
from olmax.errors import ConfigError

CLIP_EPS = 1e-6  # torch.nn.utils.clip_grads_with_norm_ divides by (total_norm + 1e-6)


# ----------------------------------------------------------------------------------------------
# Weight-decay mask


def param_path(path) -> str:
    """'layers/q_proj' for the key path of params['layers']['q_proj']."""
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def decay_mask(params, no_decay: tuple[str, ...]):
    """Pytree of bools: True where weight decay applies. A parameter is excluded when its path equals
    an entry of no_decay or lies below it ('layers' excludes every layer weight). An entry that names
    no parameter is an error, so a typo cannot silently decay everything."""
    paths = [param_path(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)]
    for entry in no_decay:
        if not any(p == entry or p.startswith(entry + "/") for p in paths):
            raise ConfigError(f"optimizer.no_decay entry {entry!r} matches no parameter; paths are {paths}")

    def decays(path, _):
        p = param_path(path)
        return not any(p == e or p.startswith(e + "/") for e in no_decay)

    return jax.tree_util.tree_map_with_path(decays, params)


# ----------------------------------------------------------------------------------------------
# AdamW with a step factor, as an optax transformation


class AdamWState(NamedTuple):
    count: jax.Array  # int32: applied (not skipped) updates, the bias-correction counter t
    mu: optax.Updates  # float32 first moments
    nu: optax.Updates  # float32 second moments


def adamw(b1: float, b2: float, eps: float, weight_decay: float, mask) -> optax.GradientTransformationExtraArgs:
    """AdamW whose update takes the learning rate and the step factor f (1 = apply, 0 = skip) as
    extra arguments: `update(grads, state, params, lr=, step_factor=)`. Moments and the returned
    updates are float32 whatever the parameter dtype; optax.apply_updates adds them in float32 and
    casts the sum back to the parameter dtype."""

    def init(params):
        zeros = lambda p: jnp.zeros(p.shape, jnp.float32)
        return AdamWState(jnp.zeros((), jnp.int32), jax.tree.map(zeros, params), jax.tree.map(zeros, params))

    def update(grads, state, params, *, lr, step_factor, **_):
        apply = jnp.asarray(step_factor) > 0
        lr = jnp.asarray(lr, jnp.float32)
        t = (state.count + 1).astype(jnp.float32)
        bc1 = 1.0 - jnp.float32(b1) ** t
        bc2_sqrt = jnp.sqrt(1.0 - jnp.float32(b2) ** t)
        step_size = lr / bc1

        def leaf(g, m, v, p, decays):
            g = g.astype(jnp.float32)
            p32 = p.astype(jnp.float32)
            m_new = m + (1.0 - b1) * (g - m)
            v_new = v * b2 + (1.0 - b2) * g * g
            decayed = p32 * (1.0 - lr * weight_decay) if decays else p32
            new_p = decayed - step_size * m_new / (jnp.sqrt(v_new) / bc2_sqrt + eps)
            # A skip selects the old values instead of multiplying by 0 as OLMo-core does: the same
            # for finite gradients, and a NaN/inf gradient cannot leak into a skipped step's moments.
            # float32 update: for float32 parameters p + (new_p - p) == new_p exactly (Sterbenz),
            # and bf16 parameters are rounded once, from the float32 result.
            return jnp.where(apply, new_p - p32, 0.0), jnp.where(apply, m_new, m), jnp.where(apply, v_new, v)

        treedef = jax.tree.structure(params)
        flat = [jax.tree.leaves(x) for x in (grads, state.mu, state.nu, params, mask)]
        updates, mu, nu = (jax.tree.unflatten(treedef, list(xs)) for xs in zip(*map(leaf, *flat)))
        return updates, AdamWState(state.count + apply.astype(jnp.int32), mu, nu)

    return optax.GradientTransformationExtraArgs(init, update)


# ----------------------------------------------------------------------------------------------
# Skip-step window


class SkipWindow(NamedTuple):
    """The last `window` CE losses and pre-clip gradient norms (a ring buffer) and how many were seen."""

    losses: jax.Array  # float32 (window,)
    grad_norms: jax.Array  # float32 (window,)
    seen: jax.Array  # int32


def skip_window_init(window: int) -> SkipWindow:
    return SkipWindow(jnp.zeros((window,), jnp.float32), jnp.zeros((window,), jnp.float32), jnp.zeros((), jnp.int32))


def _mean_std(values, valid, n):
    """Mean and unbiased (n - 1) standard deviation of values[valid], n = valid.sum() >= 2."""
    mean = jnp.sum(jnp.where(valid, values, 0.0)) / n
    dev = jnp.where(valid, values - mean, 0.0)
    return mean, jnp.sqrt(jnp.sum(dev * dev) / (n - 1))


def step_factor(win: SkipWindow, loss, grad_norm, sigma: float) -> jax.Array:
    """1.0 to apply the step, 0.0 to skip it. The window holds the values BEFORE this step; OLMo-core
    keeps window + 1 values including the newest and takes the statistics over all but the newest."""
    window = win.losses.shape[0]
    n_prev = jnp.minimum(win.seen, window)
    valid = jnp.arange(window) < n_prev
    n = jnp.maximum(n_prev, 2).astype(jnp.float32)  # guards the division; unused while warming up
    loss_mean, loss_std = _mean_std(win.losses, valid, n)
    gn_mean, gn_std = _mean_std(win.grad_norms, valid, n)
    ok = jnp.logical_and(loss - loss_mean <= sigma * loss_std, grad_norm - gn_mean <= sigma * gn_std)
    warming_up = n_prev + 1 < max(2, window // 2)
    return jnp.where(jnp.logical_or(warming_up, ok), 1.0, 0.0).astype(jnp.float32)


def skip_window_push(win: SkipWindow, loss, grad_norm) -> SkipWindow:
    i = win.seen % win.losses.shape[0]  # order within the window does not matter to mean and std
    return SkipWindow(
        win.losses.at[i].set(jnp.asarray(loss, jnp.float32)),
        win.grad_norms.at[i].set(jnp.asarray(grad_norm, jnp.float32)),
        win.seen + 1,
    )


# ----------------------------------------------------------------------------------------------
# The optimizer step


class OptState(NamedTuple):
    adam: AdamWState
    window: SkipWindow


class StepStats(NamedTuple):
    grad_norm: jax.Array  # pre-clip global norm
    skipped: jax.Array  # float32, 1.0 when the step was skipped


def clip_by_global_norm(grads, max_norm: float):
    """(clipped grads, pre-clip norm) with torch's coefficient min(1, max_norm / (norm + 1e-6));
    max_norm <= 0 turns clipping off."""
    norm = jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in jax.tree.leaves(grads)))
    if max_norm <= 0:
        return grads, norm
    coef = jnp.minimum(1.0, max_norm / (norm + CLIP_EPS))
    return jax.tree.map(lambda g: (g * coef).astype(g.dtype), grads), norm


class Optimizer:
    """Clipping + skip-step + AdamW from an OptimizerConfig. Pure: `step` returns new values."""

    def __init__(self, cfg: OptimizerConfig, params_like):
        self.cfg = cfg
        self.tx = adamw(cfg.b1, cfg.b2, cfg.eps, cfg.weight_decay, decay_mask(params_like, cfg.no_decay))

    def init(self, params) -> OptState:
        return OptState(self.tx.init(params), skip_window_init(self.cfg.skip_window))

    def step(self, grads, state: OptState, params, *, lr, loss, hold=None):
        """-> (params, state, StepStats). `loss` is the CE loss without z-loss, global-batch mean.
        `hold`: a bool array, True to skip this step whatever the rule says (a GRPO batch with nothing
        to learn from: no parameter, moment or counter moves)."""
        grads, norm = clip_by_global_norm(grads, self.cfg.max_grad_norm)
        if self.cfg.skip_step:
            f = step_factor(state.window, loss, norm, self.cfg.skip_sigma)
            window = skip_window_push(state.window, loss, norm)
        else:
            f, window = jnp.float32(1.0), state.window
        if hold is not None:
            f = jnp.where(hold, jnp.float32(0.0), f)
        updates, adam = self.tx.update(grads, state.adam, params, lr=lr, step_factor=f)
        return optax.apply_updates(params, updates), OptState(adam, window), StepStats(norm, 1.0 - f)
