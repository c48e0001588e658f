"""The slot engine's value types: its shape (EngineConfig, every program's static sizes), the rows it
returns (Finished) and what its decoding cost (Counters, per chunk and in total). olmax.rollout.engine
has the engine and what each figure means for a schedule."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from olmax.errors import ConfigError


@dataclass(frozen=True)
class EngineConfig:
    """The engine's shape: every program's static sizes."""

    slots: int
    """Rows decoded at once: the batch of every decoding step and of the KV cache. On a mesh, a
    multiple of the batch axes (data x fsdp), over which the slots are split as the sampler's rows."""
    cache_len: int
    """Positions per slot on every full-attention layer's ring (a window layer holds min(window,
    cache_len)): a row's prompt + its max new tokens must fit."""
    chunk_steps: int = 32
    """Most decoding steps per call of the decode program: the host sees the slots once per chunk."""
    narrow: int = 2
    """Halvings of the decoding width allowed while no row waits (the drain at the end of a batch):
    with at most slots / 2^k rows left they move to the first slots / 2^k slots, and only those are
    decoded, at a fraction of a full step's cost (a program per width). 0: every step decodes every
    slot. Off on a mesh that splits the slots (a prefix of the slots would sit on some devices only) and
    over several processes (each would judge by its own free memory whether a narrowed program fits)."""
    prefill_batch: int = 0
    """Most sequences prefilled by one insert program (0: slots // 8, at least 1); a group's rows
    share one. A program also prefills at most an eighth of the cache's row-slots (its sequences,
    padded to their bucket, x the bucketed prompt width): the fresh rings' memory beside the cache."""
    refill_at: int = 0
    """A chunk ends early once this many slots are free while rows wait (at most the waiting rows).
    Fewer means fewer idle slots and more chunks, inserts and prefills (a group split over two inserts
    is prefilled twice). 0: slots // 8, at least 1 and at most the oldest waiting group's rows (64 and
    128 slots take a group of 8 whole; 16 slots take rows two by two)."""
    kv_gib: float = 0.0
    """GiB of device memory for the KV cache, paged (olmax.rollout.pages): rows take pages of it as they
    grow and give them back when they stop, so more slots fit than whole rings would (a row that finds
    none left waits, preempted, to be prefilled again). 0: every slot holds its whole ring. One device
    only (not on a mesh)."""
    prompt_len: int = 0
    """The longest prompt `add` takes (0: cache_len - 1): the prefill programs' widths are bucketed
    for it (olmax.rollout.engine_compile.ladder), which `SlotEngine.compile_ahead` compiles. A
    restored row, prefilled as its prompt + tokens so far, may be wider: its program compiles then."""

    def __post_init__(self):
        knobs = (
            ("slots", 1),
            ("cache_len", 2),
            ("chunk_steps", 1),
            ("narrow", 0),
            ("prefill_batch", 0),
            ("refill_at", 0),
        )
        for name, least in knobs:
            if getattr(self, name) < least:
                raise ConfigError(f"engine {name} must be at least {least}, got {getattr(self, name)}")
        if self.refill_at > self.slots:
            raise ConfigError(f"engine refill_at={self.refill_at} exceeds slots={self.slots}")
        if not 0 <= self.prompt_len < self.cache_len:
            raise ConfigError(
                f"engine prompt_len must be in 0..cache_len - 1 ({self.cache_len - 1}), got {self.prompt_len}"
            )
        if self.kv_gib < 0:
            raise ConfigError(f"engine kv_gib must be at least 0, got {self.kv_gib}")


class Finished(NamedTuple):
    """One row that stopped."""

    index: int  # its position in the whole request (keys its draws)
    group: int  # the `add` call it came from
    prompt: np.ndarray  # int32 prompt tokens
    tokens: np.ndarray  # int32 new tokens, the stopping EOS / stop string's last token included
    logprobs: np.ndarray  # float32 log_softmax(logits / T)[token], as the static sampler's
    versions: np.ndarray  # int32 the policy version each token was drawn under (module doc)
    finish: str  # one of olmax.rollout.sampler.FINISH


@dataclass(frozen=True)
class Counters:
    """What decoding cost; totals add up over chunks (`+`)."""

    slots: int
    decode_steps: int = 0  # steps of the decode loop
    slot_steps: int = 0  # slots decoded, summed over the steps (slots x steps but in a narrowed drain)
    busy_slot_steps: int = 0  # slots holding a decoding row, summed over the steps
    useful_tokens: int = 0  # new tokens returned (or kept for unfinished rows)
    inserted_rows: int = 0
    prefills: int = 0  # sequences prefilled (a group's rows inserted together share one)
    moved_rows: int = 0  # rows moved to the first slots for a narrower decoding (EngineConfig.narrow)
    insert_s: float = 0.0  # the insert and move programs (prefill, copies of rows), host side included
    decode_s: float = 0.0  # the decode programs and reading their tokens back
    host_s: float = 0.0  # the rest: bookkeeping of finished rows
    preempted_rows: int = 0  # rows that gave their pages back to wait again (EngineConfig.kv_gib)
    # slot steps by what a step reads: a narrowed step of width w reads the weights whole and w slots'
    # keys and values, so it counts w + (slots - w) x the weights' share of a full step's bytes
    read_slot_steps: float = 0.0

    def __add__(self, other: "Counters") -> "Counters":
        sums = {f.name: getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)}
        return Counters(**{**sums, "slots": self.slots})

    @property
    def slot_efficiency(self) -> float:
        """Useful tokens / slot steps counted by what they read (read_slot_steps: slots x decode steps,
        a narrowed drain's step at its cost): the share of the decoding's reads that made a token (the
        static sampler's is its rows' mean length over its longest)."""
        return self.useful_tokens / max(1e-9, self.read_slot_steps)


class Chunk(NamedTuple):
    finished: list[Finished]
    counters: Counters
