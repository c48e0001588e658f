"""The recipes fit their clusters: compile-check compiles each 7B and 32B recipe's train step with
`model.remat=auto` (or the set auto chose) for its TPU slice through libtpu's topology description, and
the remat set it keeps and the peak are those of the sweep (docs/performance/remat.md). Slow: each is a
whole TPU compile of a large model on 2 cores."""

import pytest
from remat_sets import EVERY_MATMUL, SEEDS_BUT_GATE, SEEDS_SET

from olmax.config.io import apply_overrides
from olmax.config.recipes import get_recipe
from olmax.fit.compile_check import compile_report


def kept_at_least(r: dict, tags: list[str]) -> bool:
    """auto chose a set of the ladder that keeps every one of `tags` (those sets are nested)."""
    return set(tags) <= set(r["saved"]) and r["remat_search"]


# The recipes with model.remat=auto on their slices: each searches, compiles and fits. Where the
# sweep (docs/performance/remat.md) measured the ladder's sets on the slice, the choice follows from it:
# the first set that fits in an order, the compiler's order first.
@pytest.mark.slow
def test_7b_stage1_fits_on_ironwood_4x4x4():
    """The seeds' layout (4 instances per device in one forward/backward): every matmul output is
    refused in both orders, the seeds' set fits in the compiler's order (peak 84.65 GiB)."""
    r = compile_report(get_recipe("olmo3_7b_stage1"), topology="tpu7x:4x4x4")
    assert (r["devices"], r["per_device_batch"], r["micro_batch"], r["accum_steps"]) == (128, 4, 4, 1)
    assert r["saved"] == SEEDS_SET and not r["remat_serial"]
    assert r["attention"] == "splash" and r["attention_kernel_calls"] > 0 and r["fits"]


@pytest.mark.slow
def test_7b_stage1_on_v5p_4x4x4_fits_with_no_override():
    """The stage-1 recipe on 64 v5p chips: 8 instances per device as 2 micro-batches of 4. The seeds'
    set is refused in the compiler's order (98.4 GiB of temporaries) and fits in the serial one (peak
    88.01 GiB); every matmul output is refused in both."""
    r = compile_report(get_recipe("olmo3_7b_stage1"), topology="v5p:4x4x4")
    assert (r["devices"], r["per_device_batch"], r["micro_batch"], r["accum_steps"]) == (64, 8, 4, 2)
    assert r["remat_serial"] and r["saved"] == SEEDS_SET and r["fits"]
    refused = {(c["remat"], c["serial"]) for c in r["remat_search"] if c["peak_gib"] is None}
    assert {(",".join(SEEDS_SET), False), (",".join(SEEDS_SET + ["mlp_up"]), True)} <= refused


@pytest.mark.slow
def test_7b_stage3_fits_on_ironwood_4x4x4_over_a_context_axis():
    """AI2's stage 3 (packed, masked within documents, 64 instances of 65,536 tokens) on 128 devices:
    one instance per data x fsdp shard, each sequence split over the recipe's context axis of 2, so
    32,768 tokens per device as in stage 1, where the seeds' set fits in the compiler's order (peak
    85.60 GiB; every matmul output is refused); the masked splash kernels are in the step."""
    r = compile_report(get_recipe("olmo3_7b_stage3"), topology="tpu7x:4x4x4")
    assert r["mesh"] == {"data": 1, "fsdp": 64, "context": 2, "tensor": 1}
    assert (r["per_device_batch"], r["micro_batch"], r["seq_len"]) == (1, 1, 65536)
    assert r["saved"] == SEEDS_SET and not r["remat_serial"]
    assert r["attention"] == "splash" and r["attention_kernel_calls"] > 0 and r["fits"]


@pytest.mark.slow
def test_7b_think_sft_and_dpo_fit_on_ironwood_4x4x4():
    """The post-training steps on 128 Ironwood chips: SFT's 32 instances of 32,768 tokens, one per
    context group of 4, keep every matmul output (peak 35.33 GiB) with splash's segmented kernels
    (documents masked); DPO's 128 pairs of 16,384, one per device, keep the seeds' set (peak 84.67 GiB;
    every matmul output is refused in both orders) with the unsegmented kernels."""
    r = compile_report(get_recipe("olmo3_7b_think_sft"), topology="tpu7x:4x4x4")
    assert r["mesh"] == {"data": 1, "fsdp": 32, "context": 4, "tensor": 1} and r["per_device_batch"] == 1
    assert r["saved"] == EVERY_MATMUL and not r["remat_serial"] and r["fits"]
    assert r["attention"] == "splash" and r["attention_kernel_calls"] > 0
    r = compile_report(get_recipe("olmo3_7b_think_dpo"), topology="tpu7x:4x4x4")
    assert r["mesh"]["fsdp"] == 128 and r["per_device_batch"] == 1
    assert r["saved"] == SEEDS_SET and not r["remat_serial"] and r["fits"]
    assert r["attention"] == "splash" and r["attention_kernel_calls"] > 0


