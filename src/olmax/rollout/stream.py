"""Where the RL loop's groups come from: a stream of scored groups (a prompt's grpo.samples_per_prompt
responses with their rewards) in the order the prompts were taken, which the loop reads a step at a time
(olmax.rollout.producer). Two streams, one per grpo.rollout_engine:

- `StaticStream`: a call of the static sampler (olmax.rollout.sampler.sample) per grpo.prompts_per_step
  prompts, decoded until its longest row stops, then scored; groups a step does not read are dropped
  and their prompts given back (`end_step`).
- `EngineStream`: the slot engine (olmax.rollout.engine) decoding continuously. Groups enter it in the
  order of the prompts while fewer than (grpo.max_staleness + 1) steps' worth of them are open (admitted,
  not yet read, and not known to be dropped by active sampling's filter): admission control, so a group
  is read within max_staleness rollouts of its admission and nothing is ever discarded for being stale.
  A group is scored as soon as its last row stops, on a worker thread while the device goes on decoding
  (one process; several score in order on the main thread, their merge being a collective). Rows that
  have not stopped when a step ends carry into the next steps and go on with the new parameters
  (in-flight updates): each token keeps the version of the parameters it was drawn under and its
  sampler log-prob, which grpo.tis_cap corrects.

Both key the draws alike: the k-th call of prompts (grpo.prompts_per_step of the order at a time) draws
with seed data.seed x 1,000,003 + k, its j-th prompt's samples are rows j x samples_per_prompt + s. The
engine gives the static sampler's tokens for the same seed and row (olmax.rollout.engine), so with
grpo.max_staleness=0 the two streams give a run the same groups.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Optional

import jax
import numpy as np

from olmax.config.experiment import ExperimentConfig
from olmax.data.prompts import PromptSet
from olmax.errors import ConfigError
from olmax.model.sharding import gather
from olmax.rollout import groups
from olmax.rollout.engine import SlotEngine
from olmax.rollout.engine_types import Finished
from olmax.rollout.sampler import FINISH, Sampling, sample
from olmax.rollout.scoring import Scored, Scorer


class Group(NamedTuple):
    """One prompt's samples, scored."""

    prompt_id: int  # its row in the prompt set
    responses: list[list[int]]  # the new tokens, the stopping one included
    logps: list[list[float]]  # the sampler's log-prob of each
    versions: list[list[int]]  # the policy version (rollouts produced before it) each was drawn under
    truncated: int  # samples that ran to grpo.max_response_len
    rewards: np.ndarray  # (samples,) float32
    scores: list[tuple[str, float]]  # (verifier name, score) of every sample's pairs


def call_seed(cfg: ExperimentConfig, call: int) -> int:
    """The sampling seed of the `call`-th call of prompts."""
    return cfg.data.seed * 1_000_003 + call


