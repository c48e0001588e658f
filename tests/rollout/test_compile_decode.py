"""compile-check --decode (olmax.rollout.compile_decode): the GRPO rollout sampler, prefill and decode loop,
compiled from abstract arrays at a recipe's rollout shapes for fake CPU devices or, with XLA's GPU
compiler, for an H100; a chunk of prompts over the chip's budget leads to the largest power-of-two
grpo.sample_prompts that fits, found by compiling."""

import dataclasses
import json

import jax
import pytest

import olmax.rollout.compile_decode
from olmax.config.io import apply_overrides
from olmax.config.recipes import get_recipe
from olmax.errors import ConfigError
from olmax.fit import chips
from olmax.fit.compiler import GIB, DoesNotFit, topology_devices
from olmax.model.olmo3 import count_params
from olmax.model.sharding import make_mesh
from olmax.rollout.compile_decode import (
    SEARCH_FILE,
    check_decode_fits,
    choose_sample_prompts,
    decode_report,
    format_decode_report,
    split_chunks,
)

# tiny_grpo's rollout shapes (prompts of 64 tokens, responses of 128: a cache of 256) on a two-layer
# model (a window-64 layer and a global one) with a small vocabulary: compiles in seconds.
SMALL = ["model.n_layers=2", "model.vocab_size=512", "model.compute_dtype=bfloat16", "grpo.prompts_per_step=4"]


def test_rollout_on_cpu_devices_reports_its_shapes_and_memory():
    cfg = apply_overrides(get_recipe("tiny_grpo"), SMALL)
    r = decode_report(cfg)  # the suite's 8 CPU devices, fsdp over all of them
    assert (r["mode"], r["platform"], r["devices"], r["mesh"]["fsdp"]) == ("decode", "cpu", 8, 8)
    assert (r["sample_prompts"], r["samples_per_prompt"], r["rows"]) == (4, 8, 32)
    assert (r["prompt_width"], r["cache_len"]) == (64, 256)
    # k and v of 32 rows, kv heads 2 x head_dim 32 in bfloat16: the global layer's 256 slots and the
    # window-64 layer's 64, the rows split over the 8 devices
    assert r["kv_cache_gib"] * GIB == 2 * 32 * (256 + 64) * 2 * 32 * 2 / 8
    assert r["per_device"]["peak_gib"] > 0 and r["compile_s"] > 0
    assert r["fits"] is None and r["search"] == [] and r["largest_fitting_sample_prompts"] is None
    check_decode_fits(r)  # no budget on CPU: nothing to refuse
    assert "32 rows per program" in format_decode_report(r)
    json.dumps(r)  # the --json payload


def test_a_decoding_step_on_a_tpu_writes_the_cache_without_a_loop_over_rows():
    """The rollout compiled for a v5e chip by libtpu on this host has its four loops only: the token
    loop, the prefill's and the decoding step's scans over layer groups and the draw's walk. A decoding
    step writes one cache slot shared by every row (olmax.rollout.cache's clock); when each row wrote its own slot, the
    TPU compiler expanded that scatter into a loop over the rows for each k and v of each layer (11
    loops in an 8-layer model, and the 1B's decode ran at 14.7% of the HBM bound, 59.5% without;
    docs/performance/decode.md)."""
    import re

    from olmax.config.mesh import MeshConfig
    from olmax.config.model import ModelConfig
    from olmax.fit import compiler
    from olmax.model.olmo3 import init_params, param_shardings
    from olmax.rollout.sampler import lower_rollout

    cfg = ModelConfig(
        vocab_size=1024,
        d_model=128,
        n_layers=4,  # two groups of two: the decoding step's layer scan stays a loop
        global_every=2,
        n_heads=4,
        n_kv_heads=2,
        head_dim=32,
        mlp_hidden=256,
        sliding_window=64,
        compute_dtype="bfloat16",
        param_dtype="bfloat16",
    )
    devices, chip, _ = compiler.target("v5e:1x1")
    mesh = make_mesh(MeshConfig(), devices)
    shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
    params = jax.tree.map(
        lambda s, d: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=d), shapes, param_shardings(cfg, mesh)
    )
    compiled = lower_rollout(params, cfg, 16, 1, 32, 32, mesh).compile(compiler.target_options(chip, "tpu"))
    # and the draw's walk down its tree (olmax.rollout.draw; a vocabulary of one block: one tree)
    assert len(re.findall(r" while\(", compiled.as_text())) == 3 + 1