@pytest.mark.slow
@pytest.mark.parametrize(
    "recipe, per_device, saved",
    [
        # AI2's 1024 instances of 8192 tokens on the 512-chip slice: two per device in one
        # forward/backward (the recipe's micro-batch of up to 4); the seeds' set is refused in either
        # order, without mlp_gate it fits in the compiler's order (peak 74.41 GiB); the epoch horizon
        # compiles without data
        ("olmo3_32b_stage1", 2, SEEDS_BUT_GATE),
        # either midtraining ingredient: 512 instances of 8192 tokens, one per device, every matmul
        # output kept in the compiler's order (peak 90.65 GiB of the 90.95 budget, 2026-12-02)
        ("olmo3_32b_stage2", 1, EVERY_MATMUL),
    ],
    ids=["stage1", "stage2"],
)
def test_32b_pretraining_fits_on_v5p_8x8x8(recipe, per_device, saved):
    """Stages 1 and 2 of the 32B on the 512-chip slice: fsdp over every device, the remat set the sweep
    measured (the cases' comments), splash attention, and the step fits."""
    r = compile_report(get_recipe(recipe), topology="v5p:8x8x8")
    assert r["mesh"] == {"data": 1, "fsdp": 512, "context": 1, "tensor": 1}
    shape = (r["per_device_batch"], r["micro_batch"], r["accum_steps"], r["seq_len"])
    assert shape == (per_device, per_device, 1, 8192)
    assert r["saved"] == saved and not r["remat_serial"]
    assert r["attention"] == "splash" and r["attention_kernel_calls"] > 0 and r["fits"]


@pytest.mark.slow
def test_32b_stage3_fits_on_v5p_8x8x8_over_a_context_axis():
    """128 instances of 65,536 tokens on 512 devices: one instance per fsdp shard, split over the
    recipe's context axis of 4 (16,384 tokens per device), at least the seeds' set but mlp_gate kept
    (79.5 GiB of heap in the compiler's order, 65.0 serial), doc_lens in every splash call."""
    r = compile_report(get_recipe("olmo3_32b_stage3"), topology="v5p:8x8x8")
    assert r["mesh"] == {"data": 1, "fsdp": 128, "context": 4, "tensor": 1}
    assert kept_at_least(r, SEEDS_BUT_GATE)
    assert (r["per_device_batch"], r["micro_batch"], r["seq_len"]) == (1, 1, 65536)
    assert r["attention"] == "splash" and r["attention_kernel_calls"] > 0 and r["fits"]


@pytest.mark.slow
def test_32b_think_dpo_fits_on_ironwood_4x4x4():
    """The 32B Think DPO step, 128 pairs of 8,192 tokens, one per chip, keeps the seeds' set but mlp_gate
    in the compiler's order, as `auto` chose (peak 79.41 GiB; docs/post-training/dpo.md, "DPO in `olmax
    train`", "Recipes")."""
    remat = "model.remat=" + ",".join(SEEDS_BUT_GATE)
    r = compile_report(apply_overrides(get_recipe("olmo3_32b_think_dpo"), [remat]), topology="tpu7x:4x4x4")
    assert r["mesh"]["fsdp"] == 128 and r["per_device_batch"] == 1
    assert r["saved"] == SEEDS_BUT_GATE and not r["remat_serial"] and r["fits"]
    assert r["attention"] == "splash" and r["attention_kernel_calls"] > 0


@pytest.mark.slow
def test_32b_rl_fits_on_ironwood_4x4x4():
    """The 32B RL steps, 512 packed rows, 4 per chip in 4 micro-batches with splash's segmented kernels,
    with the remat `auto` chose (docs/post-training/rl-recipes.md, "GRPO in the train step", "Recipes"): Instruct's
    rows of 19,456 keep the seeds' set but mlp_gate (peak 84.27 GiB), Think's of 35,840 keep q/k/v
    (peak 83.11 GiB), both in the compiler's order."""
    for name, saved in (("olmo3_32b_instruct_rl", SEEDS_BUT_GATE), ("olmo3_32b_think_rl", SEEDS_SET[:3])):
        remat = "model.remat=" + ",".join(saved)
        r = compile_report(apply_overrides(get_recipe(name), [remat]), topology="tpu7x:4x4x4")
        assert r["mesh"]["fsdp"] == 128 and (r["per_device_batch"], r["micro_batch"]) == (4, 1)
        assert r["saved"] == saved and not r["remat_serial"] and r["fits"]
        assert r["attention"] == "splash" and r["attention_kernel_calls"] > 0