class StaticStream:
    """Groups from the static sampler, a call of grpo.prompts_per_step prompts at a time. `take()` gives
    the next call's (number, prompt ids)."""

    def __init__(self, cfg: ExperimentConfig, mesh, prompts: PromptSet, scorer: Scorer, take, eos_ids, stops):
        self.cfg, self.rl, self.mesh, self.prompts, self.scorer = cfg, cfg.grpo, mesh, prompts, scorer
        self.take, self.eos_ids, self.stops = take, eos_ids, stops
        self.buffer: deque[Group] = deque()
        self.timing: Counter = Counter()

    def next_group(self, params, version: int) -> Group:
        if not self.buffer:
            self.buffer.extend(self._call(params, version))
        return self.buffer.popleft()

    def end_step(self) -> int:
        """Drop the groups no step read; returns how many (their prompts go back to the order)."""
        left = len(self.buffer)
        self.buffer.clear()
        return left

    def _call(self, params, version: int) -> list[Group]:
        rl, n = self.rl, self.rl.samples_per_prompt
        call, ids = self.take()
        jax.block_until_ready(params)  # the previous step's update, dispatched asynchronously, is not rollout time
        t0 = time.perf_counter()
        out = sample(
            params,
            self.cfg.model,
            [self.prompts.prompts[i].ids for i in ids],
            rl.max_response_len,
            n=n,
            sampling=Sampling(temperature=rl.temperature, seed=call_seed(self.cfg, call)),
            eos_ids=self.eos_ids,
            stop_text=self.stops,
            mesh=self.mesh,
            prompts_per_program=rl.sample_prompts,
        )
        tokens, logps, lengths, finish = (gather(x) for x in out)
        self.timing["sample_s"] += time.perf_counter() - t0
        # each program (grpo.sample_prompts' prompts' rows) decodes until its longest row has stopped
        per = (rl.sample_prompts or len(ids)) * n
        for start in range(0, len(tokens), per):
            longest = int(lengths[start : start + per].max())
            self.timing["decode_steps"] += longest
            self.timing["slot_steps"] += longest * len(tokens[start : start + per])
        self.timing["useful_tokens"] += int(lengths.sum())
        rows = [self.prompts.prompts[i] for i in ids for _ in range(n)]
        responses = [tokens[r, : lengths[r]].tolist() for r in range(len(rows))]
        scored = self.scorer(rows, responses)
        self.timing.update(scored.counts)
        out_groups = []
        for j, pid in enumerate(ids):
            span = range(j * n, (j + 1) * n)
            out_groups.append(
                Group(
                    int(pid),
                    [responses[r] for r in span],
                    [logps[r, : lengths[r]].tolist() for r in span],
                    [[version] * int(lengths[r]) for r in span],
                    int(np.sum(finish[span.start : span.stop] == FINISH.index("length"))),
                    scored.rewards[span.start : span.stop],
                    [pair for r in span for pair in scored.scores[r]],
                )
            )
        return out_groups

    def state(self) -> dict:
        return {}

    def restore(self, state: dict, arrays: dict) -> None:
        pass


@dataclass
class _Admitted:
    """A group in the engine stream: admitted, maybe finished and scored, not yet read."""

    call: int
    position: int  # its prompt's place in the call
    prompt_id: int
    engine_group: int
    version: int  # the rollouts produced when it was admitted
    rows: dict = field(default_factory=dict)  # sample -> Finished
    scored: Optional[Future] = None
    group: Optional[Group] = None
    completed: Optional[int] = None  # the how-manieth group of the stream it was whose rows all stopped

    def resolved(self) -> bool:
        return self.scored is not None and self.scored.done()


def engine_mesh(cfg: ExperimentConfig, mesh):
    """The mesh the slot engine decodes on: the trainer's, or with grpo.kv_gib none (pages are one
    device's, olmax.rollout.pages; the parameters are already on that device). ConfigError for pages
    on a mesh of several devices."""
    gib = cfg.grpo.kv_gib
    if not gib or mesh is None:
        return mesh
    if mesh.size > 1:
        raise ConfigError(
            f"grpo.kv_gib={gib:g} pages one device's KV cache and this mesh has {mesh.size} devices "
            "(or set grpo.kv_gib=0: whole rings, split over the mesh)"
        )
    return None


