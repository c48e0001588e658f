"""A continuous-batching rollout engine: a fixed number of slots decode together, rows that stop leave
their slot and waiting rows take it, so a batch no longer costs its longest row (the static sampler,
olmax.rollout.sampler, decodes until every row of a batch has stopped).

    engine = SlotEngine(model_cfg, mesh, slots=64, cache_len=4096, sampling=Sampling(temperature=1.0, seed=s),
                        eos_ids=eos, stop_text=table)
    engine.compile_ahead(params)                    # optional: every program compiled at once, in parallel
    engine.add(prompt_ids, n=8, first_index=8 * i, limits=max_response_len)   # one group: 8 rows
    while engine.pending() or engine.active():
        chunk = engine.run_chunk(params, version)   # params may change between chunks
        for row in chunk.finished: ...              # tokens, log-probs, each token's policy version
    engine.totals.slot_efficiency                   # useful tokens / slot steps decoded

The scheme is JetStream's prefill / insert / generate over a fixed set of decode slots and vLLM's
continuous batching, on olmax's ring KV cache with its shared clock (olmax.rollout.slots has the
device side and why the visibility mask stays exact). A call of `run_chunk`:

1. insert: the waiting rows take the free slots, oldest first; the rows of one group (one `add`)
   inserted together share ONE prefill of their prompt, as the static sampler repeats a prompt's cache
   rows to its n samples (a group split by too few free slots is prefilled once per part);
2. decode: one jitted `jax.lax.while_loop` runs up to `chunk_steps` steps, or until `refill_at` slots
   are free while rows wait, or until no row is left: the host is involved once per chunk, not per token.
   Once no row waits (the drain at the end of a batch) the rows left move to the first slots and only
   those are decoded (`narrow`: a half-, then a quarter-width program), so a drain's step costs less;
3. collect: the chunk's tokens come back as (width, chunk_steps) arrays (a row's tokens of a chunk are
   contiguous: rows enter only between chunks); the rows that stopped are returned and their slots freed.

Same tokens as the static sampler. Request row i's t-th new token is drawn with
fold_in(fold_in(key(seed), t), i), t the ROW's own count of new tokens (not the clock), i its index in
the whole request (`first_index` + its sample number), so for the same seed, index and settings the
engine gives the static sampler's tokens whatever the slots, the order of insertion or the other rows
(tests/rollout/test_rollout_engine.py), and its log-probs (log_softmax(logits / T) over the real
vocabulary) within float32 rounding. The stops are the sampler's: a per-row limit, EOS ids (kept),
stop strings on the text (olmax.rollout.text.stop_table, one automaton state per row).

Policy versions (in-flight weight updates, as AI2's OlmoRL and PipelineRL run them): `run_chunk` takes
the parameters and their version; each token is tagged with the version of the parameters whose
logits it was drawn from, which is what its log-prob is under. A row that spans an update keeps the
keys and values of its earlier tokens, computed by the older parameters (they are not recomputed),
and the first token of a chunk is drawn from logits the previous chunk computed.

Preemption: `snapshot()` gives the unfinished rows (waiting or in a slot) as host numpy arrays, their
prompts, tokens so far with log-probs and versions, limits, keys and stop-automaton states;
`restore(snapshot)` (on a new engine) queues them first, and each is prefilled again as its prompt +
its tokens so far and continues at its own t, so the tokens are those of an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Optional, Sequence

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from olmax.config.mesh import BATCH_AXES
from olmax.config.model import ModelConfig
from olmax.errors import ConfigError
from olmax.model.sharding import gather, place
from olmax.rollout.engine_compile import compile_all, ladder
from olmax.rollout.engine_types import Chunk, Counters, EngineConfig, Finished
from olmax.rollout.pages import Pages, pools
from olmax.rollout.sampler import FINISH, Sampling, _eos_table, _text_table
from olmax.rollout.slots import MOVES, programs


@dataclass
class _Row:
    """A row on the host: what it needs to be (re)inserted and what it has made so far."""

    group: int
    index: int
    prompt: np.ndarray
    limit: int
    key: np.ndarray  # the key data of its seed
    text: int = 0  # the stop automaton's state after `tokens` (read from the slot by `snapshot`)
    tokens: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    versions: list = field(default_factory=list)
    logits_version: int = 0  # the version of the logits its next token is drawn from, while in a slot
    first: int = 0  # its first token's time on the shared clock, while in a slot


def fits(compiled, device) -> bool:
    """Whether a compiled program's temporaries fit in the memory `device` has free now (always on a
    device that reports none: the CPU)."""
    stats = device.memory_stats()
    if not stats or "bytes_limit" not in stats:
        return True
    return compiled.memory_analysis().temp_size_in_bytes <= stats["bytes_limit"] - stats["bytes_in_use"]


class SlotEngine:
    """See the module doc. `mesh`: the trainer's mesh, on which `params` are laid out by
    olmax.model.olmo3.param_shardings (None: one device). `sampling`: temperature, top-k, top-p, and the
    seed of rows added without their own. `eos_ids`, `stop_text`: the static sampler's stops."""

    def __init__(
        self,
        cfg: ModelConfig,
        mesh=None,
        *,
        slots: int,
        cache_len: int,
        sampling: Sampling = Sampling(),
        chunk_steps: int = 32,
        narrow: int = 2,
        prefill_batch: int = 0,
        refill_at: int = 0,
        eos_ids: Sequence[int] = (),
        stop_text: Optional[np.ndarray] = None,
        kv_gib: float = 0.0,
        prompt_len: int = 0,
    ):
        self.config = EngineConfig(slots, cache_len, chunk_steps, narrow, prefill_batch, refill_at, kv_gib, prompt_len)
        split = 1 if mesh is None else math.prod(mesh.shape[a] for a in BATCH_AXES)
        if slots % split:
            raise ConfigError(
                f"engine slots={slots} must be a multiple of the mesh's batch axes {BATCH_AXES} ({split} "
                "devices), over which the slots are split"
            )
        self.cfg, self.mesh, self.sampling = cfg, mesh, sampling
        self._key_words = self._key_data(0).shape[0]
        halvings = 0 if split > 1 or jax.process_count() > 1 else narrow
        self._widths = tuple(slots >> k for k in range(halvings + 1) if slots % (1 << k) == 0)
        if kv_gib and mesh is not None:
            raise ConfigError("engine kv_gib (a paged KV cache) is for one device, not a mesh")
        pool = pools(cfg, slots, cache_len, kv_gib)
        self._pages = None if pool is None else Pages(dict(pool), slots)
        self._clock = 0  # the device state's clock, as the host follows it (paged: the blocks rows reach)
        self._programs = programs(cfg, slots, cache_len, chunk_steps, sampling.draw, self._key_words, mesh, pool)
        # prefill budget: sequences x bucketed width within an eighth of the cache's row-slots (the fresh
        # rings and activations beside the cache); paged, a sixteenth of the pool's positions (a 1B's 9 GiB
        # pool: one 4096-wide prefill of a preempted row, 1.6 GiB)
        self._budget = (
            slots * cache_len // 8
            if self._pages is None
            else min(slots * cache_len // 8, self._pages.positions() // 16)
        )
        self._most = prefill_batch or max(1, slots // 8)  # sequences a prefill program at most
        self._ladder = ladder(prompt_len or cache_len - 1, self._most, self._budget)
        # compiled programs by ("chunk", width) / ("prefill" or "insert", count, width) / ("compact",):
        # compile_ahead's, and the narrowed chunks (_chunk; None where one does not fit)
        self._compiled: dict = {}
        tables = (
            np.asarray([sampling.temperature or 1.0, sampling.top_k, sampling.top_p], np.float32),
            _eos_table(eos_ids),
            _text_table(stop_text, cfg.vocab_size),  # (16, vocab) with stop strings: placed once, not per chunk
        )
        self._tables = tuple(jax.device_put(t) if mesh is None else self._place(t) for t in tables)
        with self._on_mesh():
            self._state = self._programs.init()
        self._head: tuple = (None, None)  # (the parameters' output layer, cut to the real vocabulary)
        self._share: Optional[float] = None  # _weight_share
        self._waiting: deque[_Row] = deque()
        self._slots: list[Optional[_Row]] = [None] * slots
        self._groups = 0
        self.totals = Counters(slots)

    # ------------------------------------------------------------------------------------------
    # requests

    def add(
        self,
        prompt: Sequence[int],
        n: int = 1,
        *,
        first_index: int = 0,
        limits: int | Sequence[int],
        seed: Optional[int] = None,
    ) -> int:
        """Queue one group: `n` rows of `prompt`, request indices first_index .. first_index + n - 1
        (the static sampler's rows of prompt i are i*n .. i*n + n - 1), each with its own max new tokens
        (`limits`: one for all, or one per row), drawn with `seed` (default: the engine's
        sampling.seed). Returns the group's id (Finished.group)."""
        prompt = np.asarray(prompt, np.int32)
        if prompt.ndim != 1 or prompt.size == 0:
            raise ConfigError(f"a prompt is a non-empty list of token ids, got shape {prompt.shape}")
        if prompt.min() < 0 or prompt.max() >= self.cfg.vocab_size:
            raise ConfigError(f"prompt token ids must be in 0..{self.cfg.vocab_size - 1} (model.vocab_size)")
        if n < 1:
            raise ConfigError(f"n (rows of the group) must be at least 1, got {n}")
        limits = np.broadcast_to(np.asarray(limits, np.int64), (n,)) if np.ndim(limits) == 0 else np.asarray(limits)
        if limits.shape != (n,) or limits.min() < 1:
            raise ConfigError(f"limits needs one max new tokens >= 1 per row ({n}), got {limits}")
        if self.config.prompt_len and prompt.size > self.config.prompt_len:
            raise ConfigError(
                f"a prompt of {prompt.size} tokens is longer than the engine's prompt_len={self.config.prompt_len}"
            )
        if prompt.size + int(limits.max()) > self.config.cache_len:
            raise ConfigError(
                f"a prompt of {prompt.size} tokens + limits up to {int(limits.max())} new tokens is longer than "
                f"the engine's cache_len={self.config.cache_len}"
            )
        group, self._groups = self._groups, self._groups + 1
        key = self._key_data(self.sampling.seed if seed is None else seed)
        for k in range(n):
            self._waiting.append(_Row(group, first_index + k, prompt, int(limits[k]), key))
        return group

    def pending(self) -> int:
        """Rows waiting for a slot."""
        return len(self._waiting)

    def active(self) -> int:
        """Rows in a slot (decoding)."""
        return sum(r is not None for r in self._slots)

    # ------------------------------------------------------------------------------------------
    # decoding

    def run_chunk(self, params, version: int = 0) -> Chunk:
        """Insert waiting rows into the free slots, decode one chunk with `params` (of policy `version`),
        return the rows that stopped in it and what it cost (module doc). Nothing to do: an empty chunk."""
        t0 = time.perf_counter()
        params = self._params(params)
        preempted = self._grow()
        inserted, prefills = self._insert(params, version)
        moved = 0 if self._waiting else self._compact()
        t1 = time.perf_counter()
        if not self.active():
            return Chunk([], Counters(self.config.slots, insert_s=t1 - t0, preempted_rows=preempted))
        last = max(b for b, r in enumerate(self._slots) if r is not None)
        width = min(w for w in self._widths if w > last)
        with self._on_mesh():
            while (run := self._chunk(width, params)) is None:  # that narrowing does not fit: a wider one
                self._widths = tuple(w for w in self._widths if w > width)
                width = min(self._widths)
            free_target = self._place(np.int32(self._free_target(width)))
            self._state, out = run(params, self._state, *self._tables, free_target, self._page_tables())
        tokens, logprobs, count, active, finish = self._fetch(
            out.tokens, out.logprobs, self._state.count, self._state.active, self._state.finish
        )
        steps, busy = int(out.steps), int(out.busy)
        self._clock += steps
        t2 = time.perf_counter()
        finished, useful = [], 0
        for b, row in enumerate(self._slots):
            if row is None:
                continue
            k = int(count[b]) - len(row.tokens)
            useful += k
            row.tokens += tokens[b, :k].tolist()
            row.logprobs += logprobs[b, :k].tolist()
            row.versions += [row.logits_version] + [version] * (k - 1) if k else []
            row.logits_version = version if k else row.logits_version
            if not active[b]:
                finished.append(self._finished(row, FINISH[int(finish[b])]))
                self._slots[b] = None
                if self._pages is not None:
                    self._pages.release(b)
        counters = Counters(
            self.config.slots,
            steps,
            width * steps,
            busy,
            useful,
            inserted,
            prefills,
            moved,
            t1 - t0,
            t2 - t1,
            time.perf_counter() - t2,
            preempted,
            read_slot_steps=steps * (width + (self.config.slots - width) * self._weight_share(params)),
        )
        self.totals = self.totals + counters
        return Chunk(finished, counters)

    def run(self, params, version: int = 0) -> list[Finished]:
        """Chunks until no row waits or decodes; every row that stopped, in request-index order."""
        out: list[Finished] = []
        while self._waiting or self.active():
            out += self.run_chunk(params, version).finished
        return sorted(out, key=lambda r: r.index)

    def compile_ahead(self, params, workers: int = 0, shortest: int = 1) -> None:
        """Compile every program the engine runs before its first chunk, together: the decode chunk at
        each width (a narrowed one kept where it fits, as `_chunk` keeps it), compact (where rows move)
        and a prefill and an insert per bucket of the engine's ladder (olmax.rollout.engine_compile).
        Each is lowered in turn, then all compile in `workers` threads (0: one per program up to the
        host's cores; 1: one after another). `shortest`: the shortest prompt the engine will be given (the
        ladder's narrower widths are left out). Without it each compiles at its first use."""
        params, slots, lowered = self._params(params), self.config.slots, {}
        per_slot = [np.full(slots, -1, np.int32)] + [np.zeros(slots, np.int32)] * 5  # src, length, ... text
        rows = [*per_slot, np.zeros((slots, self._key_words), np.uint32)]  # key
        with self._on_mesh():
            for width in self._widths:
                lowered["chunk", width] = self._lower_chunk(width, params)
            if len(self._widths) > 1 or self._pages is not None:
                moves = np.zeros(MOVES, np.int32)
                args = map(self._place, (moves, moves, np.zeros(slots, bool)))
                lowered["compact",] = self._programs.compact.lower(self._state, *args)
            for count, width in (p for p in self._ladder.pairs if p[1] >= self._ladder.width(shortest)):
                prompts = map(self._place, (np.zeros((count, width), np.int32), np.ones(count, np.int32)))
                prefill = lowered["prefill", count, width] = self._programs.prefill.lower(params, *prompts)
                args = (*prefill.out_info, *map(self._place, (np.int32(width), *rows)), self._page_tables())
                lowered["insert", count, width] = self._programs.insert.lower(self._state, *args)
        lowered = {key: program for key, program in lowered.items() if key not in self._compiled}
        for key, program in compile_all(lowered, workers).items():
            self._keep(key, program)

    def _compact_program(self):
        return self._compiled.get(("compact",), self._programs.compact)

    def _lower_chunk(self, width: int, params):
        args = (params, self._state, *self._tables, self._place(np.int32(0)), self._page_tables())
        return self._programs.chunk(width).lower(*args)

    def _keep(self, key: tuple, compiled) -> None:
        """A compiled program for later calls; a narrowed decode program only where the memory it needs
        beside its arguments is free on the device now, else None (`_chunk`)."""
        if key[0] == "chunk" and key[1] < self.config.slots:
            device = list(self.mesh.devices.flat)[0] if self.mesh is not None else jax.devices()[0]
            compiled = compiled if fits(compiled, device) else None
        self._compiled[key] = compiled

    def _chunk(self, width: int, params):
        """The decode program of `width` slots: compiled ahead or, narrowed, at its first use; None where
        a narrowed one does not fit the device's free memory (`_keep`). The TPU compiler may lay a
        narrowed program's rings out otherwise than the cache's layout and copy them: for a 1B at 32
        slots of 2176 positions the width-8 program needed 4.4 GB of the chip's 4.1 GB left, where
        widths 32 and 16 and the 190m's 64 to 8 copy nothing."""
        key = ("chunk", width)
        if key not in self._compiled:
            if width == self.config.slots:
                return self._programs.chunk(width)
            self._keep(key, self._lower_chunk(width, params).compile())  # run_chunk's mesh
        return self._compiled[key]

    def _free_target(self, width: int) -> int:
        """The free slots at which a chunk decoding `width` slots ends: with rows waiting,
        EngineConfig.refill_at (or its automatic value, there), at most the waiting rows, or, where rows
        wait beside free slots (paged: their pages were short), as soon as one more row stops; in a
        drain, as soon as the next narrower width holds the rows left; else never (slots + 1)."""
        slots = self.config.slots
        if not self._waiting:
            narrower = [w for w in self._widths if w < width]
            return slots - max(narrower) if narrower else slots + 1
        idle = sum(r is None for r in self._slots)
        if idle:
            return idle + 1
        group = self._waiting[0].group
        auto = max(1, min(slots // 8, sum(1 for r in self._waiting if r.group == group)))
        return min(self.config.refill_at or auto, len(self._waiting))

    def _insert(self, params, version: int) -> tuple[int, int]:
        """The waiting rows into the free slots: (rows inserted, sequences prefilled). A group's fresh rows
        share one prefill; a row with tokens (restored) is its own sequence. At most
        EngineConfig.prefill_batch sequences per insert program; paged, only rows that find their pages
        (`_span`), oldest first."""
        free = [b for b, r in enumerate(self._slots) if r is None]
        rows: list[_Row] = []
        while self._waiting and len(rows) < len(free):
            row, b = self._waiting[0], free[len(rows)]
            row.first = self._clock - len(row.prompt) - len(row.tokens)
            if self._pages is not None and not self._pages.reserve(b, *self._span(row)):
                break
            rows.append(self._waiting.popleft())
        by_seq: dict = {}
        for row, b in zip(rows, free):
            by_seq.setdefault((row.group, -1) if not row.tokens else (row.group, row.index), []).append((row, b))
            row.logits_version = version
            self._slots[b] = row
        parts = list(by_seq.values())
        for program in self._insert_batches(parts):
            self._insert_program(params, program)
        return len(rows), len(parts)

    def _span(self, row: _Row) -> tuple[int, int]:
        """The times a row in a slot may hold by the end of the next chunk: from its first to the next
        chunk's last step, or its last token's."""
        last = row.first + len(row.prompt) + row.limit - 1
        return row.first, min(self._clock + self.config.chunk_steps - 1, last)

    def _grow(self) -> int:
        """Paged: pages for every row in a slot to decode the next chunk; while they do not fit, the rows
        that took their pages last give them back and wait at the front of the queue, to be prefilled
        again as prompt + tokens so far (olmax.rollout.pages). Returns the rows preempted."""
        if self._pages is None:
            return 0
        held = [b for b, r in enumerate(self._slots) if r is not None]
        victims: list[int] = []
        for b in held:
            while b not in victims and not self._pages.reserve(b, *self._span(self._slots[b])):
                victim = self._pages.newest([v for v in held if v not in victims])
                victims.append(victim)
                self._pages.release(victim)
        if victims:
            text = self._fetch(self._state.text)[0]
            rows = []
            for b in victims:
                rows.append(self._slots[b])
                rows[-1].text, self._slots[b] = int(text[b]), None
            self._waiting.extendleft(sorted(rows, key=lambda r: r.index, reverse=True))
            vacate = np.zeros(self.config.slots, bool)
            vacate[victims] = True
            none = np.zeros(MOVES, np.int32)  # no moves: slot 0 onto itself
            with self._on_mesh():
                self._state = self._compact_program()(self._state, *(self._place(a) for a in (none, none, vacate)))
        return len(victims)

    def _page_tables(self):
        """The page tables as the programs take them (copies: the host changes its own), None for rings."""
        if self._pages is None:
            return None
        return {s: jax.device_put(np.array(t)) for s, t in self._pages.tables.items()}

    def _insert_batches(self, parts: list) -> list[list]:
        """The parts split into insert programs, in order: at most EngineConfig.prefill_batch sequences
        each, and their count's bucket x the bucketed width within the prefill budget (`__init__`) but
        for a part alone: both buckets the ladder's (olmax.rollout.engine_compile), so that every
        program is one `compile_ahead` compiled."""
        programs: list[list] = []
        width = 0
        for part in parts:
            length = self._ladder.width(len(part[0][0].prompt) + len(part[0][0].tokens))
            wider = max(width, length)
            fit = self._ladder.count(len(programs[-1]) + 1) * wider <= self._budget if programs else False
            if programs and len(programs[-1]) < self._most and fit:
                programs[-1].append(part)
                width = wider
            else:
                programs.append([part])
                width = length
        return programs

    def _insert_program(self, params, parts: list) -> None:
        """One insert program: each part's sequence (its first row's prompt + tokens) prefilled once and
        copied into its rows' slots."""
        sequences = [np.concatenate([p[0][0].prompt, np.asarray(p[0][0].tokens, np.int32)]) for p in parts]
        width = self._ladder.width(max(len(s) for s in sequences))
        prompts = np.zeros((self._ladder.count(len(sequences)), width), np.int32)
        lengths = np.ones(len(prompts), np.int32)  # the bucket's padding prompts: one token, never copied
        for i, s in enumerate(sequences):  # left-padded (olmax.rollout.cache: the rows share one clock)
            prompts[i, width - len(s) :], lengths[i] = s, len(s)
        slots = self.config.slots
        src = np.full(slots, -1, np.int32)  # each slot's sequence (-1: the slot keeps its row)
        length, index, limit, count, text = (np.zeros(slots, np.int32) for _ in range(5))
        key = np.zeros((slots, self._key_words), np.uint32)
        for i, part in enumerate(parts):
            for row, b in part:
                src[b], length[b], index[b], limit[b], key[b] = i, lengths[i], row.index, row.limit, row.key
                count[b], text[b] = len(row.tokens), row.text
        args = (np.int32(width), src, length, index, limit, count, text, key)
        prefill, insert = (
            self._compiled.get((n, *prompts.shape), getattr(self._programs, n)) for n in ("prefill", "insert")
        )
        with self._on_mesh():
            logits, fresh = prefill(params, self._place(prompts), self._place(lengths))
            placed = (self._place(a) for a in args)
            self._state = insert(self._state, logits, fresh, *placed, self._page_tables())
        jax.block_until_ready(self._state.clock)  # the insert's time apart from the decoding's

    def _compact(self) -> int:
        """Move the rows in a slot past the narrowest decoding width that holds them all into free slots
        below it (EngineConfig.narrow). Returns the rows moved."""
        occupied = [b for b, r in enumerate(self._slots) if r is not None]
        width = min(w for w in self._widths if w >= len(occupied))
        movers = [b for b in occupied if b >= width]
        if not movers:
            return 0
        holes = [b for b in range(width) if self._slots[b] is None]
        pairs = list(zip(movers, holes))
        for a, b in pairs:
            self._slots[b], self._slots[a] = self._slots[a], None
            if self._pages is not None:
                self._pages.move(a, b)
        for at in range(0, len(pairs), MOVES):  # MOVES a program
            part = pairs[at : at + MOVES]
            src, dst = np.zeros(MOVES, np.int32), np.zeros(MOVES, np.int32)  # padding: slot 0 onto itself
            vacate = np.zeros(self.config.slots, bool)
            for r, (a, b) in enumerate(part):
                src[r], dst[r], vacate[a] = a, b, True
            args = (src, dst, vacate)
            with self._on_mesh():
                self._state = self._compact_program()(self._state, *(self._place(a) for a in args))
        jax.block_until_ready(self._state.clock)
        return len(movers)

    # ------------------------------------------------------------------------------------------
    # preemption

    def snapshot(self) -> dict[str, np.ndarray]:
        """The unfinished rows (in a slot first, then waiting) as host arrays; ragged fields are
        concatenated with their lengths beside them. `restore` takes it back."""
        text = self._fetch(self._state.text)[0]
        for b, row in enumerate(self._slots):
            if row is not None:
                row.text = int(text[b])
        rows = [r for r in self._slots if r is not None] + list(self._waiting)
        cat = lambda name, dtype: np.asarray([x for r in rows for x in getattr(r, name)], dtype)
        return {
            "group": np.asarray([r.group for r in rows], np.int64),
            "index": np.asarray([r.index for r in rows], np.int64),
            "limit": np.asarray([r.limit for r in rows], np.int64),
            "key": np.asarray([r.key for r in rows], np.uint32).reshape(len(rows), self._key_words),
            "text": np.asarray([r.text for r in rows], np.int64),
            "prompt_lens": np.asarray([len(r.prompt) for r in rows], np.int64),
            "prompts": cat("prompt", np.int32),
            "token_lens": np.asarray([len(r.tokens) for r in rows], np.int64),
            "tokens": cat("tokens", np.int32),
            "logprobs": cat("logprobs", np.float32),
            "versions": cat("versions", np.int32),
        }

    def reset(self) -> None:
        """Back to a new engine's state, its compiled programs kept: no row, an empty cache at clock 0.
        The old cache is released before the new one is made, so one is alive at a time where the cache
        is sized near the device's memory (olmax.rollout.stream restarts its engine so at a checkpoint)."""
        self._state = None
        with self._on_mesh():
            self._state = self._programs.init()
        if self._pages is not None:
            for b, row in enumerate(self._slots):
                if row is not None:
                    self._pages.release(b)
        self._waiting.clear()
        self._slots = [None] * self.config.slots
        self._clock, self._groups = 0, 0

    def restore(self, snapshot: dict[str, np.ndarray], next_group: int = 0) -> None:
        """Queue a snapshot's rows ahead of the waiting ones; each re-enters a slot prefilled with its
        prompt + its tokens so far and goes on at its own t (module doc). The rows keep their groups'
        ids; the next `add` gets at least `next_group` (and an id past every restored row's)."""
        cuts = lambda lens: np.cumsum(np.concatenate([[0], lens]))
        p, t = cuts(snapshot["prompt_lens"]), cuts(snapshot["token_lens"])
        rows = []
        for i in range(len(snapshot["index"])):
            row = _Row(
                int(snapshot["group"][i]),
                int(snapshot["index"][i]),
                np.asarray(snapshot["prompts"][p[i] : p[i + 1]], np.int32),
                int(snapshot["limit"][i]),
                np.asarray(snapshot["key"][i], np.uint32),
                int(snapshot["text"][i]),
                *(snapshot[k][t[i] : t[i + 1]].tolist() for k in ("tokens", "logprobs", "versions")),
            )
            if len(row.prompt) + row.limit > self.config.cache_len:
                raise ConfigError(
                    f"restored row {row.index} needs {len(row.prompt) + row.limit} positions, "
                    f"more than the engine's cache_len={self.config.cache_len}"
                )
            rows.append(row)
        self._waiting.extendleft(reversed(rows))
        self._groups = max([self._groups, next_group] + [r.group + 1 for r in rows])

    # ------------------------------------------------------------------------------------------
    # helpers

    def _finished(self, row: _Row, finish: str) -> Finished:
        return Finished(
            row.index,
            row.group,
            row.prompt,
            np.asarray(row.tokens, np.int32),
            np.asarray(row.logprobs, np.float32),
            np.asarray(row.versions, np.int32),
            finish,
        )

    def _weight_share(self, params: dict) -> float:
        """The weights' share of a full-width decoding step's bytes (weights + every slot's cache), as
        Counters.read_slot_steps counts a narrowed step; once per parameters' shapes."""
        if self._share is None:
            weights = sum(x.nbytes for x in jax.tree.leaves(params))
            self._share = weights / (weights + sum(x.nbytes for x in jax.tree.leaves(self._state.cache)))
        return self._share

    def _params(self, params: dict) -> dict:
        """The parameters as the programs take them: on one device the output layer's weight cut to the
        real vocabulary, once per parameters (sampler._loop cuts it once per rollout), so that no step
        computes the padding's logits; on a mesh, where that axis is split, as they are."""
        if self.mesh is not None:
            return params
        if self._head[0] is not params["lm_head"]:
            self._head = (params["lm_head"], params["lm_head"][:, : self.cfg.vocab_size])
        return {**params, "lm_head": self._head[1]}

    @staticmethod
    def _key_data(seed: int) -> np.ndarray:
        return np.asarray(jax.random.key_data(jax.random.key(seed)), np.uint32)

    def _on_mesh(self):
        return jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext()

    def _place(self, x):
        """A host array as the programs take it: replicated over the mesh (every process holds it whole)."""
        return x if self.mesh is None else place(NamedSharding(self.mesh, PartitionSpec()), np.asarray(x))

    def _fetch(self, *arrays) -> list[np.ndarray]:
        return [np.asarray(a) if self.mesh is None else gather(a) for a in arrays]
