"""trainer.objective=grpo's loader: the rollout phase of the RL loop (docs/post-training/rl-loop.md, "The RL loop").

    loader = RolloutProducer(cfg, mesh, prompts, tokenizer, state=saved)
    loader.params = state.params            # the trainer sets the current policy before each next()
    batch = next(iter(loader))              # the step's packed rows (train_step.check_grpo_batch)
    loader.metrics()                        # the latest rollout's figures, logged with its steps
    loader.state()                          # JSON-able; resume with RolloutProducer(..., state=saved)

One rollout batch, as open-instruct's grpo_fast.py makes one (commit 42aa63c):
1. prompts: the next grpo.prompts_per_step prompts of the epoch's order (a permutation by
   PCG64(data.seed + epoch), olmax.data.order.cached_permutation, over the prompts not excluded);
2. sample: grpo.samples_per_prompt responses each, with the current parameters on the training mesh
   (olmax.rollout.sampler.sample: one prefill per prompt, temperature grpo.temperature, up to
   grpo.max_response_len tokens, stopping at EOS, `<|im_end|>` or the token whose text completes a
   grpo.stop string, however it is spelled (olmax.rollout.text.stop_table, as vLLM's stop strings);
3. verify: each response's text (its stop token left out, cut right after a stop string) is scored
   by its row's verifiers (olmax.rewards.verifiers.total: grpo.reward_scale x the score; a verifier that
   hangs, fails or returns garbage scores 0 and is counted);
4. select: olmax.rollout.groups.select_groups drops groups of equal rewards; with active sampling
   more prompts are sampled until prompts_per_step groups survive; prompts solved at least
   grpo.no_resampling_pass_rate of the time leave the order at the next epoch;
5. pack: the kept samples into rows of data.seq_len (olmax.rollout.pack, open-instruct's layout),
   advantages reward - group mean (olmax.rollout.groups.advantages), one value per response token;
6. serve: the rows in grpo.mini_batches consecutive parts, one per optimizer step, each padded with
   empty rows to trainer.global_batch rows (the step counts only micro-batches that hold a response
   token, as open-instruct has no empty ones). With several mini-batches the old log-probs of every
   part are computed under the parameters of the rollout's first step, before it
   (train_step.make_policy_logps).

If no group survives (every group solved or every group failed), the next prompts are sampled, up to
EMPTY_RETRIES times (`rollout/retries`), then the step gets an empty batch, which the train step does not
apply (no parameter, moment or counter moves; `rollout/empty_batch` is 1).
Rows beyond a step's trainer.global_batch are left out and counted (`rollout/rows_dropped`).

Synchronous (grpo.async_steps=0) each rollout is sampled with the parameters its first step starts
from. With grpo.async_steps=1 (open-instruct's --async_steps, Cleanba's one-step lag) a worker thread
samples, verifies and packs the next rollout while the steps on this one run, from a copy of the
parameters their first step starts from: rollout r+1 is sampled with the parameters rollout r trains
from, and the first two with the initial ones. The sampler's log-probs are then one rollout stale,
which grpo.tis_cap corrects and `debug/sampler_logp_diff_mean` shows; `rollout/wait_s` is how long the
trainer waited for its rollout.

With grpo.beta > 0 every part also gets the reference policy's log-probs (ref_logps, under the run's
starting parameters, which the trainer keeps as `reference`) for the kl3 penalty.

Several processes (a multi-host slice): every process runs the same rollout, the sampler's program over
the whole mesh; the samples are gathered to every process, each verifies its share of them (sample r on
process r mod the process count; `rollout/verified_here`), the scores are gathered to every process,
each packs all the samples (the same rewards and rows everywhere), and the trainer takes each
process's devices' rows of the batch.

The loop needs data.doc_masking and model.rope_positions=document (samples share packed rows), and
grpo.async_steps=0 with several processes; anything else is refused before the first rollout.

Determinism and resume: the draws of sampling call k are keyed by (data.seed, k), and k is in the state.
The loader state holds the prompt order's position after the rollouts produced so far, and those not yet
wholly trained on (the rest of the current one, old log-probs included, and the one sampled ahead) go
into the checkpoint as arrays (`state()["arrays"]`, the checkpoint's data_arrays item). So a run resumed
from any step replays the same rollouts and losses as one that never stopped; a checkpoint waits for
the rollout in production.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import time
from collections import Counter, deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Iterator, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from olmax.config.experiment import ExperimentConfig
from olmax.config.mesh import BATCH_AXES
from olmax.config.remat import AUTO
from olmax.data.loader import DataStateError, work_dir_of
from olmax.data.order import cached_permutation
from olmax.data.prompts import PromptSet
from olmax.errors import refuse
from olmax.model.sharding import gather, place
from olmax.rewards import code, code_tests
from olmax.rewards import verifiers as rewards
from olmax.rollout import groups
from olmax.rollout import slots as engine_programs
from olmax.rollout.compile_decode import choose_sample_prompts
from olmax.rollout.pack import pack_rollouts
from olmax.rollout.pages import pools
from olmax.rollout.scoring import Scorer
from olmax.rollout.stream import EngineStream, Group, StaticStream, engine_mesh, sampling_figures, zero_spread
from olmax.rollout.text import stop_table
from olmax.step.state import per_device_bytes

log = logging.getLogger(__name__)

STATE_VERSION = 2  # 1 kept no batches: a resume between mini-batches sampled a new rollout
EMPTY_RETRIES = 8


class _Rollout(NamedTuple):
    """One produced rollout: its grpo.mini_batches step batches and its figures (logged with its steps)."""

    parts: list[dict]
    figures: dict


class RolloutProducer:
    def __init__(
        self,
        cfg: ExperimentConfig,
        mesh,
        prompts: PromptSet,
        tok,
        *,
        reference=None,
        state=None,
        allow_mismatch=False,
        record_dir=None,
    ):
        """`reference`: the reference policy's parameters (the run's starting ones), with grpo.beta > 0.
        `record_dir`: where grpo.sample_prompts=auto keeps its choice (the run directory)."""
        from olmax.rollout.policy_logps import make_policy_logps
        from olmax.step.train_step import batch_sharding

        primary = jax.process_index() == 0
        cfg = choose_sample_prompts(
            cfg, mesh, record_dir, log=lambda line: print(line, flush=True) if primary else None
        )
        self.cfg, self.rl, self.mesh, self.prompts, self.tok = cfg, cfg.grpo, mesh, prompts, tok
        _check_loop(cfg, len(prompts.prompts))
        for name in sorted(prompts.verifiers()):
            rewards.verifier(name)  # an unknown name exits 2 before any sampling, listing the known ones
        # code rewards without their sandbox exit 2 here too, naming rewards.code.isolation
        self.verifier_options = code.run_options(cfg.rewards.code.isolation, prompts.verifiers())
        if self.verifier_options and primary:
            print(code.describe(self.verifier_options[code.NAME]["isolation"]), flush=True)
            print(code_test_forms(prompts), flush=True)
        eos_ids = (tok.info.eos_token_id, tok.encode("<|im_end|>")[0])
        stops = stop_table(tok, self.rl.stop) if self.rl.stop else None
        scorer = Scorer(tok, eos_ids, self.rl.stop, self.rl.reward_scale, self.verifier_options)
        if self.rl.rollout_engine == "static":
            self.stream = StaticStream(cfg, mesh, prompts, scorer, self._take, eos_ids, stops)
        else:
            self.stream = EngineStream(cfg, mesh, prompts, scorer, self._take, eos_ids, stops, engine_slots(cfg, mesh))
        key = [[p.ids, p.verifiers, p.ground_truths] for p in prompts.prompts]
        self.fingerprint = hashlib.sha256(json.dumps([prompts.template, key]).encode()).hexdigest()
        self.batches_per_epoch = max(1, len(prompts.prompts) // self.rl.prompts_per_step) * self.rl.mini_batches
        self.epoch, self.cursor, self.calls, self.produced, self.excluded = 1, 0, 0, 0, []
        self.started = 0  # rollouts whose first step has begun: the version of the current parameters
        self.decoded: Counter = Counter()  # useful tokens and slot steps of the run so far
        self.epoch_excluded: list[int] = []  # the exclusions this epoch's order was drawn without
        # rollouts produced (or being produced) and not yet wholly served, oldest first; the first is
        # being served, `_served` of its parts already
        self._queue: deque[Future] = deque()
        self._served = 0
        if state is not None:
            self._restore(state, allow_mismatch)
        self._epoch_order()
        self.params = None
        self._sharding = batch_sharding(cfg, mesh)
        if (reference is None) != (self.rl.beta == 0):
            raise ValueError("the RL loop takes the reference policy's parameters exactly when grpo.beta > 0")
        self.reference = reference
        self._logps = make_policy_logps(cfg, mesh) if self.rl.mini_batches > 1 or reference is not None else None
        self._metrics: dict = {}
        # async: one worker produces rollouts in order while the trainer steps (module doc)
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="rollouts") if self.rl.async_steps else None

    # ------------------------------------------------------------------------------------------
    # order and state

    def _epoch_order(self) -> None:
        ids = np.arange(len(self.prompts.prompts))
        excluded = np.asarray(self.epoch_excluded, np.int64)
        kept, usable = groups.next_epoch_prompts(ids, excluded, self.rl.prompts_per_step)
        if usable == 0:  # fewer prompts left than one rollout takes: all of them come back
            kept, usable = ids, len(ids) - len(ids) % self.rl.prompts_per_step
        perm = cached_permutation(work_dir_of(self.cfg.data) / "orders", len(kept), self.cfg.data.seed, self.epoch)
        self.order = kept[np.asarray(perm)][: max(usable, self.rl.prompts_per_step)]

    def _take(self) -> tuple[int, np.ndarray]:
        """The next call of prompts: (its number, which keys its draws; grpo.prompts_per_step prompt ids)."""
        if self.cursor + self.rl.prompts_per_step > len(self.order):
            # exclusions made during an epoch take effect at the next (open-instruct's ShufflingIterator)
            self.epoch, self.cursor, self.epoch_excluded = self.epoch + 1, 0, list(self.excluded)
            self._epoch_order()
        ids = self.order[self.cursor : self.cursor + self.rl.prompts_per_step]
        self.cursor += self.rl.prompts_per_step
        self.calls += 1
        return self.calls - 1, ids

    def state(self) -> dict:
        """JSON, but for "arrays": the queued rollouts' batches, which the checkpoint keeps as their own
        item. Waits for the rollout in production: the order state is the one after the queued rollouts."""
        queued = [f.result() for f in self._queue]
        state = {
            "version": STATE_VERSION,
            "kind": "rollouts",
            "fingerprint": self.fingerprint,
            "epoch": self.epoch,
            "cursor": self.cursor,
            "calls": self.calls,
            "excluded": [int(i) for i in self.excluded],
            "epoch_excluded": [int(i) for i in self.epoch_excluded],
            "served": self._served,
            "queued": [r.figures for r in queued],
            "produced": self.produced,
            "started": self.started,
            "decoded": {k: self.decoded[k] for k in ("useful_tokens", "slot_steps")},
        }
        arrays = {f"rollout_{i}": {f"part_{k}": part for k, part in enumerate(r.parts)} for i, r in enumerate(queued)}
        if isinstance(self.stream, EngineStream):  # rows in flight: its open groups and unfinished rows
            state["stream"], rows = self.stream.state()
            # Orbax keeps no zero-size array: the empty ones are left out (EngineStream.restore fills them)
            rows = {name: {k: v for k, v in part.items() if v.size} for name, part in rows.items()}
            if any(rows.values()):
                arrays["stream"] = rows
        if arrays:
            state["arrays"] = arrays
        return state

    def _restore(self, state: dict, allow_mismatch: bool) -> None:
        if state.get("version") not in (1, STATE_VERSION) or state.get("kind") != "rollouts":
            raise DataStateError(f"the checkpoint's data state is not a rollout loader's: {state}")
        if state["fingerprint"] != self.fingerprint and not allow_mismatch:
            raise DataStateError(
                f"the RL prompts differ from the checkpoint's (fingerprint {state['fingerprint'][:12]} -> "
                f"{self.fingerprint[:12]}); pass --allow-data-change to continue anyway"
            )
        self.epoch, self.cursor, self.calls = state["epoch"], state["cursor"], state["calls"]
        self.excluded, self.epoch_excluded = list(state["excluded"]), list(state["epoch_excluded"])
        arrays = state.get("arrays") or {}
        for i, figures in enumerate(state.get("queued", [])):
            saved = arrays[f"rollout_{i}"]
            parts = [{k: np.asarray(v) for k, v in saved[f"part_{k}"].items()} for k in range(len(saved))]
            self._queue.append(_done(_Rollout(parts, figures)))
        self._served = state["served"] if self._queue else 0
        if state["served"] and not self._queue:  # version 1 kept no batches
            log.warning("resumed between the mini-batches of a rollout: its remaining ones come from a new rollout")
        self.produced = state.get("produced", 0)
        # a checkpoint of before `started` was kept: the queued rollouts were not begun but the one served from
        self.started = state.get("started", self.produced - len(self._queue) + int(self._served > 0))
        self.decoded = Counter(state.get("decoded", {}))
        if "stream" in state:
            if not isinstance(self.stream, EngineStream):
                raise DataStateError(
                    "the checkpoint holds rows of the continuous rollout engine in flight, but this run has "
                    "grpo.rollout_engine=static: resume with grpo.rollout_engine=continuous"
                )
            self.stream.restore(state["stream"], arrays.get("stream"))

    def audit(self) -> dict:
        return {"repeats_in_epoch": 0}  # a permutation per epoch

    def metrics(self) -> dict:
        return dict(self._metrics)

    def close(self) -> None:
        """Stop producing: a rollout in production is finished, none is started."""
        if self._worker is not None:
            self._worker.shutdown(cancel_futures=True)
        if isinstance(self.stream, EngineStream):
            self.stream.close()

    # ------------------------------------------------------------------------------------------
    # the rollout

    def __iter__(self) -> Iterator[dict]:
        while True:
            wait_s = self._start_rollout() if self._served == 0 else 0.0
            rollout = self._queue[0].result()
            self._metrics = {**rollout.figures, "rollout/wait_s": wait_s}
            parts = rollout.parts
            part = parts[self._served]
            self._served += 1
            if self._served == len(parts):
                self._queue.popleft()
                self._served = 0
            yield part

    def _start_rollout(self) -> float:
        """Before the first step on a rollout: have it and grpo.async_steps more produced or in
        production (those missing are sampled with the current parameters), wait for it, and add to
        every part the old log-probs under the current parameters (several mini-batches) and the
        reference policy's (grpo.beta > 0). Returns the seconds waited for it."""
        while len(self._queue) < 1 + self.rl.async_steps:
            # the current parameters are version `started`: the rollout about to begin trains from them
            if self._worker is None:
                self._queue.append(_done(self._rollout(self.params, self.started)))
            else:  # the next step donates the parameters: the worker samples from its own copy
                params = jax.tree.map(jnp.copy, self.params)
                self._queue.append(self._worker.submit(self._produce, params, self.started))
        t0 = time.perf_counter()
        rollout = self._queue[0].result()
        waited = time.perf_counter() - t0
        self.started += 1
        wanted = {"old_logps": self.params} if self.rl.mini_batches > 1 else {}
        wanted.update({"ref_logps": self.reference} if self.reference is not None else {})
        for batch in rollout.parts:  # before the first update; a resumed rollout has them already
            placed = {k: place(self._sharding, v) for k, v in batch.items() if k in ("input_ids", "doc_lens")}
            for key, params in wanted.items():
                if key not in batch:
                    batch[key] = gather(self._logps(params, placed))
        return waited

    def _produce(self, params, params_version: int) -> _Rollout:
        with jax.set_mesh(self.mesh):  # the worker thread's own mesh context, as the trainer's
            return self._rollout(params, params_version)

    def _read(self, params, version: int) -> tuple[list[Group], object, int]:
        """The groups one rollout reads from the stream and their selection (groups.select_groups over
        them in order): grpo.prompts_per_step groups, read again (up to EMPTY_RETRIES times) while none
        survives; with active sampling, groups until prompts_per_step survive. Returns (the groups of the
        read that counts, its selection, retries)."""
        rl, n, want = self.rl, self.rl.samples_per_prompt, self.rl.prompts_per_step
        read: list[Group] = []
        retries = 0
        while True:
            if rl.active_sampling:  # one group at a time: the stream decodes only what the batch needs
                while np.sum(~zero_spread(read, n)) < want and len(read) < (EMPTY_RETRIES + 1) * want:
                    read.append(self.stream.next_group(params, version))
            else:
                read += [self.stream.next_group(params, version) for _ in range(want)]
            sel = groups.select_groups(
                np.concatenate([g.rewards for g in read]),
                n,
                want,
                active=rl.active_sampling,
                filter_zero_spread=rl.filter_zero_spread,
                no_resampling_pass_rate=rl.no_resampling_pass_rate,
                max_score=rl.reward_scale,
            )
            if rl.active_sampling:  # the calls' worth of groups read beyond the first, as a static read counts them
                return read, sel, min(EMPTY_RETRIES, -(-len(read) // want) - 1 + int(not bool(sel.full)))
            if np.asarray(sel.keep).any() or retries == EMPTY_RETRIES:
                return read, sel, retries
            # one read of prompts_per_step groups, which the retry replaces; but its groups were read, and
            # the prompts it marked stay marked (open-instruct marks every group it reads,
            # accumulate_inference_batches)
            self._mark(sel, [g.prompt_id for g in read])
            # and the read is over for the stream: its groups no longer count against admission (the
            # engine's) and a call's prompts it did not reach go back to the order, as at a step's end
            self.cursor -= self.stream.end_step()
            read, retries = [], retries + 1

    def _rollout(self, params, params_version: int) -> _Rollout:
        """The next rollout, sampled with `params` of version `params_version` (rollouts begun before
        them); it trains from version `produced` (one more than params_version with async_steps=1)."""
        rl, n = self.rl, self.rl.samples_per_prompt
        version = self.produced
        jax.block_until_ready(params)  # the previous step's update, dispatched asynchronously, is not rollout time
        read, sel, retries = self._read(params, params_version)
        self.produced += 1
        # the stream's prompts no step read go back to the order (the cursor is within their epoch)
        self.cursor -= self.stream.end_step()
        self._mark(sel, [g.prompt_id for g in read])
        keep = np.asarray(sel.keep)
        consumed = int(sel.consumed)
        read = read[:consumed]
        rewards_ = np.concatenate([g.rewards for g in read])
        adv = np.asarray(groups.advantages(rewards_, n, normalise_std=rl.normalise_std))
        kept = [(g, s) for i, g in enumerate(read) if keep[i] for s in range(n)]
        packed = pack_rollouts(
            [self.prompts.prompts[g.prompt_id].ids for g, _ in kept],
            [g.responses[s] for g, s in kept],
            [g.logps[s] for g, s in kept],
            self.cfg.data.seq_len,
            self.cfg.data.pad_token_id,
        )
        kept_adv = adv[[i * n + s for i, g in enumerate(read) if keep[i] for s in range(n)]]
        token_adv = groups.token_values(kept_adv, packed.response_index)
        counts, self.stream.timing = self.stream.timing, Counter()
        decoded = Counter({k: counts[k] for k in ("useful_tokens", "slot_steps")})
        self.decoded.update(decoded)
        counts.update(retries=retries, empty=int(not keep.any()))
        parts = self._parts(packed, token_adv, counts)
        figures = {
            **self._figures(read, sel, counts, packed.rows),
            **sampling_figures(read, decoded, self.decoded, version),
        }
        return _Rollout(parts, figures)

    def _mark(self, sel, prompt_ids: list) -> None:
        """Exclude from the next epochs the prompts `sel` marked no-resample (solved often enough)."""
        self.excluded += [prompt_ids[g] for g in np.flatnonzero(np.asarray(sel.no_resample))]

    def _parts(self, packed, token_adv: np.ndarray, counts: Counter) -> list[dict]:
        """The packed rows as grpo.mini_batches step batches of trainer.global_batch rows each."""
        width, m = self.cfg.trainer.global_batch, self.rl.mini_batches
        per = -(-packed.rows // m)  # ceil: open-instruct splits a rank's rows into mini-batches alike
        out = []
        for k in range(m):
            rows = slice(k * per, min((k + 1) * per, packed.rows))
            n = max(0, min(rows.stop - rows.start, width))
            counts["rows_dropped"] += max(0, rows.stop - rows.start - width)

            def fill(x, pad, n=n, rows=rows):
                full = np.full((width, x.shape[1]), pad, x.dtype)
                full[:n] = x[rows][:n]
                return full

            batch = {
                "input_ids": fill(packed.input_ids, self.cfg.data.pad_token_id),
                "response_mask": fill(packed.response_mask, False),
                "advantages": fill(token_adv.astype(np.float32), 0.0),
                "sampler_logps": fill(packed.sampler_logps, 0.0),
            }
            if self.cfg.data.doc_masking:
                batch["doc_lens"] = fill(packed.doc_lens, 0)
                batch["doc_lens"][n:, 0] = self.cfg.data.seq_len  # an empty row is one padding segment
            out.append(batch)
        return out

    def _figures(self, read: list[Group], sel, counts: Counter, rows: int) -> dict:
        rl, n = self.rl, self.rl.samples_per_prompt
        rw = np.concatenate([g.rewards for g in read])
        lengths = np.asarray([len(r) for g in read for r in g.responses])
        figures_ = {
            "rollout/reward_mean": float(rw.mean()),
            "rollout/solve_rate": float(np.mean(rw >= rl.reward_scale)),
            "rollout/response_len_mean": float(lengths.mean()),
            "rollout/response_len_max": float(lengths.max()),
            "rollout/truncated_frac": sum(g.truncated for g in read) / max(1, len(lengths)),
            "rollout/zero_spread_frac": float(np.mean(zero_spread(read, n))),
            "rollout/groups_kept": float(np.sum(np.asarray(sel.keep))),
            "rollout/rows": float(rows),
            "rollout/rows_dropped": float(counts["rows_dropped"]),
            "rollout/retries": float(counts["retries"]),
            "rollout/empty_batch": float(counts["empty"]),
            "rollout/tokens_per_s": counts["useful_tokens"] / max(counts["sample_s"], 1e-9),
            "rollout/sample_s": counts["sample_s"],
            "rollout/verify_s": counts["verify_s"],
            "rollout/verified_here": float(counts["verified_here"]),  # this process's share of the samples
            "rollout/epoch": float(self.epoch),
        }
        by_name: dict = {}
        for name, score in (pair for g in read for pair in g.scores):
            by_name.setdefault(name, []).append(score)
        figures_.update({f"rollout/score/{name}": float(np.mean(v)) for name, v in by_name.items()})
        figures_.update({f"rollout/{k}": float(v) for k, v in counts.items() if k.startswith("verifier/")})
        return figures_


def code_test_forms(prompts: PromptSet) -> str:
    """One line: how the code rows' tests will be judged (olmax.rewards.code_tests: each runs as written in
    a process of its own; one that does not parse or names nothing a program could define is refused)."""
    counts: Counter = Counter()
    for p in prompts.prompts:
        for name, truth in zip(p.verifiers, p.ground_truths):
            if name.lower() == code.NAME:
                counts.update(code_tests.survey(code.parse_tests(truth)))
    return (
        f"code tests: {counts[code_tests.RUN]} run against the program from a process of their own, "
        f"{counts[code_tests.REFUSED]} refused at load (do not parse, or name nothing a program could define: "
        "always fail; docs/rewards-code.md)"
    )


def engine_slots(cfg: ExperimentConfig, mesh) -> int:
    """grpo.slots as given, or auto: the rows of grpo.sample_prompts' prompts (as choose_sample_prompts
    resolved it for these devices; 0: every prompt of a step), a multiple of the data x fsdp devices."""
    rl = cfg.grpo
    if rl.slots != AUTO:
        return rl.slots
    split = math.prod(mesh.shape[a] for a in BATCH_AXES)
    rows = (rl.sample_prompts or rl.prompts_per_step) * rl.samples_per_prompt
    return -(-rows // split) * split


def resident_engine(cfg: ExperimentConfig, mesh, record_dir=None) -> tuple[ExperimentConfig, int]:
    """What the continuous engine keeps on the devices while the trainer steps: (cfg with
    grpo.sample_prompts=auto chosen for these devices, as the loop will sample, olmax.rollout.
    compile_decode.choose_sample_prompts; the bytes per device of the engine's state, its KV cache for
    grpo.slots rows above all). (cfg, 0) without that engine. The fit of the train step counts the bytes
    (olmax.fit.remat.choose_for_devices)."""
    rl = cfg.grpo
    if cfg.trainer.objective != "grpo" or rl.rollout_engine != "continuous":
        return cfg, 0
    primary = jax.process_index() == 0
    cfg = choose_sample_prompts(cfg, mesh, record_dir, log=lambda line: print(line, flush=True) if primary else None)
    return cfg, engine_state_bytes(cfg, mesh)


def engine_state_bytes(cfg: ExperimentConfig, mesh) -> int:
    """Per device, the bytes of the continuous engine's state for cfg's grpo.slots (its KV cache above
    all: whole rings, or grpo.kv_gib's pages); grpo.sample_prompts still auto counts every prompt of a
    step, the most slots=auto may take. 0 without that engine."""
    rl = cfg.grpo
    if cfg.trainer.objective != "grpo" or rl.rollout_engine != "continuous":
        return 0
    if rl.sample_prompts == AUTO:
        cfg = dataclasses.replace(cfg, grpo=dataclasses.replace(rl, sample_prompts=0))
    slots, cache_len = engine_slots(cfg, mesh), rl.max_prompt_len + rl.max_response_len
    key_words = jax.random.key_data(jax.random.key(0)).shape[0]
    engine_mesh(cfg, mesh)  # pages only on one device
    pool = pools(cfg.model, slots, cache_len, rl.kv_gib)
    state = jax.eval_shape(lambda: engine_programs.init_state(cfg.model, slots, cache_len, key_words, pool))
    shardings = engine_programs.state_shardings(state, mesh)
    typed = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings)
    return per_device_bytes(typed)


def _done(rollout: _Rollout) -> Future:
    f: Future = Future()
    f.set_result(rollout)
    return f


def prompt_set(cfg: ExperimentConfig, tok) -> PromptSet:
    """The RL prompts of data.paths, rendered with grpo.template (olmax.data.prompts)."""
    from olmax.data.prompts import read_prompts

    return read_prompts(cfg.data.paths, cfg.grpo.template, cfg.grpo.max_prompt_len, tok.info.name)


def _check_loop(cfg: ExperimentConfig, n_prompts: int) -> None:
    """What the RL loop needs of the config beyond check_rollouts and GRPOConfig.check (which hold for any
    GRPO batch)."""
    data, rl = cfg.data, cfg.grpo
    needs = [
        # several samples share a packed row: each must see only itself, at the positions the sampler gave it
        (not data.doc_masking, "data.doc_masking=true", "samples packed into one row must not attend to each other"),
        (
            cfg.model.rope_positions != "document",
            "model.rope_positions=document",
            "each packed sample's positions must restart at 0, as the sampler's do",
        ),
        (
            jax.process_count() > 1 and rl.async_steps > 0,
            "grpo.async_steps=0 with several processes",
            "a worker thread's sampling and the trainer's steps could reach their collectives in another order "
            "on each process",
        ),
        (
            n_prompts < rl.prompts_per_step,
            f"at least grpo.prompts_per_step={rl.prompts_per_step} prompts",
            f"data.paths hold {n_prompts} trainable prompts",
        ),
    ]
    refuse(needs, "trainer.objective=grpo's rollouts need {knob}: {why}")
