"""compile-check for GPU clusters: XLA's GPU compiler (the CUDA plugin) compiles the real train step on
this CPU for abstract H100/H200/B200 devices made from the project's target descriptions, with cuDNN's
fused attention in the step and the chips' GPU flag profile as compiler options."""

import dataclasses
import json
import logging
import re
from importlib import resources

import jax
import jax.numpy as jnp
import pytest

from olmax.config.io import apply_overrides
from olmax.config.recipes import get_recipe
from olmax.errors import ConfigError
from olmax.fit import chips
from olmax.fit.compile_check import check_fits, compile_report
from olmax.fit.compiler import CUDNN_ATTENTION_CALL, DoesNotFit, topology_devices
from olmax.model.attention import cudnn_target, dot_product_attention

pytest.importorskip("jax_cuda12_plugin", reason="needs the gpu-compile extra (make setup-test)")

# The tiny recipe (GQA 4/2, head_dim 32, a window-64 and a global layer) at two layers, in bfloat16
# (cuDNN has no float32 kernel): XLA's GPU compiler takes seconds for it.
SMALL_GPU = [
    "model.n_layers=2",
    "model.vocab_size=512",
    "trainer.loss_chunk=0",
    "trainer.global_batch=16",
    "model.compute_dtype=bfloat16",
]


def test_small_model_on_two_h100_nodes_runs_cudnn_attention_with_the_gpu_profile():
    r = compile_report(apply_overrides(get_recipe("tiny"), SMALL_GPU), topology="h100:2x8")
    assert (r["platform"], r["devices"], r["nodes"], r["device_kind"], r["chip"]) == (
        "gpu",
        16,
        2,
        "NVIDIA H100 80GB HBM3",
        "h100",
    )
    assert r["per_device_batch"] == 1 and r["micro_batch"] == 1
    assert r["attention"] == "cudnn"  # auto, resolved for the cluster, not for this CPU host
    # forward and backward for the windowed and the global layer: the gradients run cuDNN too
    assert r["cudnn_calls"] == {"__cudnn$fmhaSoftmax": 2, "__cudnn$fmhaSoftmaxBackward": 2}
    assert r["attention_kernel_calls"] == 4
    assert r["xla_flags"] == sorted(chips.GPU_XLA_FLAGS) and r["libtpu_flags"] == []
    d = r["per_device"]
    assert 0 < d["peak_gib"] and d["aliased_gib"] > 0
    assert r["hbm_limit_gib"] == pytest.approx(84942979072 / 2**30) and r["hbm_headroom"] == chips.GPU_MEM_FRACTION
    assert r["fits"] is True
    assert r["model_flops_per_device"] > 0 and r["hlo_flops_per_device"] is None  # no cost analysis on GPU
    json.dumps(r)  # the --json payload


def test_gpu_devices_are_the_nodes_gpus():
    """h100:NxG: N nodes of G GPUs; device i is on node i // G (its process_index, as in a run with
    one process per node)."""
    devices = topology_devices("h100:3x8")
    assert len(devices) == 24 and [d.process_index for d in devices] == [i // 8 for i in range(24)]
    for name in ("h100", "h200", "b200"):
        chip = chips.get_chip(name)
        (device,) = topology_devices(f"{name}:1x1")
        assert (device.platform, device.device_kind) == ("gpu", chip.device_kind)
        # the chip table's HBM is the target description's memory
        target = resources.files("olmax.fit.gpu_targets").joinpath(chip.gpu_target).read_text()
        assert chip.hbm_limit_gib * 2**30 == int(re.search(r"device_memory_size: (\d+)", target).group(1))
    assert topology_devices("b200:1x1")[0].compute_capability == "10.0"


def _attention_custom_calls(head_dim, seq_len, window, capability):
    """cuDNN's custom calls in the compiled gradient of the `cudnn` backend's attention call: OLMo 3's
    32 query heads over 8 kv heads, one H100."""
    (device,) = topology_devices("h100:1x1")
    on = jax.sharding.SingleDeviceSharding(device)
    q = jax.ShapeDtypeStruct((1, seq_len, 32, head_dim), jnp.bfloat16, sharding=on)
    kv = jax.ShapeDtypeStruct((1, seq_len, 8, head_dim), jnp.bfloat16, sharding=on)
    loss = lambda q, k, v: dot_product_attention(q, k, v, window, "cudnn").astype(jnp.float32).sum()
    with cudnn_target(capability):
        compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, kv, kv).compile()
    return sorted(set(re.findall(r'custom_call_target="(__cudnn\$fmha[^"]*)"', compiled.as_text())))