def test_smaller_chunks_are_those_whose_rows_the_batch_axes_split():
    """Rows the batch axes do not divide are held whole by every device, so the search skips them."""
    cfg = get_recipe("tiny_grpo")  # 8 samples per prompt
    mesh = make_mesh(cfg.mesh, jax.devices())  # fsdp over the suite's 8 CPU devices
    assert split_chunks(cfg, mesh, 64) == [1, 2, 4, 8, 16, 32, 64]
    assert split_chunks(cfg, mesh, 48) == [1, 2, 4, 8, 16, 32]
    pairs = apply_overrides(cfg, ["grpo.samples_per_prompt=2"])
    assert split_chunks(pairs, mesh, 64) == [4, 8, 16, 32, 64] and split_chunks(pairs, mesh, 2) == []


def test_decode_needs_a_grpo_recipe():
    with pytest.raises(ConfigError, match="trainer.objective=lm, not grpo"):
        decode_report(get_recipe("tiny"))


# The compiler's peaks on one H100 (jax-cuda12-plugin 0.10.2) for 2 / 1 prompts x 8 samples of the
# model above: 7.70 / 6.95 MiB (8.26 / 7.19 before the exact draw and the decode attention's XLA path
# of 2026-12-07). A program budget of 7.3 MiB: the step's 2 prompts do not fit, 1 does.
BUDGET_MIB = 7.3


@pytest.mark.slow  # ~14 s on 2 cores: GPU compiles
def test_chunk_over_the_budget_names_the_sample_prompts_that_fits(monkeypatch, tmp_path):
    pytest.importorskip("jax_cuda12_plugin", reason="needs the gpu-compile extra (make setup-test)")
    cfg = apply_overrides(get_recipe("tiny_grpo"), [*SMALL, "grpo.prompts_per_step=2", "grpo.sample_prompts=2"])
    moments_mib = count_params(cfg.model) * 8 / 2**20  # two float32 Adam moments, beside the program
    limit = (BUDGET_MIB + moments_mib) / 1024 / chips.GPU_MEM_FRACTION
    monkeypatch.setitem(chips.CHIPS, "h100", dataclasses.replace(chips.CHIPS["h100"], hbm_limit_gib=limit))
    r = decode_report(cfg, topology="h100:1x1")
    assert r["opt_state_gib"] * 1024 == pytest.approx(moments_mib, rel=1e-3)  # and a few scalars
    assert r["budget_gib"] * 1024 == pytest.approx(BUDGET_MIB, abs=0.01)
    assert (r["platform"], r["chip"], r["sample_prompts"]) == ("gpu", "h100", 2)
    assert r["fits"] is False and r["per_device"]["peak_gib"] * 1024 > BUDGET_MIB
    assert [(c["sample_prompts"], c["fits"]) for c in r["search"]] == [(1, True)]  # the power of two below 2
    assert r["largest_fitting_sample_prompts"] == 1 and r["auto_sample_prompts"] is None  # 2 was given
    with pytest.raises(DoesNotFit, match="grpo.sample_prompts=1 fits"):
        check_decode_fits(r)
    assert "grpo.sample_prompts tried 1: " in format_decode_report(r)

    # auto: the same search on the same devices chooses 1 and keeps it; a restart compiles nothing
    auto = apply_overrides(cfg, ["grpo.sample_prompts=auto"])
    mesh = make_mesh(auto.mesh, topology_devices("h100:1x1"))
    logged: list[str] = []
    chosen = choose_sample_prompts(auto, mesh, str(tmp_path), log=logged.append, chip_flags=True)
    assert chosen.grpo.sample_prompts == 1 and "grpo.sample_prompts=auto on 1 x " in logged[-1], logged
    (record,) = json.loads((tmp_path / SEARCH_FILE).read_text()).values()
    assert [(c["sample_prompts"], c["fits"]) for c in record["candidates"]] == [(2, False), (1, True)]
    monkeypatch.setattr(olmax.rollout.compile_decode, "decode_report", lambda *a, **k: pytest.fail("searched again"))
    assert choose_sample_prompts(auto, mesh, str(tmp_path), chip_flags=True).grpo.sample_prompts == 1


