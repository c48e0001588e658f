"""The RL loop's groups, host side between rollouts: advantages, the zero-spread filter, pass rates and
which groups make a batch, as open-instruct's `grpo_fast.py` does them (42aa63c / 9ade62d; the loss the
step trains with is olmax.objectives.grpo). Rewards arrive as (groups * group_size,), each group's
samples consecutive; rewards are grpo.reward_scale x the verifiers' scores (olmax.rewards.verifiers), so
the largest, a solved sample's, is `max_score` = grpo.reward_scale.

The functions over rewards are jitted: the loop calls them with one configuration, so each compiles once
and each call is one dispatch.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

STD_EPS = 1e-8  # the std normalisation's epsilon (numpy population std, as open-instruct)


def _grouped(rewards: jnp.ndarray, group_size: int) -> jnp.ndarray:
    if rewards.ndim != 1 or rewards.shape[0] % group_size:
        raise ValueError(f"rewards must be (groups * {group_size},), got shape {tuple(rewards.shape)}")
    return rewards.reshape(-1, group_size).astype(jnp.float32)


@partial(jax.jit, static_argnames=("group_size", "normalise_std"))
def advantages(rewards: jnp.ndarray, group_size: int, normalise_std: bool = False) -> jnp.ndarray:
    """(n,) per sample: reward - its group's mean (open-instruct "centered", the OLMo 3 runs'); with
    normalise_std also divided by the group's population std + 1e-8 (its "standard")."""
    r = _grouped(rewards, group_size)
    centred = r - jnp.mean(r, axis=1, keepdims=True)
    if normalise_std:
        centred = centred / (jnp.std(r, axis=1, keepdims=True) + STD_EPS)
    return centred.reshape(-1)


@partial(jax.jit, static_argnames="group_size")
def zero_spread(rewards: jnp.ndarray, group_size: int) -> jnp.ndarray:
    """(groups,) bool: True where every sample of the group has the same reward (open-instruct drops
    these: `np.std(scores) == 0`, which for its groups of 8 is exactly this equality)."""
    r = _grouped(rewards, group_size)
    return jnp.all(r == r[:, :1], axis=1)


@partial(jax.jit, static_argnames="group_size")
def pass_rates(rewards: jnp.ndarray, group_size: int, max_score: float) -> jnp.ndarray:
    """(groups,) mean reward / the largest possible reward (open-instruct's `percent_solved`)."""
    return jnp.mean(_grouped(rewards, group_size), axis=1) / max_score


def token_values(per_response: np.ndarray, response_index: np.ndarray) -> np.ndarray:
    """Per-response values (n,) -> (rows, seq) per token: response_index [b, t] = k + 1 where token t of
    packed row b is a token of response k, 0 elsewhere (open-instruct's packed `response_masks`). On the
    host: the packed rows change in number every rollout, and a device op would compile for each."""
    lookup = np.concatenate([np.zeros(1, np.float32), np.asarray(per_response, np.float32)])
    return lookup[np.asarray(response_index)]


# ----------------------------------------------------------------------------------------------
# Which groups make the batch


class Selection(NamedTuple):
    keep: jnp.ndarray  # (groups,) bool: the group enters the batch
    consumed: jnp.ndarray  # int: groups read from the stream (the rest wait for the next batch)
    full: jnp.ndarray  # bool: the batch holds num_prompts groups
    no_resample: jnp.ndarray  # (groups,) bool: the prompt is not sampled again (among the consumed)
    filtered_zero: jnp.ndarray  # int: consumed groups dropped with every reward 0
    filtered_solved: jnp.ndarray  # int: ... with every reward max_score
    filtered_other: jnp.ndarray  # int: ... with another common reward


@partial(
    jax.jit,
    static_argnames=("group_size", "num_prompts", "active", "filter_zero_spread", "no_resampling_pass_rate"),
)
def select_groups(
    rewards: jnp.ndarray,
    group_size: int,
    num_prompts: int,
    *,
    active: bool,
    filter_zero_spread: bool = True,
    no_resampling_pass_rate: Optional[float] = None,
    max_score: float,
) -> Selection:
    """open-instruct's `accumulate_inference_batches` over the groups in the order they arrived
    (rewards: (groups * group_size,)). Each group read: its prompt is marked not to be sampled again
    when its pass rate is >= no_resampling_pass_rate (before filtering: a 7-of-8 group is marked and
    still trained on); then, with filter_zero_spread, a group of equal rewards is dropped.
    active=False reads exactly num_prompts groups and keeps the survivors (the Think run); active=True
    reads until num_prompts groups survive (the Instruct run; `full` False: the stream ran out first,
    read more and call again with the rest)."""
    zero = zero_spread(rewards, group_size)
    groups = zero.shape[0]
    index = jnp.arange(groups)
    survives = ~zero if filter_zero_spread else jnp.ones_like(zero)
    if active:
        if not filter_zero_spread:
            raise ValueError("active sampling refills groups the zero-spread filter drops; it needs the filter")
        rank = jnp.cumsum(survives)
        full = rank[-1] >= num_prompts
        consumed = jnp.where(full, jnp.argmax(rank >= num_prompts) + 1, groups)
    else:
        consumed = jnp.asarray(min(num_prompts, groups))
        full = jnp.asarray(groups >= num_prompts)
    read = index < consumed
    keep = survives & read
    no_resample = jnp.zeros_like(read)
    if no_resampling_pass_rate is not None:
        no_resample = read & (pass_rates(rewards, group_size, max_score) >= no_resampling_pass_rate)
    first = _grouped(rewards, group_size)[:, 0]
    dropped = read & ~survives
    return Selection(
        keep=keep,
        consumed=consumed,
        full=full,
        no_resample=no_resample,
        filtered_zero=jnp.sum(dropped & (first == 0)),
        filtered_solved=jnp.sum(dropped & (first == max_score)),
        filtered_other=jnp.sum(dropped & (first != 0) & (first != max_score)),
    )


def next_epoch_prompts(prompt_ids: np.ndarray, excluded: np.ndarray, batch_size: int) -> tuple[np.ndarray, int]:
    """The prompts the next epoch draws from (open-instruct's ShufflingIterator drops excluded prompts
    only when an epoch ends, then reshuffles): (ids without the excluded ones, how many of them one epoch
    serves: a multiple of batch_size, the rest left out as its `effective_size`)."""
    kept = np.asarray(prompt_ids)[~np.isin(prompt_ids, excluded)]
    return kept, len(kept) - len(kept) % batch_size
