"""compile-check: the real train step lowers and compiles from abstract arrays, for fake CPU devices
or, through libtpu's topology description, for a TPU slice with the TPU compiler (no TPU needed)."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from remat_sets import SEEDS_SET

from olmax.config.io import apply_overrides
from olmax.config.mesh import MeshConfig
from olmax.config.recipes import get_recipe
from olmax.errors import ConfigError
from olmax.fit import chips
from olmax.fit import remat as remat_module
from olmax.fit.compile_check import check_fits, compile_report, format_report
from olmax.fit.compiler import GIB, DoesNotFit, topology_devices
from olmax.fit.flops import exact_step_flops
from olmax.fit.remat import choose_remat
from olmax.model.olmo3 import count_params
from olmax.model.sharding import make_mesh

# A model the TPU compiler handles in seconds: the tiny recipe with a windowed and a global layer, a small
# vocabulary and 128 tokens (splash's smallest tile).
SMALL_TPU = [
    "model.n_layers=2",
    "model.vocab_size=512",
    "trainer.loss_chunk=0",
    "data.seq_len=128",
    "trainer.global_batch=8",
    "model.compute_dtype=bfloat16",
]
# One (global) layer where the claim is not about the windowed and the global layer: each layer
# costs a TPU compile about a third of its time. splash runs the same code for both masks.
ONE_LAYER = [*SMALL_TPU, "model.n_layers=1"]


@pytest.fixture(scope="module")
def cpu_dpo_step():
    """One CPU compile for the memory report's test and the DPO step's FLOPs test: tiny's DPO step at two
    layers, FSDP over the 8 CPU devices, with an epoch horizon. The vocabulary stays tiny's 100k: its
    embedding and output layer make the norm weights, which every device holds whole, a rounding error
    of the parameters (at 512 tokens they were 1.4% of them)."""
    overrides = ["model.n_layers=2", "mesh.fsdp=8", "schedule.t_max_epochs=1"]
    cfg = apply_overrides(get_recipe("tiny_dpo"), overrides)
    return cfg, compile_report(cfg)


def test_a_cpu_compile_reports_fsdp_sharded_memory(cpu_dpo_step):
    # an epoch horizon compiles although no data is read (the schedule's t_max is all it sets)
    cfg, r = cpu_dpo_step
    assert r["devices"] == 8 and r["per_device_batch"] == 1 and r["platform"] == "cpu"  # a pair per device
    # FSDP over 8 devices: each holds 1/8 of the fp32 parameters and of both fp32 Adam moments
    assert r["params_gib"] * GIB == pytest.approx(count_params(cfg.model) * 4 / 8, rel=1e-3)
    assert r["opt_state_gib"] == pytest.approx(2 * r["params_gib"], rel=1e-3)
    assert r["per_device"]["temporaries_gib"] > 0
    assert r["attention"] == "xla" and r["attention_kernel_calls"] == 0  # auto on CPU
    assert r["hbm_limit_gib"] is None and r["fits"] is None  # no chip to compare with
    assert r["per_device"]["heap_gib"] is None and r["per_device"]["hbm_gib"] is None  # the TPU compiler's


def _check_memory_fields(r):
    d = r["per_device"]
    total = d["arguments_gib"] + d["outputs_gib"] + d["temporaries_gib"] + d["code_gib"] - d["aliased_gib"]
    assert d["total_gib"] == pytest.approx(total)
    # the state is donated: its outputs are written over its arguments, and the arguments hold at
    # least the parameters and both moments
    assert d["aliased_gib"] > 0 and d["arguments_gib"] >= r["params_gib"] + r["opt_state_gib"] - 1e-9


@pytest.mark.slow  # the default suite's 10 minutes (docs/testing.md)
def test_small_model_on_ironwood_uses_splash_and_the_chip_profile():
    cfg = apply_overrides(get_recipe("tiny"), SMALL_TPU + ["model.remat=attn_context,q_proj"])
    r = compile_report(cfg, topology="tpu7x:2x2x1")
    assert (r["platform"], r["devices"], r["device_kind"], r["chip"]) == ("tpu", 8, "TPU7x", "tpu7x")
    assert r["attention"] == "splash"  # auto, resolved for the topology, not for this CPU host
    # fwd, dq and dkv kernels for the windowed and the global layer
    assert r["attention_kernel_calls"] >= 6
    assert r["libtpu_flags"] == sorted(chips.CHIPS["tpu7x"].libtpu_flags)
    _check_memory_fields(r)
    assert r["saved"] == ["q_proj", "attn_context"] and r["offloaded"] == []  # in the block's order
    # the compiler's peak: temporaries reused across lifetimes, so below XLA's sum of the parts
    d = r["per_device"]
    assert 0 < d["peak_gib"] < d["total_gib"]
    # the TPU compiler's heap, read from its memory-usage report: the arguments and the temporaries
    # laid out, donated buffers shared; the chip holds it and the code
    assert d["arguments_gib"] < d["heap_gib"] < d["total_gib"] and d["hbm_gib"] == d["heap_gib"] + d["code_gib"]
    assert "the chip holds the TPU compiler's heap" in format_report(r)
    assert r["hbm_limit_gib"] == 94.74 and r["fits"] is True
    assert r["model_flops_per_device"] > 0 and r["hlo_flops_per_device"] > 0
    json.dumps(r)  # the --json payload


# Two layers at 2 x 512 tokens per device with a budget of 22.6 MiB (the chip table's HBM limit made
# 22.6 / 0.95 MiB): the compiler's peaks per set of remat.AUTO_LADDER, in its order / serial, were
# 23.48 / 23.15 (every matmul output), 22.76 / 22.40 (the seeds' set), 22.76 / 21.65, 22.25 / 21.14,
# 21.82 / 18.00 and 22.20 / 17.88 MiB (full), libtpu 0.0.42.1 with the chip's flag profile
AUTO_SMALL = [*SMALL_TPU, "data.seq_len=512", "model.max_position=512", "trainer.global_batch=16"]
AUTO_BUDGET_MIB = 22.6


@pytest.mark.slow  # seven TPU compiles (~100 s idle); test_remat_search.py proves the search with a scripted compiler
def test_auto_keeps_the_most_that_fits_and_its_record_is_reused(monkeypatch, tmp_path):
    """model.remat=auto on Ironwood with a small model whose richest set does not fit the budget in
    either order: the tally says the step clearly fits (the compiler's temporaries, which it does not
    count, are most of this tiny step), so every matmul output is compiled first and fits in neither
    order; bisection then compiles the middle set (fits), the set between (fits only serial) and the
    seeds' set (fits only serial), and chooses the seeds' set, serial, reported as compiled; a second
    search for the same step and devices reads the record instead of compiling."""
    tpu7x = dataclasses.replace(chips.CHIPS["tpu7x"], hbm_limit_gib=AUTO_BUDGET_MIB / 1024 / chips.HBM_HEADROOM)
    monkeypatch.setitem(chips.CHIPS, "tpu7x", tpu7x)
    cfg = apply_overrides(get_recipe("tiny"), AUTO_SMALL + ["model.remat=auto"])
    r = compile_report(cfg, topology="tpu7x:2x2x1", cache_dir=str(tmp_path))
    seeds = ",".join(SEEDS_SET)
    assert (r["remat"], r["remat_serial"], r["saved"]) == (seeds, True, SEEDS_SET) and r["fits"]
    tried = [(c["remat"], c["serial"], c["fits"]) for c in r["remat_search"]]
    assert tried == [
        (seeds + ",mlp_up", False, False),  # the most kept set first (remat_search.TOP_FIRST)
        (seeds + ",mlp_up", True, False),
        ("q_proj,k_proj,v_proj,attn_context,o_proj", False, True),
        ("q_proj,k_proj,v_proj,attn_context,o_proj,mlp_down", False, False),
        ("q_proj,k_proj,v_proj,attn_context,o_proj,mlp_down", True, True),
        (seeds, False, False),
        (seeds, True, True),
    ]
    assert all(c["peak_gib"] * 1024 > AUTO_BUDGET_MIB for c in r["remat_search"] if not c["fits"])
    assert r["per_device"]["peak_gib"] == r["remat_search"][-1]["peak_gib"]  # the chosen compile, reported
    assert r["remat_search_s"] >= sum(c["compile_s"] for c in r["remat_search"]) and r["remat_search_from"] is None

    def no_compile(*args):
        raise AssertionError("compiled although the search is recorded")

    monkeypatch.setattr(remat_module, "compile_step", no_compile)
    mesh = make_mesh(cfg.mesh, topology_devices("tpu7x:2x2x1"))
    again = choose_remat(cfg, mesh, tpu7x, "tpu7x:2x2x1", {}, str(tmp_path))
    assert (again.cfg.model.remat, again.cfg.model.remat_serial) == (seeds, True)
    assert again.source == str(tmp_path / "remat_search.json")


# The same model on v5p, whose compiles take about half Ironwood's (4 compiles, 20-40 s on 2 cores):
# the compiler's peaks were 16.75 MiB (q/k/v, attn_context, o_proj), 16.86 (the seeds' set) and 17.93
# (every matmul output, serial the same), libtpu 0.0.42.1, under the suite's flags.
V5P_BUDGET_MIB = 17.4


@pytest.mark.slow  # ~60 s in the suite; the default run compiles auto's choice on CPU devices (test_remat_search.py)
def test_auto_on_v5p_takes_the_seeds_set_with_four_real_compiles(monkeypatch, tmp_path):
    """The TPU compiler's proof of model.remat=auto on v5p (the Ironwood test above is the same claim):
    the middle set fits, so the seeds' set is tried and fits, and every matmul output is
    refused in both orders; the choice is the seeds' set in the compiler's order, and a second search
    for the same step and devices compiles nothing."""
    v5p = dataclasses.replace(chips.CHIPS["v5p"], hbm_limit_gib=V5P_BUDGET_MIB / 1024 / chips.HBM_HEADROOM)
    monkeypatch.setitem(chips.CHIPS, "v5p", v5p)
    cfg = apply_overrides(get_recipe("tiny"), AUTO_SMALL + ["model.remat=auto"])
    mesh = make_mesh(cfg.mesh, topology_devices("v5p:2x2x1"))
    first = choose_remat(cfg, mesh, v5p, "v5p:2x2x1", {}, str(tmp_path))
    seeds = ",".join(SEEDS_SET)
    assert (first.cfg.model.remat, first.cfg.model.remat_serial) == (seeds, False)
    tried = [(c["remat"], c["serial"], c["fits"]) for c in first.record["candidates"]]
    assert tried == [
        ("q_proj,k_proj,v_proj,attn_context,o_proj", False, True),
        (seeds, False, True),
        (seeds + ",mlp_up", False, False),
        (seeds + ",mlp_up", True, False),
    ]

    def no_compile(*args):
        raise AssertionError("compiled although the search is recorded")

    monkeypatch.setattr(remat_module, "compile_step", no_compile)
    again = choose_remat(cfg, mesh, v5p, "v5p:2x2x1", {}, str(tmp_path))
    assert (again.cfg.model.remat, again.cfg.model.remat_serial) == (seeds, False)
    assert again.source == str(tmp_path / "remat_search.json")


# context 2 (the kernel per chunk of queries) in the slow run: the tag is the same code either way
@pytest.mark.parametrize("context", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_keeping_attn_context_spares_the_splash_forward(context):
    """splash names its output and log-sum-exp `attn_context` inside the shard_map it runs in (per
    FSDP shard; with context 2, per chunk of queries against the gathered keys), so a policy keeping
    the tag saves what the kernel's backward reads: the compiled step has one splash forward per layer
    instead of two (the backward's rerun), the same dq and dkv kernels, and a smaller recompute."""
    calls, recompute = {}, {}
    for remat in ("q_proj,k_proj,v_proj", "q_proj,k_proj,v_proj,attn_context"):
        overrides = [f"model.remat={remat}", f"mesh.context={context}", f"data.seq_len={128 * context}"]
        r = compile_report(apply_overrides(get_recipe("tiny"), ONE_LAYER + overrides), topology="v5p:2x2x1")
        assert r["mesh"]["context"] == context
        calls[remat] = r["mosaic_calls"]
        recompute[remat] = r["hardware_flops_per_device"] / r["model_flops_per_device"]
    without, kept = calls["q_proj,k_proj,v_proj"], calls["q_proj,k_proj,v_proj,attn_context"]
    # one layer: each kernel's call sites
    assert without == {"splash_mha_fwd_residuals": 2, "splash_mha_dq_no_residuals": 1, "splash_mha_dkv_no_residuals": 1}
    assert kept == {**without, "splash_mha_fwd_residuals": 1}
    assert recompute["q_proj,k_proj,v_proj,attn_context"] < recompute["q_proj,k_proj,v_proj"]


@pytest.mark.slow  # two whole compiles (code generation included) of several minutes on 2 cores
def test_serial_backward_holds_one_block_at_a_time():
    """8 layers (two scanned groups of 4 blocks) of a 1024-wide model at 4 x 2048 tokens per device
    on Ironwood, q/k/v kept. Left to itself, the TPU compiler recomputes several blocks of a group
    ahead and puts off their weight gradients, holding their activations together; with
    model.remat_serial each block's backward pass runs as one unit. The compiler's peak falls by
    more than a fifth (its heap: 2.10 -> 1.32 GiB; on the 7B, docs/performance/remat.md)."""
    shape = [
        "model.n_layers=8",
        "model.d_model=1024",
        "model.n_heads=8",
        "model.n_kv_heads=8",
        "model.mlp_hidden=2816",
        "model.vocab_size=1024",
        "data.seq_len=2048",
        "trainer.global_batch=32",
        "trainer.loss_chunk=0",
        "model.remat=q_proj,k_proj,v_proj",
    ]
    peak = {}
    for serial in (False, True):
        cfg = apply_overrides(get_recipe("olmo3_7b_stage1"), shape + [f"model.remat_serial={serial}"])
        r = compile_report(cfg, topology="tpu7x:2x2x1")
        assert r["remat_serial"] is serial and r["per_device_batch"] == r["micro_batch"] == 4
        peak[serial] = r["per_device"]["peak_gib"]
    assert peak[True] < 0.8 * peak[False]


def test_doc_masked_step_compiles_with_its_doc_lens():
    """compile-check builds the batch the loader gives: with data.doc_masking, doc_lens ride along and
    the splash kernels take the segment ids made from them (their segmented forms, and only those)."""
    cfg = apply_overrides(get_recipe("tiny"), ONE_LAYER + ["data.doc_masking=true"])
    r = compile_report(cfg, topology="v5p:2x2x1")
    assert r["attention"] == "splash" and r["attention_kernel_calls"] >= 3 and r["fits"] is True
    assert sorted(r["mosaic_calls"]) == [
        "splash_mha_dkv_segmented_no_residuals",
        "splash_mha_dq_segmented_no_residuals",
        "splash_mha_fwd_segmented_residuals",
    ]


def test_the_flag_profile_reaches_the_compiler(monkeypatch):
    """A flag the compiler does not know fails the compile: the profile is passed, not dropped."""
    bogus = dataclasses.replace(chips.CHIPS["v5p"], libtpu_flags=("--xla_olmax_no_such_flag=1",))
    monkeypatch.setitem(chips.CHIPS, "v5p", bogus)
    cfg = apply_overrides(get_recipe("tiny"), ONE_LAYER + ["model.attention=xla"])
    with pytest.raises(Exception, match="xla_olmax_no_such_flag"):
        compile_report(cfg, topology="v5p:2x2x1")


@pytest.mark.slow  # the default suite's 10 minutes (docs/testing.md)
def test_a_users_xla_dump_is_kept_and_its_newest_report_read(tmp_path):
    """With XLA_FLAGS' --xla_dump_to set, compile-check writes the TPU compiler's reports there (a
    per-compile dump folder would replace the user's: XLA takes one) and reads the heap from the
    report of this compile, not from an earlier one left in the folder."""
    dump = tmp_path / "dump"
    dump.mkdir()
    stale = dump / "module_9999.jit_earlier.memory-usage-report.txt"  # sorts after the new one's name
    stale.write_text("Total bytes: 1\n")
    os.utime(stale, (1e9, 1e9))
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={dump}"
    out = tmp_path / "r.json"
    args = ["--recipe", "tiny", "--topology", "v5e:1x1", "--json", str(out), *SMALL_TPU]
    cmd = [sys.executable, "-m", "olmax.cli", "compile-check", *args]
    subprocess.run(cmd, env={**os.environ, "XLA_FLAGS": flags}, check=True, capture_output=True, timeout=300)
    reports = sorted(dump.glob("*memory-usage-report.txt"), key=lambda r: r.stat().st_mtime)
    assert len(reports) >= 2 and reports[0] == stale  # the user's folder holds the compile's report
    heap = int(reports[-1].read_text().split("Total bytes: ")[1].split()[0])
    assert json.loads(out.read_text())["per_device"]["heap_gib"] == pytest.approx(heap / GIB, rel=1e-12)
    assert heap > 2**20


def test_multislice_mesh_puts_only_data_across_slices():
    devices = topology_devices("tpu7x:2x2x1", num_slices=2)
    mesh = make_mesh(MeshConfig(data=1, fsdp=-1, tensor=1), devices)
    assert dict(mesh.shape) == {"data": 2, "fsdp": 8, "context": 1, "tensor": 1}
    for i, row in enumerate(mesh.devices):  # each data row is one slice: fsdp stays on the ICI
        assert {d.slice_index for d in row.flat} == {i}


def test_bad_topology_and_mesh_are_clear_errors():
    with pytest.raises(ConfigError, match="unknown TPU topology 'v9z:2x2'"):
        topology_devices("v9z:2x2")
    with pytest.raises(ConfigError, match="libtpu does not know the topology 'v5p:3x5x7'"):
        topology_devices("v5p:3x5x7")
    with pytest.raises(ConfigError, match="needs 6 devices, but 8 are available"):
        make_mesh(MeshConfig(data=2, fsdp=3, tensor=1), topology_devices("tpu7x:2x2x1"))


# Cloud TPU's accelerator types against the shapes Cloud TPU's docs list for each version's slices
# (v5e and v6e: "v5e/v6e topologies"; v4 and v5p: "v4 topologies", "v5p topologies"; Ironwood: tpu7x-8 is
# 2x2x1, 4 chips of 2 cores).
ACCELERATOR_TYPES = {
    "v5litepod-1": "v5e:1x1",
    "v5litepod-4": "v5e:2x2",
    "v5litepod-8": "v5e:2x4",
    "v5litepod-16": "v5e:4x4",
    "v5litepod-32": "v5e:4x8",
    "v5litepod-64": "v5e:8x8",
    "v5litepod-128": "v5e:8x16",
    "v5litepod-256": "v5e:16x16",
    "v6e-1": "v6e:1x1",
    "v6e-8": "v6e:2x4",
    "v6e-256": "v6e:16x16",
    "v4-8": "v4:2x2x1",
    "v4-16": "v4:2x2x2",
    "v4-128": "v4:4x4x4",
    "v5p-8": "v5p:2x2x1",
    "v5p-16": "v5p:2x2x2",
    "v5p-32": "v5p:2x2x4",
    "v5p-64": "v5p:2x4x4",
    "v5p-128": "v5p:4x4x4",
    "v5p-256": "v5p:4x4x8",
    "v5p-512": "v5p:4x8x8",
    "v5p-1024": "v5p:8x8x8",
    "tpu7x-8": "tpu7x:2x2x1",
    "tpu7x-16": "tpu7x:2x2x2",
    "tpu7x-128": "tpu7x:4x4x4",
}


def test_cloud_tpu_accelerator_types_name_the_same_slices():
    """What users type for xpk and gcloud (v5litepod-16, v5p-128, v6e-256, tpu7x-128) names the slice
    libtpu names AxB[xC], both ways; a size no slice has is a clear error listing the sizes; libtpu's
    names and GPU clusters pass unchanged."""
    for name, topology in ACCELERATOR_TYPES.items():
        assert chips.libtpu_topology(name) == topology and chips.tpu_type(topology) == name
        assert chips.chip_of_topology(name) is chips.chip_of_topology(topology)
    assert chips.libtpu_topology("v5p:4x4x4") == "v5p:4x4x4" and chips.libtpu_topology("h100:64x8") == "h100:64x8"
    with pytest.raises(ConfigError, match=r"v5p-100: no v5p slice has 100; v5p-N takes N in 8, 16, 32"):
        chips.libtpu_topology("v5p-100")
    with pytest.raises(ConfigError, match="unknown TPU topology 'v9z-8'.*v5litepod-N"):
        chips.chip_of_topology("v9z-8")
    named, libtpu = topology_devices("v5p-8"), topology_devices("v5p:2x2x1")
    assert [(d.id, d.coords) for d in named] == [(d.id, d.coords) for d in libtpu]


def test_compile_check_takes_an_accelerator_type_and_xla_attention_has_no_mosaic_kernel(tmp_path):
    """One TPU compile for both claims: the CLI names the slice an accelerator type stands for, and
    with model.attention=xla the step has no Mosaic kernel and is compiled with the chip's profile."""
    from typer.testing import CliRunner

    from olmax.cli import app

    out = tmp_path / "r.json"
    args = ["--topology", "v5litepod-4", *ONE_LAYER, "model.attention=xla", "--json", str(out)]
    r = CliRunner().invoke(app, ["compile-check", "--recipe", "tiny", *args])
    assert r.exit_code == 0, r.output
    report = json.loads(out.read_text())
    assert report["devices"] == 4 and report["chip"] == "v5e" and "v5e:2x2 (v5litepod-4) x 1 slice(s)" in r.output
    assert report["attention"] == "xla" and report["attention_kernel_calls"] == 0 and report["mosaic_calls"] == {}
    assert report["libtpu_flags"] == ["--xla_tpu_scoped_vmem_limit_kib=65536"]
    r = CliRunner().invoke(app, ["compile-check", "--recipe", "tiny", "--topology", "v5litepod-2"])
    assert r.exit_code == 2 and "no v5litepod slice has 2" in r.output


NOT_FITTING = {
    "recipe": "olmo3_7b_stage1",
    "topology": "v6e:2x2",
    "devices": 4,
    "platform": "tpu",
    "per_device": {"total_gib": 41.3, "peak_gib": 33.2},
    "hbm_limit_gib": 31.24,
    "hbm_headroom": 0.95,
    "chip": "v6e",
    "micro_batch": 4,
    "remat": "save_qkv_proj",
    "fits": False,
}


@pytest.mark.parametrize("topology", ["tpu7x:2x2x1", "v5p:2x2x1", "v6e:2x2", "v5e:1x1", "v4:2x2x1"])
def test_the_chip_tables_hbm_limit_is_the_tpu_compilers(topology):
    """One device's program of an argument and an output of the same size, its peak 2 of them: the
    compiler accepts it 8 MiB under the table's limit and runs out of HBM 8 MiB over it. (A program
    with temporaries proves the same at several times the compile time: near the limit the compiler
    tries to rematerialise them.)"""
    import jax
    import jax.numpy as jnp

    chip = chips.chip_of_topology(topology)
    device = jax.sharding.SingleDeviceSharding(topology_devices(topology)[0])

    def peak_of(gib):
        x = jax.ShapeDtypeStruct((int(gib * GIB / 2 / 4),), jnp.float32, sharding=device)
        step = jax.jit(jnp.sin).lower(x)
        return step.compile(compiler_options=chips.compiler_options(chip)).memory_analysis().peak_memory_in_bytes

    assert peak_of(chip.hbm_limit_gib - 8 / 1024) / GIB == pytest.approx(chip.hbm_limit_gib, abs=0.01)
    with pytest.raises(Exception, match="RESOURCE_EXHAUSTED"):
        peak_of(chip.hbm_limit_gib + 8 / 1024)


def test_does_not_fit_names_the_figures():
    report = NOT_FITTING
    with pytest.raises(
        DoesNotFit,
        match=r"olmo3_7b_stage1 does not fit on v6e:2x2: per-device peak 33.2 GiB "
        r"> 95% of the 31.24 GiB HBM limit",
    ):
        check_fits(report)
    check_fits({**report, "fits": True})


def test_cli_exits_2_on_bad_input(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from olmax.cli.common import app

    run = CliRunner().invoke
    r = run(app, ["compile-check", "--recipe", "tiny", "--topology", "v9z:2x2"])
    assert r.exit_code == 2 and "unknown TPU topology 'v9z:2x2'" in r.output
    r = run(app, ["compile-check", "--recipe", "tiny", "--topology", "tpu7x:2x2x1", "mesh.tensor=3"])
    assert r.exit_code == 2 and "not divisible by the fixed mesh axes" in r.output
    import olmax.fit.compile_check

    monkeypatch.setattr(olmax.fit.compile_check, "compile_report", lambda *a, **k: NOT_FITTING)
    monkeypatch.setattr(olmax.fit.compile_check, "format_report", lambda r: "report")
    r = run(app, ["compile-check", "--recipe", "tiny", "--topology", "v6e:2x2", "--json", str(tmp_path / "r.json")])
    assert r.exit_code == 2 and "per-device peak 33.2 GiB > 95% of the 31.24 GiB HBM limit" in r.output
    assert json.loads((tmp_path / "r.json").read_text())["fits"] is False  # the figures are written first


@pytest.mark.slow
def test_7b_stage1_train_step_compiles_on_8_cpu_devices():
    cfg = apply_overrides(
        get_recipe("olmo3_7b_stage1"), ["trainer.micro_batch_size=1", "trainer.loss_chunk=1024", "model.remat=full"]
    )
    r = compile_report(cfg)
    assert r["accum_steps"] == 64  # 512 instances over 8 devices, one at a time
    assert r["params_gib"] * GIB == pytest.approx(7_298_617_344 * 4 / 8, rel=1e-3)


@pytest.mark.slow
def test_splash_default_tiles_need_the_profiles_scoped_vmem(monkeypatch):
    """At 8192 tokens the default tiles (2048/2048/1024) overflow v5p's default 16 MiB of scoped
    VMEM; the chip profile's 64 MiB lets them compile."""
    cfg = apply_overrides(
        get_recipe("tiny"),
        [
            "model.n_layers=1",
            "model.vocab_size=512",
            "trainer.loss_chunk=0",
            "data.seq_len=8192",
            "trainer.global_batch=4",
            "model.head_dim=128",
            "model.compute_dtype=bfloat16",
            "model.sliding_window=4096",
        ],
    )
    assert compile_report(cfg, topology="v5p:2x2x1")["attention_kernel_calls"] > 0
    monkeypatch.setitem(chips.CHIPS, "v5p", dataclasses.replace(chips.CHIPS["v5p"], libtpu_flags=()))
    with pytest.raises(DoesNotFit, match="ran out of scoped VMEM"):
        compile_report(cfg, topology="v5p:2x2x1")


INIT_190M = """
import re, sys, jax
sys.path.insert(0, "benchmarks")
from gpu_mfu import SHAPE_190M  # the benchmarks' olmo3_190M shape
from olmax.fit.compiler import topology_devices
from olmax.config.io import apply_overrides
from olmax.config.recipes import get_recipe
from olmax.model.sharding import make_mesh
from olmax.step.state import init_program
cfg = apply_overrides(get_recipe("olmo3_7b"), [*SHAPE_190M, "mesh.fsdp=-1"])
mesh = make_mesh(cfg.mesh, topology_devices("v5e:1x1"))
key = jax.eval_shape(lambda: jax.random.key(0))
with jax.set_mesh(mesh):
    text = init_program(cfg, mesh).lower(key, None).compile().as_text()
print(max(int(n) for n in re.findall(r'"retry_count":"(\\d+)"', text)))
"""


@pytest.mark.slow  # one init compile for a v5e in a fresh process (~20 s on 2 cores; ~60 s without the fix)
def test_init_compiles_under_the_default_scoped_vmem():
    """With the v5e profile's 64 MiB of scoped VMEM in LIBTPU_INIT_ARGS, as `olmax train` sets it on a
    v5e, libtpu 0.0.42.1 retried the tiling of the 190m's fused truncated-normal draw of its (12, 3072,
    768) MLP stack 8 times; init_program compiles at the default 16 MiB (chips.INIT_COMPILER_OPTIONS),
    where it takes at most one retry."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", LIBTPU_INIT_ARGS=chips.libtpu_init_args(chips.CHIPS["v5e"]))
    assert "65536" in env["LIBTPU_INIT_ARGS"]
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", INIT_190M], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.split()[-1]) <= 1


def test_a_dpo_step_counts_both_rows_of_each_pair(cpu_dpo_step):
    """A DPO step of global_batch pairs runs 2 x global_batch sequences: the FLOPs compile-check reports
    (and the MFU it implies) are those of both rows, as the trainer's metrics count them."""
    cfg, r = cpu_dpo_step
    assert cfg.rows_per_step == 2 * cfg.trainer.global_batch
    want = exact_step_flops(cfg.model, cfg.data.seq_len, 2 * cfg.trainer.global_batch).total / 8
    assert r["model_flops_per_device"] == pytest.approx(want, rel=1e-12)
