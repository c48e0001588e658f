"""The `olmax` commands as a user runs them on a host without a TPU or GPU: a command that succeeds
prints nothing on stderr (no libtpu start-up errors, no absl/orbax notices), a failing one prints its
own one-line error; and the JAX_PLATFORMS choice behind it (cli.common.jax_platforms)."""

import importlib.util
import logging
import os
import subprocess
import sys

import pytest
from small_run import SMALL

from olmax.cli.common import ORBAX_READ_ONLY_NOTICES, host_has_accelerator, jax_platforms, runs_on, tpu_profile_env

# The environment of a user's shell: none of the settings the test session adds (conftest.py).
USER_ENV = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}

no_accelerator = pytest.mark.skipif(host_has_accelerator(), reason="checks a host without a TPU or GPU")


def olmax(*args, env=USER_ENV, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "olmax.cli", *map(str, args)], env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One step of the small `tiny` run (one row), trained through the CLI: (run directory, its stderr)."""
    tmp = tmp_path_factory.mktemp("quiet")
    run_dir = tmp / "run"
    # one step of one row: what the commands print is the claim, not what the model learns
    small = [o for o in SMALL if not o.startswith(("trainer.max_steps", "schedule.warmup_steps", "trainer.global"))]
    overrides = [*small, "trainer.max_steps=1", "schedule.warmup_steps=1", "trainer.global_batch=1"]
    overrides.append(f"data.work_dir={tmp / 'cache'}")
    done = olmax("train", "--recipe", "tiny", "--run-dir", run_dir, *overrides)
    assert done.returncode == 0, done.stderr
    return run_dir, done.stderr


@no_accelerator
def test_train_is_quiet(run):
    assert run[1] == ""


@no_accelerator
@pytest.mark.parametrize(
    "command",
    [
        # convert and generate quiet the libraries as eval loss does (cli.common.runs_on): the slow run
        pytest.param(["convert", "--to-hf", "{ckpt}", "--out", "{tmp}/hf"], marks=pytest.mark.slow),
        pytest.param(
            ["generate", "--ckpt", "{ckpt}", "--prompt", "Hello", "--max-new-tokens", "2"], marks=pytest.mark.slow
        ),
        ["status", "{run}"],
        ["eval", "loss", "--ckpt", "{ckpt}", "--data", "demo:heldout", "--seq-len", "64", "--max-batches", "1"],
        ["ckpt", "inspect", "{ckpt}"],
    ],
    ids=["convert", "generate", "status", "eval loss", "ckpt inspect"],
)
def test_commands_print_no_library_chatter(run, tmp_path, command):
    run_dir = run[0]
    args = [a.format(run=run_dir, ckpt=run_dir / "checkpoints", tmp=tmp_path) for a in command]
    done = olmax(*args)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", f"olmax {' '.join(args)} printed on stderr:\n{done.stderr}"


def test_errors_still_show(tmp_path):
    done = olmax("generate", "--ckpt", tmp_path / "missing", "--prompt", "Hello")
    assert done.returncode == 2
    assert done.stderr.startswith("generate error: ") and done.stderr.count("\n") == 1, done.stderr


def test_jax_platforms_choice(tmp_path):
    bare, tpu_v4, tpu_v6e, vfio_only = (tmp_path / n for n in ("bare", "v4", "v6e", "vfio"))
    for d in (bare, tpu_v4, tpu_v6e / "vfio", vfio_only / "vfio"):
        d.mkdir(parents=True)
    (tpu_v4 / "accel0").touch()
    (tpu_v6e / "vfio" / "0").touch()
    (tpu_v6e / "vfio" / "vfio").touch()
    (vfio_only / "vfio" / "vfio").touch()  # the VFIO control node alone: no device behind it
    assert not host_has_accelerator({}, str(bare)) and not host_has_accelerator({}, str(vfio_only))
    assert host_has_accelerator({}, str(tpu_v4)) and host_has_accelerator({}, str(tpu_v6e))
    assert host_has_accelerator({"JAX_FORCE_TPU_INIT": "1"}, str(bare))
    # a TPU host keeps its TPU for the model, and leaves it alone for a CPU command
    assert jax_platforms(True, {}, str(tpu_v6e)) is None
    assert jax_platforms(False, {}, str(tpu_v6e)) == "cpu"
    # without one, JAX never tries libtpu
    assert jax_platforms(True, {}, str(bare)) == "cpu"
    # the user's JAX_PLATFORMS stands, even empty (JAX's "every backend")
    for value in ("", "tpu", "cpu"):
        assert jax_platforms(False, {"JAX_PLATFORMS": value}, str(bare)) is None
        assert jax_platforms(True, {"JAX_PLATFORMS": value}, str(tpu_v4)) is None


def test_a_hosts_tpu_gets_its_chips_flag_profile(tmp_path):
    """The commands that run the model set the found TPU's profile themselves (v5e's splash tiles do not
    compile without its scoped VMEM), keep a flag the user set, and leave a CPU-only run alone."""
    pci = tmp_path / "bus" / "pci" / "devices"
    for slot, vendor, device in (("0000:00:04.0", "0x1af4", "0x1000"), ("0000:00:08.0", "0x1ae0", "0x0063")):
        (pci / slot).mkdir(parents=True)
        (pci / slot / "vendor").write_text(vendor + "\n")
        (pci / slot / "device").write_text(device + "\n")
    env = {}
    assert tpu_profile_env(env, str(tmp_path)) == "v5e"  # by the PCI id jax reads
    assert env["LIBTPU_INIT_ARGS"] == "--xla_tpu_scoped_vmem_limit_kib=65536"
    env = {"TPU_ACCELERATOR_TYPE": "tpu7x-8", "LIBTPU_INIT_ARGS": "--xla_tpu_scoped_vmem_limit_kib=32768"}
    assert tpu_profile_env(env, str(tmp_path / "none")) == "tpu7x"  # the TPU VM's own name comes first
    assert env["LIBTPU_INIT_ARGS"].split()[0] == "--xla_tpu_scoped_vmem_limit_kib=32768"
    assert "--xla_tpu_enable_sparse_core_collective_offload_all_gather=true" in env["LIBTPU_INIT_ARGS"]
    assert "--xla_tpu_scoped_vmem_limit_kib=65536" not in env["LIBTPU_INIT_ARGS"]
    env = {"JAX_PLATFORMS": "cpu"}
    assert tpu_profile_env(env, str(tmp_path)) is None and "LIBTPU_INIT_ARGS" not in env
    assert tpu_profile_env({}, str(tmp_path / "none")) is None  # no TPU


def test_only_orbax_read_only_notices_are_dropped(caplog):
    from absl import logging as absl_logging

    @runs_on("cpu")
    def command():
        for notice in sorted(ORBAX_READ_ONLY_NOTICES):
            absl_logging.warning(notice, *(["/tmp/ckpt"] if "%s" in notice else []))
        absl_logging.warning("Checkpoint %s is missing its commit marker", 7)

    with caplog.at_level(logging.WARNING):
        command()
    assert [r.getMessage() for r in caplog.records] == ["Checkpoint 7 is missing its commit marker"]


@no_accelerator
@pytest.mark.skipif(importlib.util.find_spec("jax_cuda12_plugin") is None, reason="the CUDA plugin is not installed")
def test_the_cuda_plugins_no_driver_notices_are_dropped():
    """Without a GPU the CUDA plugin's libraries print that there is no driver as JAX loads them, even
    with JAX_PLATFORMS=cpu and TF_CPP_MIN_LOG_LEVEL set; loaded first by the CLI, nothing is printed."""
    env = {**USER_ENV, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "1"}
    run = lambda code: subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    plain = run("import jax; jax.devices()")
    assert plain.returncode == 0 and "Could not find cuda drivers" in plain.stderr
    quiet = run("from olmax.cli.common import load_cuda_plugin_quietly as q; assert q(); import jax; jax.devices()")
    assert quiet.returncode == 0 and quiet.stderr == ""


@pytest.mark.slow  # the default suite's 10 minutes (docs/testing.md)
@no_accelerator
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu is not installed")
def test_compile_check_for_a_tpu_slice_is_quiet(tmp_path):
    """libtpu, loaded to compile for a named topology on a host without a TPU, reports as errors that
    it found no accelerator type and no worker hostnames; compile-check tells it the slice and the
    one worker (cli.common.introduce_libtpu), and prints nothing on stderr. Its own errors still show."""
    env = {**USER_ENV, "JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
    plain = subprocess.run(
        [sys.executable, "-c", "from jax.experimental import topologies as t; t.get_topology_desc('v5p:2x2x1', 'tpu')"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert plain.returncode == 0 and "TPU_ACCELERATOR_TYPE" in plain.stderr and "TPU_WORKER_HOSTNAMES" in plain.stderr
    small = ["model.n_layers=2", "model.vocab_size=512", "data.seq_len=128", "trainer.global_batch=8"]
    done = olmax("compile-check", "--recipe", "tiny", "--topology", "v5p:2x2x1", *small, f"data.work_dir={tmp_path}")
    assert done.returncode == 0 and "v5p:2x2x1" in done.stdout, done.stderr
    assert done.stderr == "", f"compile-check printed on stderr:\n{done.stderr}"
    wrong = olmax("compile-check", "--recipe", "tiny", "--topology", "v5p:3x5x7", *small)
    assert wrong.returncode == 2 and wrong.stderr.startswith("compile-check: libtpu does not know the topology")
