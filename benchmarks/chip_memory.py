"""What a compiled step takes on a real chip, measured rather than predicted: `chip_holds`, a filler
bisection on the chip's HBM. benchmarks/tpu_throughput.py --chip-holds prints it beside compile-check's
prediction, and tests/test_tpu.py holds the prediction to it."""

from __future__ import annotations

from typing import Callable

GIB = 2**30
FILLER_BLOCK = 64 * 2**20  # chip_holds' unit: its resolution (0.4-0.6% of the 7B-layer and 190m steps)


def chip_holds(step: Callable[[], None], before: dict, block: int = FILLER_BLOCK) -> float:
    """The HBM a compiled step takes on the chip, in GiB: the chip's limit less the largest filler
    (int32 arrays of `block` bytes, their count found by bisection) beside which `step()` (a fresh
    state, then one step, blocked on) still runs, less what was in use `before` (memory_stats() taken
    before the step was compiled). It counts whatever the runtime holds for the step, whenever it
    takes it: the TPU runtime reserves the compiler's preallocated temporary block whole when it loads
    the program, which peak_bytes_in_use does not count (docs/performance/memory-and-fit.md, "compile-check's memory
    against the chip"). Resolution: `block`."""
    import jax
    import jax.numpy as jnp

    filler_block = jax.jit(lambda: jnp.zeros((block // 4,), jnp.int32))

    def runs(blocks: int) -> bool:
        filler = [filler_block() for _ in range(blocks)]
        jax.block_until_ready(filler)
        try:
            step()
            return True
        except Exception as e:  # out of HBM: loading the program (ValueError) or running it (JaxRuntimeError)
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise
            return False
        finally:
            del filler

    if not runs(0):
        raise RuntimeError("the step does not run on an empty chip")
    fits, fails = 0, before["bytes_limit"] // block
    while fails - fits > 1:
        mid = (fits + fails) // 2
        fits, fails = (mid, fails) if runs(mid) else (fits, mid)
    return (before["bytes_limit"] - fits * block - before["bytes_in_use"]) / GIB
