"""The rewards of sampled responses: each response's text (its stop token left out, cut right after a
stop string) scored by its prompt row's verifiers (olmax.rewards.verifiers), and the row's reward
grpo.reward_scale x the sum of the scores (open-instruct's verification_reward); a verifier that hangs,
fails or returns garbage scores 0 and is counted.

Several processes (a multi-host slice): every process verifies its share of the samples (sample r on
process r mod the process count, as open-instruct spreads verification over its workers; `verified_here`)
and the shares are merged on all of them, so every process holds the same rewards. The merge is a
collective: every process scores the same samples in the same order.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import NamedTuple, Sequence

import jax
import numpy as np

from olmax.data.prompts import Prompt
from olmax.model.sharding import merge_strided
from olmax.rewards import verifiers as rewards
from olmax.rollout.text import cut_at_stop

VERIFY_TIMEOUT_S = 30.0  # per call; a code call gets more when its tests may take more (rewards.call_bound)


class Scored(NamedTuple):
    """The rewards of a list of responses."""

    rewards: np.ndarray  # (responses,) float32: grpo.reward_scale x the sum of the row's verifier scores
    scores: list[list[tuple[str, float]]]  # per response, (verifier name, score) of each of its pairs
    counts: Counter  # verifier/NAME/STATUS, verified_here, verify_s


class Scorer:
    """Scores responses to the RL prompts: `scorer(rows, responses)`, rows[r] the prompt row of
    responses[r] (token ids, the stopping token included)."""

    def __init__(self, tok, eos_ids: Sequence[int], stop: Sequence[str], scale: float, options: dict):
        self.tok, self.eos_ids, self.stop, self.scale, self.options = tok, tuple(eos_ids), tuple(stop), scale, options

    def text(self, response: Sequence[int]) -> str:
        """The text a verifier scores: the response without its end-of-turn token, cut after a stop string."""
        response = list(response)
        if response and response[-1] in self.eos_ids:
            response = response[:-1]
        return cut_at_stop(self.tok.decode(response), self.stop)

    def __call__(self, rows: Sequence[Prompt], responses: Sequence[Sequence[int]]) -> Scored:
        counts: Counter = Counter()
        width = max(len(p.verifiers) for p in rows)
        part_scores = np.zeros((len(rows), width), np.float64)
        statuses = np.zeros((len(rows), width), np.int32)
        t0 = time.perf_counter()
        for r in range(jax.process_index(), len(rows), jax.process_count()):
            p = rows[r]
            _, parts = rewards.reward(
                list(p.verifiers),
                list(p.ground_truths),
                self.text(responses[r]),
                VERIFY_TIMEOUT_S,
                self.options,
                scale=self.scale,
            )
            for j, (_, score, status) in enumerate(parts):
                part_scores[r, j], statuses[r, j] = score, rewards.STATUSES.index(status)
            counts["verified_here"] += 1
        counts["verify_s"] += time.perf_counter() - t0
        part_scores, statuses = merge_strided(part_scores), merge_strided(statuses)
        values, scores = [], []
        for r, p in enumerate(rows):
            parts = [
                (name, float(part_scores[r, j]), rewards.STATUSES[statuses[r, j]]) for j, name in enumerate(p.verifiers)
            ]
            values.append(rewards.total(parts, self.scale))  # open-instruct's verification_reward
            for name, _, status in parts:
                counts[f"verifier/{name}/{status}"] += 1
            scores.append([(name, score) for name, score, _ in parts])
        return Scored(np.asarray(values, np.float32), scores, counts)