def test_auto_takes_every_prompt_at_once_without_a_budget():
    """CPU devices have no HBM budget: auto samples a step's prompts in one program, nothing compiled;
    a number stays as given."""
    cfg = get_recipe("tiny_grpo")
    mesh = make_mesh(cfg.mesh, jax.devices())
    assert cfg.grpo.sample_prompts == "auto" and choose_sample_prompts(cfg, mesh).grpo.sample_prompts == 0
    three = apply_overrides(cfg, ["grpo.sample_prompts=3"])
    assert choose_sample_prompts(three, mesh) is three


@pytest.mark.parametrize(
    "name", ["olmo3_7b_think_rl", "olmo3_7b_instruct_rl", "olmo3_32b_think_rl", "olmo3_32b_instruct_rl"]
)
def test_rl_recipes_choose_what_fits_their_devices(name):
    """The RL recipes leave grpo.sample_prompts to auto: what fits differs between an H100 node (Think
    4, Instruct 8) and an Ironwood slice (all 64), docs/post-training/rl-recipes.md, "Recipes". A negative count
    or another word is refused."""
    assert get_recipe(name).grpo.sample_prompts == "auto"
    for bad in ("-1", "some"):
        with pytest.raises(ConfigError, match="grpo.sample_prompts must be auto or an integer >= 0"):
            apply_overrides(get_recipe(name), [f"grpo.sample_prompts={bad}"])


def test_cli_decode_exits_2_naming_the_chunk_that_fits(tmp_path, monkeypatch):
    """`olmax compile-check --decode`: the figures go to --json first, then exit 2 with the message."""
    from typer.testing import CliRunner

    from olmax.cli.common import app

    over = {
        "recipe": "olmo3_7b_think_rl",
        "topology": "h100:1x8",
        "sample_prompts": 64,
        "samples_per_prompt": 8,
        "rows": 512,
        "cache_len": 65536,
        "per_device": {"peak_gib": 1155.62},
        "refused": None,
        "hbm_limit_gib": 79.11,
        "hbm_headroom": 0.9,
        "opt_state_gib": 0.85,
        "budget_gib": 70.35,
        "chip": "h100",
        "fits": False,
        "largest_fitting_sample_prompts": 2,
        "auto_sample_prompts": None,  # the command gave grpo.sample_prompts=64
    }
    monkeypatch.setattr(olmax.rollout.compile_decode, "decode_report", lambda *a, **k: over)
    monkeypatch.setattr(olmax.rollout.compile_decode, "format_decode_report", lambda r: "report")
    out = tmp_path / "r.json"
    r = CliRunner().invoke(
        app,
        [
            "compile-check",
            "--recipe",
            "olmo3_7b_think_rl",
            "--decode",
            "--topology",
            "h100:1x8",
            "--json",
            str(out),
            "grpo.sample_prompts=64",
        ],
    )
    assert r.exit_code == 2 and "needs 1155.6 GiB per device" in r.output and "grpo.sample_prompts=2 fits" in r.output
    assert json.loads(out.read_text())["largest_fitting_sample_prompts"] == 2


def test_the_kv_cache_is_counted_as_a_tpu_holds_it():
    """A v5e holds each cache array's last two axes in whole tiles (128 lanes, 16 rows of bfloat16): a head's
    key and value side by side (olmax.rollout.cache) fill the lanes at head_dim 64, so the cache takes its
    bytes, where a head_dim of 32 (64 lanes a row) takes twice its bytes; on CPU devices, its bytes."""
    from olmax.config.mesh import MeshConfig
    from olmax.fit import compiler
    from olmax.rollout.compile_decode import kv_cache_gib

    devices, _, _ = compiler.target("v5e:1x1")
    mesh = make_mesh(MeshConfig(), devices)
    cpu = make_mesh(MeshConfig(), jax.devices()[:1])
    for head_dim, padding in ((64, 1), (32, 2)):
        cfg = apply_overrides(get_recipe("tiny_grpo"), [*SMALL, f"model.head_dim={head_dim}"])
        rows, heads = 8, cfg.model.n_kv_heads
        logical = rows * heads * (256 + 64) * 2 * head_dim * 2  # the global layer's 256 slots, the window's 64
        assert kv_cache_gib(cfg, cpu, rows, 256) * GIB == logical
        assert kv_cache_gib(cfg, mesh, rows, 256) * GIB == padding * logical