def test_cudnn_compiles_the_7b_attention_shape_forward_and_backward():
    """8192 tokens, head_dim 128, causal with OLMo 3's 4096-token window, GQA."""
    calls = _attention_custom_calls(128, 8192, 4096, "9.0")
    assert calls == ["__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward"]
    assert CUDNN_ATTENTION_CALL.endswith("__cudnn$fmha")


def test_head_dim_256_compiles_for_hopper_and_is_refused_before_it():
    """jax's cuDNN check allows head_dim 256 from compute capability 9.0; given the target's (not this
    host's) it compiles, and a pre-Hopper target is refused as jax refuses it on such a GPU."""
    assert _attention_custom_calls(256, 1024, 512, "9.0") == ["__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward"]
    with pytest.raises(NotImplementedError, match="head dim must be <= 128"):
        _attention_custom_calls(256, 1024, 512, "8.0")


@pytest.fixture(scope="module")
def doc_masked_on_a_4_mib_h100(tmp_path_factory):
    """One GPU compile for two tests: `olmax compile-check` of one layer with documents masked on 8 H100s
    that the chip table gives 4 MiB each. Returns the CLI's result, the report it wrote to --json
    (before exiting) and the attention module's log lines."""
    from typer.testing import CliRunner

    from olmax.cli.common import app
    from olmax.model import attention

    attention._warn_once.cache_clear()  # another test in this process may have said it already
    out = tmp_path_factory.mktemp("doc-masked") / "r.json"
    said = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    args = ["--topology", "h100:1x8", *SMALL_GPU, "model.n_layers=1", "data.doc_masking=true", "--json", str(out)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(chips.CHIPS, "h100", dataclasses.replace(chips.CHIPS["h100"], hbm_limit_gib=0.004))
        attention.log.addHandler(handler)
        try:
            result = CliRunner().invoke(app, ["compile-check", "--recipe", "tiny", *args])
        finally:
            attention.log.removeHandler(handler)
    return result, json.loads(out.read_text()), said


def test_doc_masking_on_gpu_falls_back_to_xla_attention(doc_masked_on_a_4_mib_h100):
    """cuDNN cannot take the document mask (docs/attention.md): auto runs the xla backend, says so,
    once per process (every trace of the step resolves the backend again), and the step has no cuDNN call."""
    from olmax.model import attention

    _, r, said = doc_masked_on_a_4_mib_h100
    assert r["attention"] == "xla" and r["attention_kernel_calls"] == 0 and r["cudnn_calls"] == {}
    assert attention.resolve_backend("auto", "gpu", doc_masking=True) == "xla"  # a later trace's question
    assert sum("cannot mask attention within documents" in line for line in said) == 1, said


def test_a_context_axis_on_gpu_runs_xla_attention_and_refuses_a_named_cudnn():
    """jax's cuDNN call has no context-parallel form (docs/attention.md): under mesh.context=2 `auto`
    compiles the step with the xla backend (keys and values gathered over the axis, no cuDNN call),
    and a named cudnn is one line and exit 2, not the partitioner's traceback."""
    from typer.testing import CliRunner

    from olmax.cli.common import app

    context = [
        "compile-check",
        "--recipe",
        "tiny",
        "--topology",
        "h100:1x4",
        *SMALL_GPU,
        "model.n_layers=1",  # one (global) layer: which backend runs is the step's, not a layer's
        "data.seq_len=128",
        "mesh.context=2",
        "mesh.fsdp=2",
    ]
    r = CliRunner().invoke(app, context)
    assert r.exit_code == 0, r.output
    assert "mesh {'data': 1, 'fsdp': 2, 'context': 2, 'tensor': 1}" in r.output
    assert "attention xla (0 cuDNN kernel calls)" in r.output
    r = CliRunner().invoke(app, [*context, "model.attention=cudnn"])
    assert r.exit_code == 2
    assert r.output.strip().splitlines() == [
        "compile-check: model.attention=cudnn has no context-parallel form (jax's cuDNN call cannot offset its "
        "causal mask to a chunk of the sequence): with mesh.context=2 use model.attention=auto (it runs xla "
        "instead of cudnn on GPUs) or one of xla, splash"
    ]


@pytest.mark.slow  # the default suite's 10 minutes (docs/testing.md)
def test_the_loss_takes_each_devices_context_chunks_without_moving_hidden_states(capfd):
    """The 7B Think SFT's layout on 64 H100s (fsdp 16 x context 4, 2 rows per batch shard, documents
    masked), its model shrunk to one layer of d_model 256 at 1,024 tokens: the train step turns each
    device's chunks into rows of the output loss (train_step's context_rows) with no collective of the
    (rows, positions, d_model) hidden states or their gradient, and XLA's SPMD partitioner reports no
    "involuntary full rematerialization". Until 2026-12-03 the rows were merged in an order the devices
    do not hold them in: the step all-gathered the whole batch of hidden states to every device (bf16
    forward, float32 in the final norm's backward pass; in the real recipe 8 and 16 GiB per GPU)."""
    from olmax.fit.compiler import compile_step, target, target_options
    from olmax.model.sharding import make_mesh

    shrunk = ["model.n_layers=1", "model.d_model=256", "model.n_heads=4", "model.n_kv_heads=4", "model.head_dim=64"]
    shrunk += ["model.mlp_hidden=512", "model.vocab_size=512", "data.seq_len=1024", "trainer.loss_chunk=128"]
    shrunk += ["model.remat=full"]
    cfg = apply_overrides(get_recipe("olmo3_7b_think_sft"), shrunk)
    devices, chip, where = target("h100:8x8")
    mesh = make_mesh(cfg.mesh, devices)
    assert dict(mesh.shape) == {"data": 1, "fsdp": 16, "context": 4, "tensor": 1}
    text = compile_step(cfg, mesh, target_options(chip, "gpu"), where).compiled.as_text()
    # the result shapes of every collective that moves data between devices
    results = re.findall(r"= (.*?) (?:all-gather|all-to-all|collective-permute)(?:-start)?\(", text)
    moved = [shapes for shapes in results if re.search(r"\[\d+,\d+,256\]", shapes)]  # (rows, positions, d_model)
    assert results and not moved, moved[:3]
    assert "Involuntary full rematerialization" not in capfd.readouterr().err


def test_the_gpu_flag_profile_reaches_the_compiler(monkeypatch):
    """A flag XLA's GPU compiler does not know fails the compile: the profile is passed, not dropped."""
    bogus = dataclasses.replace(chips.CHIPS["h100"], xla_flags=("--xla_olmax_no_such_flag=1",))
    monkeypatch.setitem(chips.CHIPS, "h100", bogus)
    with pytest.raises(Exception, match="No such compile option: 'xla_olmax_no_such_flag'"):
        compile_report(apply_overrides(get_recipe("tiny"), [*SMALL_GPU, "model.n_layers=1"]), topology="h100:1x8")


def test_bad_gpu_topologies_are_clear_errors():
    with pytest.raises(ConfigError, match=r"unknown TPU topology 'h900:1x8', nor a GPU cluster; .*h100:NxG"):
        topology_devices("h900:1x8")
    for bad in ("h100:8", "h100:0x8", "h100:2x8x1", "h100:ax8"):
        with pytest.raises(ConfigError, match=rf"GPU topology '{bad}' is not h100:NxG"):
            topology_devices(bad)
    with pytest.raises(ConfigError, match="--num-slices is for TPU slices"):
        topology_devices("h100:2x8", num_slices=2)


def test_cli_exits_2_on_bad_gpu_input(doc_masked_on_a_4_mib_h100):
    from typer.testing import CliRunner

    from olmax.cli.common import app

    run = CliRunner().invoke
    r = run(app, ["compile-check", "--recipe", "tiny", "--topology", "h900:1x8"])
    assert r.exit_code == 2 and "unknown TPU topology 'h900:1x8', nor a GPU cluster" in r.output
    # 3 nodes of 8 GPUs: 24 devices do not divide the batch of 16
    r = run(app, ["compile-check", "--recipe", "tiny", "--topology", "h100:3x8", *SMALL_GPU])
    assert r.exit_code == 2
    assert "tiny on h100:3x8 (3 nodes x 8 GPUs): trainer.global_batch=16 is not divisible" in r.output
    # a real compile against a GPU with 4 MiB: does not fit, with the figures
    r, _, _ = doc_masked_on_a_4_mib_h100
    assert r.exit_code == 2, r.output
    assert re.search(r"tiny does not fit on h100:1x8: per-device peak \d+\.\d GiB > 90% of the 0.00 GiB", r.output)


def test_the_slurm_trainers_get_the_profile_compile_check_compiles_with(tmp_path):
    """The sbatch script exports the GPU profile (its XLA flags are compile_report's xla_flags), run by
    bash with a stub srun; a variable --env sets is the launch's; --chip naming a TPU gets none."""
    import os
    import subprocess

    from launch_env import SLURM_ENV, stub

    from olmax.launch.backends import make_backend
    from olmax.launch.plan import TrainOptions, make_plan

    def trainer_env(options):
        plan = make_plan("tiny", [], str(tmp_path / "run"), 8, options=options)
        script = tmp_path / "job.sbatch"
        script.write_text(make_backend("slurm", plan, SLURM_ENV).script())
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        stub(bin_dir, "scontrol", "print('node-a7')\n")
        stub(bin_dir, "srun", "import json, os\nprint(json.dumps({k: v for k, v in os.environ.items()}))\n")
        env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "XLA_PYTHON_CLIENT_MEM_FRACTION")}
        env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_NODELIST="node-a7")
        done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, check=True)
        return json.loads(done.stdout)

    seen = trainer_env(TrainOptions(chip="h100"))
    assert sorted(seen["XLA_FLAGS"].split(" ")) == sorted(chips.CHIPS["h100"].xla_flags)
    assert {k: seen[k] for k, _ in chips.GPU_ENV} == dict(chips.GPU_ENV)
    assert seen["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.90"
    seen = trainer_env(TrainOptions(env=(("XLA_FLAGS", "--xla_mine=1"),)))
    assert seen["XLA_FLAGS"] == "--xla_mine=1" and seen["NCCL_PROTO"] == "SIMPLE,LL,LL128"
    seen = trainer_env(TrainOptions(chip="v5p"))
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in seen and "NCCL_PROTO" not in seen


# Keep every named activation: the least rematerialisation there is short of none
# (docs/performance/recipes-on-slices.md).
ALL_TAGS = "model.remat=layer_input,q_proj,k_proj,v_proj,attn_context,o_proj,mlp_gate,mlp_up,mlp_down"


@pytest.mark.slow
def test_7b_stage1_on_64_h100_nodes_fits_keeping_every_named_activation_not_without_remat():
    """AI2's stage-1 layout: 512 instances on 512 H100s, one each. Without remat the step needs more
    than an H100 has (a clear DoesNotFit with the figures); keeping the nine named activations fits."""
    cfg = get_recipe("olmo3_7b_stage1")
    r = compile_report(apply_overrides(cfg, [ALL_TAGS]), topology="h100:64x8")
    assert (r["devices"], r["nodes"], r["per_device_batch"], r["accum_steps"]) == (512, 64, 1, 1)
    assert r["attention"] == "cudnn" and r["cudnn_calls"]["__cudnn$fmhaSoftmaxBackward"] > 0 and r["fits"]
    none = compile_report(apply_overrides(cfg, ["model.remat=none"]), topology="h100:64x8")
    with pytest.raises(DoesNotFit, match=r"per-device peak \d+\.\d GiB > 90% of the 79.11 GiB HBM limit"):
        check_fits(none)


@pytest.mark.slow
@pytest.mark.parametrize(
    "recipe, topology, overrides",
    [
        ("olmo3_7b_stage1", "h200:1x8", []),
        ("olmo3_7b_stage2", "h100:16x8", []),
        ("olmo3_32b_stage1", "h100:128x8", ["mesh.tensor=2"]),
    ],
)
def test_recipes_fit_their_gpu_layouts_with_cudnn(recipe, topology, overrides):
    r = compile_report(apply_overrides(get_recipe(recipe), overrides), topology=topology)
    assert r["attention"] == "cudnn" and r["cudnn_calls"]["__cudnn$fmhaSoftmaxBackward"] > 0 and r["fits"]


@pytest.mark.slow
def test_7b_stage3_fits_ai2s_gpu_layout_with_context_8_and_xla_attention():
    """AI2's stage-3 layout: 256 H100s, context parallelism 8 within each node, 2 instances of 65,536
    tokens per context group as 2 micro-batches. Documents are masked, so auto runs the xla backend
    (jax's cuDNN call takes no segment ids); its blocks run as scans of at most 8 band widths, which
    is what lets XLA's GPU compiler finish this step (docs/attention.md, "xla details")."""
    overrides = ["mesh.context=8", "mesh.fsdp=-1", "trainer.micro_batch_size=1"]
    r = compile_report(apply_overrides(get_recipe("olmo3_7b_stage3"), overrides), topology="h100:32x8")
    assert r["mesh"] == {"data": 1, "fsdp": 32, "context": 8, "tensor": 1} and r["nodes"] == 32
    assert (r["per_device_batch"], r["micro_batch"], r["accum_steps"]) == (2, 1, 2)
    assert r["attention"] == "xla" and r["cudnn_calls"] == {} and r["fits"]


@pytest.mark.slow
def test_7b_rl_train_steps_fit_ai2s_learner_nodes():
    """The RL train steps on AI2's learners (docs/post-training/rl-recipes.md, "Recipes"), packed rows with
    documents masked (xla attention), the remat `auto` chose given: Instruct's 16 rows of 11,264 per GPU
    of one node keep every matmul output (peak 69.92 GiB of 71.20); Think's 32 rows of 35,840 per GPU of
    two nodes fit under no policy on fsdp alone, and with `mesh.tensor=2` recompute whole blocks in the
    serial order (35.98 GiB)."""
    every = "model.remat=q_proj,k_proj,v_proj,attn_context,o_proj,mlp_gate,mlp_down,mlp_up"
    r = compile_report(apply_overrides(get_recipe("olmo3_7b_instruct_rl"), [every]), topology="h100:1x8")
    assert r["mesh"]["fsdp"] == 8 and (r["per_device_batch"], r["micro_batch"]) == (16, 1)
    assert r["attention"] == "xla" and r["fits"]
    think = ["mesh.tensor=2", "model.remat=full", "model.remat_serial=true"]
    r = compile_report(apply_overrides(get_recipe("olmo3_7b_think_rl"), think), topology="h100:2x8")
    assert r["mesh"] == {"data": 1, "fsdp": 8, "context": 1, "tensor": 2} and r["per_device_batch"] == 64
    assert r["attention"] == "xla" and r["fits"]


@pytest.mark.slow
def test_7b_think_sft_and_dpo_fit_ai2s_64_h100s():
    """The 7B Think SFT (32,768 tokens, documents masked: xla attention) and DPO (pairs of 16,384:
    cuDNN) steps on AI2's 64 H100s, with the remat `auto` chose for them (docs/post-training/dpo.md)."""
    sft = "model.remat=q_proj,k_proj,v_proj,attn_context,o_proj,mlp_down"
    r = compile_report(apply_overrides(get_recipe("olmo3_7b_think_sft"), [sft]), topology="h100:8x8")
    assert r["mesh"] == {"data": 1, "fsdp": 16, "context": 4, "tensor": 1} and r["per_device_batch"] == 2
    assert r["attention"] == "xla" and r["fits"]
    dpo = "model.remat=q_proj,k_proj,v_proj"
    r = compile_report(apply_overrides(get_recipe("olmo3_7b_think_dpo"), [dpo]), topology="h100:8x8")
    assert r["mesh"]["fsdp"] == 64 and (r["per_device_batch"], r["accum_steps"]) == (2, 2)
    assert r["attention"] == "cudnn" and r["cudnn_calls"]["__cudnn$fmhaSoftmaxBackward"] > 0 and r["fits"]


@pytest.mark.slow
def test_32b_dpo_steps_fit_ai2s_h100_layouts():
    """The 32B DPO steps (pairs of 8,192 tokens: cuDNN) on the GPUs AI2's scripts name, with the remat
    `auto` chose for them (docs/post-training/dpo.md, "DPO in `olmax train`", "Recipes"): Think's 128 pairs
    on 16 nodes, one per GPU; Instruct's on 8 nodes, two per GPU as two micro-batches of one."""
    think = "model.remat=q_proj,k_proj,v_proj,attn_context,o_proj,mlp_down"
    r = compile_report(
        apply_overrides(get_recipe("olmo3_32b_think_dpo"), [think, "model.remat_serial=true"]), topology="h100:16x8"
    )
    assert r["mesh"]["fsdp"] == 128 and (r["per_device_batch"], r["accum_steps"]) == (1, 1)
    assert r["attention"] == "cudnn" and r["cudnn_calls"]["__cudnn$fmhaSoftmaxBackward"] > 0 and r["fits"]
    instruct = ["model.remat=q_proj,k_proj,v_proj", "model.remat_serial=true"]
    r = compile_report(apply_overrides(get_recipe("olmo3_32b_instruct_dpo"), instruct), topology="h100:8x8")
    assert r["mesh"]["fsdp"] == 64 and (r["per_device_batch"], r["accum_steps"]) == (2, 2)
    assert r["attention"] == "cudnn" and r["fits"]


@pytest.mark.slow
def test_32b_rl_train_steps_fit_ai2s_learners():
    """The 32B RL train steps on AI2's learner GPUs (docs/post-training/rl-recipes.md, "Recipes"), xla attention
    over the packed rows: Instruct's 512 rows of 19,456 on 32 GPUs keep q/k/v in the serial order (as
    `auto` chose); Think's rows of 35,840 on 96 GPUs, 576 rows (6 per GPU) in HSDP groups of 32 (96 does
    not divide d_model), fit only with a tensor axis of 2 and whole blocks recomputed."""
    instruct = ["model.remat=q_proj,k_proj,v_proj", "model.remat_serial=true"]
    r = compile_report(apply_overrides(get_recipe("olmo3_32b_instruct_rl"), instruct), topology="h100:4x8")
    assert r["mesh"]["fsdp"] == 32 and (r["per_device_batch"], r["micro_batch"]) == (16, 1)
    assert r["attention"] == "xla" and r["fits"]
    think = ["trainer.global_batch=576", "mesh.data=3", "mesh.fsdp=16", "mesh.tensor=2"]
    think += ["model.remat=full", "model.remat_serial=true"]
    r = compile_report(apply_overrides(get_recipe("olmo3_32b_think_rl"), think), topology="h100:12x8")
    assert r["mesh"] == {"data": 3, "fsdp": 16, "context": 1, "tensor": 2} and r["per_device_batch"] == 12
    assert r["attention"] == "xla" and r["fits"]