class EngineStream:
    """Groups from the slot engine (module doc). `take()` gives the next call's (number, prompt ids)."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        mesh,
        prompts: PromptSet,
        scorer: Scorer,
        take: Callable[[], tuple[int, np.ndarray]],
        eos_ids,
        stops,
        slots: int,
    ):
        self.cfg, self.rl, self.prompts, self.scorer, self.take = cfg, cfg.grpo, prompts, scorer, take
        rl = self.rl
        self._engine_args = dict(
            slots=slots,
            cache_len=rl.max_prompt_len + rl.max_response_len,
            prompt_len=rl.max_prompt_len,
            sampling=Sampling(temperature=rl.temperature),
            eos_ids=eos_ids,
            stop_text=stops,
            kv_gib=rl.kv_gib,
        )
        self.mesh = mesh = engine_mesh(cfg, mesh)
        self.engine = SlotEngine(cfg.model, mesh, **self._engine_args)
        self._compiled = False  # the engine's programs, compiled ahead at the first read (next_group)
        self.open: deque[_Admitted] = deque()  # admitted and not read, in admission order
        self.step_read: list[Group] = []  # read since the step began: they count as the step's until it ends
        self.call: Optional[tuple[int, np.ndarray, int]] = None  # (number, prompt ids, next position)
        self.timing: Counter = Counter()
        self._completions = 0  # groups whose rows have all stopped, so far (_Admitted.completed)
        # one process scores on a worker while the device decodes; several in order, on this thread
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="scoring") if jax.process_count() == 1 else None

    # ------------------------------------------------------------------------------------------
    # admission

    def _counted(self) -> int:
        """Groups admitted and not yet part of an ended step: all of them, but with active sampling those
        scored without a reward spread (the filter drops them; a step reads them on its way)."""
        if not self.rl.active_sampling:
            return len(self.open) + len(self.step_read)
        open_ = sum(1 for a in self.open if a.group is None or not _zero_spread(a.group))
        return open_ + sum(1 for g in self.step_read if not _zero_spread(g))

    def _admit(self, version: int) -> None:
        rl = self.rl
        while self._counted() < (rl.max_staleness + 1) * rl.prompts_per_step:
            if self.call is None or self.call[2] == len(self.call[1]):
                number, ids = self.take()
                self.call = (number, ids, 0)
            number, ids, j = self.call
            self.call = (number, ids, j + 1)
            n = rl.samples_per_prompt
            engine_group = self.engine.add(
                self.prompts.prompts[ids[j]].ids,
                n,
                first_index=j * n,
                limits=rl.max_response_len,
                seed=call_seed(self.cfg, number),
            )
            self.open.append(_Admitted(number, j, int(ids[j]), engine_group, version))

    # ------------------------------------------------------------------------------------------
    # reading

    def next_group(self, params, version: int) -> Group:
        """The next group (`_next`), decoding and scoring until it is scored. Once its rows have all
        stopped the read waits for its verifier rather than decode on: the chunks decoded before a step
        ends draw with its parameters, so their number must not depend on how fast a verifier answers.
        On an accelerator the first read compiles the engine's programs together
        (SlotEngine.compile_ahead, in the host's threads), counted as sampling time as the compiles at
        their first use were; on the CPU they compile at their first use: XLA:CPU's compiles did not
        overlap in threads there and the ahead step cost the first batch time (docs/rollout-engine.md)."""
        if not self._compiled and jax.default_backend() != "cpu":
            t0 = time.perf_counter()
            self.engine.compile_ahead(params, shortest=min(len(p.ids) for p in self.prompts.prompts))
            self.timing.update(sample_s=time.perf_counter() - t0)
        self._compiled = True
        while True:
            self._admit(version)
            self._collect()
            head = self._next(version)
            if head is not None and head.group is not None:
                self.open.remove(head)
                self.step_read.append(head.group)
                return head.group
            if head is not None and head.scored is not None:
                head.scored.result()
                continue
            t0 = time.perf_counter()
            chunk = self.engine.run_chunk(params, version)
            c = chunk.counters
            self.timing.update(
                sample_s=time.perf_counter() - t0,
                insert_s=c.insert_s,
                decode_steps=c.decode_steps,
                slot_steps=c.read_slot_steps,  # a narrowed step by what it reads (Counters)
                useful_tokens=c.useful_tokens,
            )
            self._route(chunk.finished)

    def _next(self, version: int) -> Optional[_Admitted]:
        """The group the next read takes, once scored: in grpo.read_order "prompt" the oldest open one;
        in "completion" the open one whose rows all stopped first (None: none has yet), but the oldest
        once it was admitted max_staleness rollouts ago, so no group waits longer than in prompt order."""
        oldest = self.open[0]
        if self.rl.read_order == "prompt" or version - oldest.version >= self.rl.max_staleness:
            return oldest
        done = [a for a in self.open if a.completed is not None]
        return min(done, key=lambda a: a.completed) if done else None

    def end_step(self) -> int:
        """The step has read its groups. Synchronous (max_staleness 0): the call's prompts not admitted go
        back to the order (the static stream's rule, so both give the same groups); returns how many."""
        self.step_read = []
        if self.rl.max_staleness or self.call is None:
            return 0
        left = len(self.call[1]) - self.call[2]
        self.call = None
        return left

    def _route(self, finished: list[Finished]) -> None:
        by_engine = {a.engine_group: a for a in self.open}
        n = self.rl.samples_per_prompt
        for row in finished:
            admitted = by_engine[row.group]
            admitted.rows[row.index - admitted.position * n] = row
            if len(admitted.rows) == n:
                admitted.completed, self._completions = self._completions, self._completions + 1
                self._score(admitted)

    def _score(self, admitted: _Admitted) -> None:
        rows = [admitted.rows[s] for s in range(self.rl.samples_per_prompt)]
        prompts = [self.prompts.prompts[admitted.prompt_id]] * len(rows)
        work = lambda: self.scorer(prompts, [r.tokens.tolist() for r in rows])  # noqa: E731
        if self._pool is not None:
            admitted.scored = self._pool.submit(work)
        else:
            admitted.scored = Future()
            admitted.scored.set_result(work())

    def _collect(self) -> None:
        """Groups whose scoring has finished become readable."""
        for a in self.open:
            if a.group is None and a.resolved():
                scored = a.scored.result()
                self.timing.update(scored.counts)
                a.group = _group(a, scored)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    # ------------------------------------------------------------------------------------------
    # state (a checkpoint keeps the open groups and the engine's unfinished rows)

    def state(self) -> tuple[dict, dict]:
        """(JSON, arrays) of what the stream holds: the open groups, their finished rows and, for those
        scored, their rewards and scores (a resume scores nothing again: a verifier may answer otherwise
        on a second call, an LLM judge or a program near its time limit), the engine's unfinished rows,
        the current call. The rows in flight then leave their slots and wait to be prefilled again, here
        as in a run resumed from this state, so a run that stops here and one that goes on decode the
        same tokens (a row's earlier keys and values are recomputed by the parameters of that moment in
        both)."""
        for a in self.open:
            if a.scored is not None:
                a.scored.result()
        self._collect()
        done = [(a, s, row) for a in self.open for s, row in sorted(a.rows.items())]
        if self.step_read:
            raise RuntimeError("a stream's state is taken between steps (after end_step)")
        json_state = {
            "open": [_open_entry(a) for a in self.open],
            "call": None if self.call is None else [self.call[0], [int(i) for i in self.call[1]], self.call[2]],
            "completions": self._completions,
        }
        snapshot = self.engine.snapshot()
        self._restart(snapshot)
        return json_state, {"engine": snapshot, "finished": _pack_rows(done)}

    def restore(self, state: dict, arrays: Optional[dict]) -> None:
        """Back to a `state()`'s (JSON, arrays); arrays left out (none in flight, or empty) are empty."""
        empty = {"finished": _pack_rows([]), "engine": self.engine.snapshot()}
        arrays = {name: {**part, **((arrays or {}).get(name) or {})} for name, part in empty.items()}
        self.open = deque(_Admitted(*entry[:5]) for entry in state["open"])
        if state["call"] is not None:
            self.call = (state["call"][0], np.asarray(state["call"][1], np.int64), state["call"][2])
        self._completions = state.get("completions", 0)
        by_engine = {a.engine_group: a for a in self.open}
        for group, index, row in _unpack_rows(arrays["finished"]):
            by_engine[group].rows[index] = row
        for a, entry in zip(self.open, state["open"]):
            saved = entry[5] if len(entry) > 5 else None  # a checkpoint of before scores were kept: none
            a.completed = entry[6] if len(entry) > 6 else None
            if saved is not None:  # counted in the figures of the rollout that scored it, not again
                a.scored = Future()
                rewards, scores = saved
                a.scored.set_result(
                    Scored(np.asarray(rewards, np.float32), [[tuple(p) for p in r] for r in scores], Counter())
                )
            elif len(a.rows) == self.rl.samples_per_prompt:
                self._score(a)
        self._restart(arrays["engine"])

    def _restart(self, snapshot: dict) -> None:
        """The engine as a new one holding `snapshot`'s rows, waiting (its cache released before a fresh
        one is made: one is alive at a time); its next groups numbered after every open one's."""
        self.engine.reset()
        self.engine.restore(snapshot, next_group=max([a.engine_group + 1 for a in self.open], default=0))


def _open_entry(a: _Admitted) -> list:
    """An open group in the stream's JSON state: where it came from, and its scores once scored."""
    scored = None
    if a.scored is not None:
        result = a.scored.result()
        scored = [result.rewards.tolist(), [[list(pair) for pair in pairs] for pairs in result.scores]]
    return [a.call, a.position, a.prompt_id, a.engine_group, a.version, scored, a.completed]


def _zero_spread(group: Group) -> bool:
    return bool(np.all(group.rewards == group.rewards[0]))


def _group(a: _Admitted, scored) -> Group:
    rows = [a.rows[s] for s in range(len(a.rows))]
    return Group(
        a.prompt_id,
        [r.tokens.tolist() for r in rows],
        [r.logprobs.tolist() for r in rows],
        [r.versions.tolist() for r in rows],
        sum(r.finish == "length" for r in rows),
        scored.rewards,
        [pair for pairs in scored.scores for pair in pairs],
    )


FIELDS = ("tokens", "logprobs", "versions")


def _pack_rows(done: list) -> dict[str, np.ndarray]:
    """Finished rows of open groups as flat arrays (ragged fields concatenated, lengths beside them)."""
    cat = lambda name, dtype: np.asarray([x for _, _, r in done for x in getattr(r, name)], dtype)  # noqa: E731
    return {
        "group": np.asarray([a.engine_group for a, _, _ in done], np.int64),
        "sample": np.asarray([s for _, s, _ in done], np.int64),
        "index": np.asarray([r.index for _, _, r in done], np.int64),
        "finish": np.asarray([FINISH.index(r.finish) for _, _, r in done], np.int64),
        "prompt_lens": np.asarray([len(r.prompt) for _, _, r in done], np.int64),
        "prompts": cat("prompt", np.int32),
        "lens": np.asarray([len(r.tokens) for _, _, r in done], np.int64),
        **{name: cat(name, dtype) for name, dtype in zip(FIELDS, (np.int32, np.float32, np.int32))},
    }


def _unpack_rows(saved: dict[str, np.ndarray]):
    cuts = lambda lens: np.cumsum(np.concatenate([[0], lens])).astype(np.int64)  # noqa: E731
    p, t = cuts(saved["prompt_lens"]), cuts(saved["lens"])
    for i in range(len(saved["group"])):
        ragged = [np.asarray(saved[name][t[i] : t[i + 1]]) for name in FIELDS]
        prompt = np.asarray(saved["prompts"][p[i] : p[i + 1]], np.int32)
        finish = FINISH[int(saved["finish"][i])]
        row = Finished(int(saved["index"][i]), int(saved["group"][i]), prompt, *ragged, finish)
        yield row.group, int(saved["sample"][i]), row


def sampling_figures(read: list[Group], decoded: Counter, run: Counter, version: int) -> dict:
    """The rollout figures of how the groups a step read were sampled: staleness (rollouts between the
    parameters that drew a token and version, the ones the rollout trains from) and slot efficiency,
    useful tokens / slot steps, of the decoding done while this rollout was read (`decoded`; none where
    its groups were decoded while earlier steps ran) and of the run's so far (`run`, kept across a
    resume)."""
    stale = np.asarray([version - v for g in read for r in g.versions for v in r], np.float64)
    out = {
        "rollout/staleness_mean": float(stale.mean()) if stale.size else 0.0,
        "rollout/staleness_max": float(stale.max()) if stale.size else 0.0,
    }
    if decoded.get("slot_steps"):
        out["rollout/slot_efficiency"] = decoded["useful_tokens"] / decoded["slot_steps"]
    if run.get("slot_steps"):
        out["rollout/slot_efficiency_run"] = run["useful_tokens"] / run["slot_steps"]
    return out


def zero_spread(read: list[Group], n: int) -> np.ndarray:
    """(groups,) bool: the groups of `read` whose rewards are all equal (none read: empty)."""
    if not read:
        return np.zeros(0, bool)
    return np.asarray(groups.zero_spread(np.concatenate([g.rewards for g in read]), n))
