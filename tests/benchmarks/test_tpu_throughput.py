"""benchmarks/tpu_throughput.py's measure of what a step takes on a chip (chip_holds), on a simulated
chip: a step that fails with the runtime's out-of-memory error when the live arrays beside it leave it
too little of a made-up HBM limit."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from chip_memory import chip_holds  # noqa: E402

MIB = 2**20


def _filler_bytes(block: int) -> int:
    """The bytes of chip_holds' filler blocks alive now (other tests' arrays in this process left out)."""
    return sum(a.nbytes for a in jax.live_arrays() if a.shape == (block // 4,) and a.dtype == jnp.int32)


@pytest.mark.parametrize("need_mib", [77.5, 78.0, 1.0])
def test_chip_holds_finds_what_the_step_needs_to_one_block(need_mib):
    limit, in_use, block = 256 * MIB, 16 * MIB, 1 * MIB
    tries = []

    def step():
        filler = _filler_bytes(block)
        tries.append(filler)
        if in_use + filler + need_mib * MIB > limit:
            raise RuntimeError("RESOURCE_EXHAUSTED: Error loading program: Attempting to reserve ...")

    measured = chip_holds(step, {"bytes_limit": limit, "bytes_in_use": in_use}, block) * 2**30 / MIB
    # the largest filler beside which the step runs leaves less than one block more than it needs
    assert need_mib <= measured < need_mib + 1
    assert tries[0] == 0 and len(tries) <= 10  # the empty chip first, then a bisection (log2 of 256 blocks)
    assert _filler_bytes(block) == 0  # the filler is freed


def test_chip_holds_passes_other_errors_and_an_empty_chip_that_cannot_run():
    def broken():
        raise ValueError("not a memory error")

    with pytest.raises(ValueError, match="not a memory error"):
        chip_holds(broken, {"bytes_limit": 64 * MIB, "bytes_in_use": 0}, MIB)

    def too_big():
        raise RuntimeError("RESOURCE_EXHAUSTED")

    with pytest.raises(RuntimeError, match="does not run on an empty chip"):
        chip_holds(too_big, {"bytes_limit": 64 * MIB, "bytes_in_use": 0}, MIB)
