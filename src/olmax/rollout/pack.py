"""Rollouts packed into training rows for trainer.objective=grpo, as open-instruct packs them
(`pack_sequences` in open_instruct/rl_utils.py, commit 42aa63c, the OLMo 3 7B Think RL run's).

Each sample is its prompt followed by its response. Samples are laid into rows in order: a sample
that would overflow the current row starts a new one (open-instruct's greedy rule, no reordering),
and rows are right-padded to the pack length. Per row the arrays are token-aligned, entry t
belonging to token t:

- input_ids: the tokens, `pad_id` after the last sample;
- response_mask: True on response tokens (the only ones with a loss);
- response_index: 1 + the sample's index in the rollout batch on its response tokens, 0 elsewhere
  (open-instruct's packed `response_masks`; olmax.rollout.groups.token_values spreads per-sample
  advantages with it);
- sampler_logps: the sampler's log-prob of each response token, 0 elsewhere (open-instruct puts NaN
  on prompt tokens and masks them; a number keeps the arrays finite under jit);
- doc_lens: the row's sample lengths, then one length for the padding, then zeros (the loader's
  `doc_lens`, from which the train step keeps attention within each sample and restarts positions,
  as open-instruct's `position_ids` restart per packed sample).

A sample longer than the pack length is an error: the RL config bounds prompt + response by it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class PackedRollouts:
    input_ids: np.ndarray  # (rows, pack_len) int32
    response_mask: np.ndarray  # (rows, pack_len) bool
    response_index: np.ndarray  # (rows, pack_len) int32
    sampler_logps: np.ndarray  # (rows, pack_len) float32
    doc_lens: np.ndarray  # (rows, pack_len) int32

    @property
    def rows(self) -> int:
        return self.input_ids.shape[0]


def pack_rollouts(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    logps: Sequence[Sequence[float]],
    pack_len: int,
    pad_id: int,
) -> PackedRollouts:
    """Sample i is prompts[i] + responses[i] with the sampler's log-probs logps[i] (one per response
    token); see the module doc for the layout."""
    if not len(prompts) == len(responses) == len(logps):
        raise ValueError(f"{len(prompts)} prompts, {len(responses)} responses and {len(logps)} log-prob lists")
    rows: list[list[int]] = []  # sample indices per row
    used = pack_len  # forces a first row
    for i, (p, r, lp) in enumerate(zip(prompts, responses, logps)):
        if len(lp) != len(r):
            raise ValueError(f"sample {i}: {len(r)} response tokens but {len(lp)} log-probs")
        n = len(p) + len(r)
        if n > pack_len:
            raise ValueError(f"sample {i}: {len(p)} prompt + {len(r)} response tokens exceed pack length {pack_len}")
        if used + n > pack_len:
            rows.append([])
            used = 0
        rows[-1].append(i)
        used += n
    shape = (len(rows), pack_len)
    out = PackedRollouts(
        np.full(shape, pad_id, np.int32),
        np.zeros(shape, bool),
        np.zeros(shape, np.int32),
        np.zeros(shape, np.float32),
        np.zeros(shape, np.int32),
    )
    for row, samples in enumerate(rows):
        at = 0
        lens = []
        for i in samples:
            p, r = len(prompts[i]), len(responses[i])
            out.input_ids[row, at : at + p] = prompts[i]
            out.input_ids[row, at + p : at + p + r] = responses[i]
            out.response_mask[row, at + p : at + p + r] = True
            out.response_index[row, at + p : at + p + r] = i + 1
            out.sampler_logps[row, at + p : at + p + r] = logps[i]
            lens.append(p + r)
            at += p + r
        if at < pack_len:
            lens.append(pack_len - at)  # the padding is a segment of its own
        out.doc_lens[row, : len(lens)] = lens
    return out
