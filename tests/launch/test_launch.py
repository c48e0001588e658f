"""olmax launch: the batch layout for N devices, the commands and scripts each backend generates
(quoting checked by parsing them back with a shell's rules, and by running the sbatch script under
stub srun/scontrol), the environment variables, the jax.distributed set-up of the worker."""

import json
import os
import shlex
import subprocess
import sys

import pytest
from launch_env import SLURM_ENV, TRICKY, XPK_ENV, slurm_env, stub
from small_run import OLMAX
from typer.testing import CliRunner

from olmax.cli.common import app
from olmax.cli.worker import distributed_args
from olmax.config.io import apply_overrides, to_yaml
from olmax.errors import LaunchError
from olmax.launch.backends import dry_run, make_backend
from olmax.launch.plan import make_plan


def test_layout_keeps_the_global_batch_and_derives_accumulation():
    on8 = make_plan("tiny", ["trainer.micro_batch_size=1"], "r", 8).layout
    on2 = make_plan("tiny", ["trainer.micro_batch_size=1"], "r", 2).layout
    assert (on8.global_batch, on8.per_device, on8.accum_steps, on8.mesh["fsdp"]) == (8, 1, 1, 8)
    assert (on2.global_batch, on2.per_device, on2.accum_steps, on2.mesh["fsdp"]) == (8, 4, 4, 2)
    assert make_plan("olmo3_7b", ["trainer.micro_batch_size=2"], "r", 256).layout.accum_steps == 1
    assert make_plan("olmo3_7b", ["trainer.micro_batch_size=2"], "r", 64).layout.accum_steps == 4
    with pytest.raises(LaunchError, match=r"--total-devices 3 .*trainer.global_batch=8 is not divisible"):
        make_plan("tiny", [], "r", 3)
    with pytest.raises(LaunchError, match=r"trainer.micro_batch_size=3 does not divide"):
        make_plan("tiny", ["trainer.micro_batch_size=3"], "r", 2)
    assert make_plan("tiny", [], "r", 8, stop_at=8).final() == 8
    assert make_plan("tiny", [], "r", 8, stop_at=100).final() == 40  # trainer.max_steps


def test_a_run_to_the_end_of_its_epochs_learns_its_final_step_from_the_run(tmp_path):
    """trainer.max_steps=null: the final step is known once the trainer has opened the data and written
    it into RUN_DIR/config.yaml; --stop-at still ends it earlier."""
    epochs = ["trainer.max_steps=null", "schedule.t_max_epochs=1"]
    plan = make_plan("tiny", epochs, str(tmp_path), 8)
    assert plan.final() is None
    assert "until a complete checkpoint of the last step (the end of the data's epochs)" in dry_run(
        make_backend("local", plan, {}), plan, resume=True
    )
    (tmp_path / "config.yaml").write_text(to_yaml(apply_overrides(plan.resolve(), ["trainer.max_steps=15"])))
    assert plan.final() == 15
    assert make_plan("tiny", epochs, str(tmp_path), 8, stop_at=9).final() == 9
    assert make_plan("tiny", epochs, str(tmp_path), 8, stop_at=90).final() == 15


def test_local_command_round_trips_through_a_shell(tmp_path):
    run_dir = str(tmp_path / "my run")
    plan = make_plan("tiny", [TRICKY], run_dir, 2, stop_at=5)
    backend = make_backend("local", plan, {"XLA_FLAGS": "--xla_foo=1 --xla_force_host_platform_device_count=8"})
    (command,) = backend.launch_steps()
    assert command.argv == [*OLMAX, "train", "--recipe", "tiny", "--run-dir", run_dir, "--stop-at", "5", TRICKY]
    assert command.env == {"XLA_FLAGS": "--xla_foo=1 --xla_force_host_platform_device_count=2"}
    printed = dry_run(backend, plan, resume=False).splitlines()[-1]
    # what the shell would run: the environment assignment, then the argv unchanged
    echo = "import json, os, sys; print(json.dumps([os.environ['XLA_FLAGS'], sys.argv[1:]]))"
    shell = printed.replace(shlex.join(command.argv[:3]), shlex.join([sys.executable, "-c", echo]))
    out = subprocess.run(["sh", "-c", shell], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [command.env["XLA_FLAGS"], command.argv[3:]]


def test_slurm_script_starts_one_worker_per_node_with_the_coordinator(tmp_path):
    plan = make_plan("tiny", [TRICKY], str(tmp_path / "run dir"), 8)
    backend = make_backend("slurm", plan, {**SLURM_ENV, "OLMAX_SLURM_TIME": "1:00:00"})
    script = backend.script()
    assert "#SBATCH --nodes=2\n" in script and "#SBATCH --gpus-per-node=4\n" in script
    assert "#SBATCH --ntasks-per-node=1\n" in script and "#SBATCH --dependency=singleton\n" in script
    assert "#SBATCH --no-requeue\n" in script and "#SBATCH --signal=TERM@300\n" in script
    # the recipe's mesh.fsdp=-1 shards over both nodes, and the script says so
    assert "# Mesh within each node: fsdp=4; across 2 nodes: fsdp=2 (fsdp spans nodes" in script
    (sbatch,) = backend.attempt_steps(1)
    assert sbatch.argv == [
        "sbatch",
        f"--output={tmp_path / 'run dir' / 'launch' / 'slurm-%j.out'}",
        "--wait",
        str(backend.script_path),
    ]
    # run the script as Slurm would, with stubs: scontrol lists the job's nodes, srun records argv + env
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub(bin_dir, "scontrol", "print('node-a7\\nnode-a8')\n")
    stub(
        bin_dir,
        "srun",
        "import json, os, sys\n"
        "print(json.dumps([sys.argv[1:], os.environ['OLMAX_COORDINATOR'], "
        "os.environ['OLMAX_DISTRIBUTED']]))\n",
    )
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node-a[7-8]"}
    out = subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, check=True).stdout
    argv, coordinator, mode = json.loads(out)
    assert argv == [
        "--nodes=2",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        "python3",
        "-m",
        "olmax.cli.worker",
        *plan.train_args(),
    ]
    assert plan.train_args()[-1] == TRICKY
    assert (coordinator, mode) == ("node-a7:12355", "slurm")


def test_slurm_errors_name_the_variable():
    plan = make_plan("tiny", [], "r", 8)
    with pytest.raises(LaunchError) as missing:
        make_backend("slurm", plan, {})
    assert "OLMAX_SLURM_PARTITION" in str(missing.value) and "OLMAX_SLURM_GPUS_PER_NODE" in str(missing.value)
    with pytest.raises(LaunchError, match="--total-devices 8 is not a multiple of OLMAX_SLURM_GPUS_PER_NODE=3"):
        make_backend("slurm", plan, {**SLURM_ENV, "OLMAX_SLURM_GPUS_PER_NODE": "3"})
    with pytest.raises(LaunchError, match="OLMAX_SLURM_GPUS_PER_NODE='four' must be a positive integer"):
        make_backend("slurm", plan, {**SLURM_ENV, "OLMAX_SLURM_GPUS_PER_NODE": "four"})
    with pytest.raises(LaunchError, match="OLMAX_SLURM_PARTITION='gpu a'"):
        make_backend("slurm", plan, {**SLURM_ENV, "OLMAX_SLURM_PARTITION": "gpu a"})
    with pytest.raises(LaunchError, match="mesh does not fit nodes of OLMAX_SLURM_GPUS_PER_NODE=4: mesh tensor=6"):
        make_backend("slurm", make_plan("tiny", ["mesh.fsdp=2", "mesh.tensor=6"], "r", 12), SLURM_ENV)
    with pytest.raises(LaunchError, match="'pbs' is not one of local, xpk, slurm"):
        make_backend("pbs", plan, {})


def test_slurm_hsdp_layout_keeps_fsdp_within_a_node():
    plan = make_plan("tiny", ["mesh.data=-1", "mesh.fsdp=4"], "r", 8)
    script = make_backend("slurm", plan, SLURM_ENV).script()
    assert "# Mesh within each node: fsdp=4; across 2 nodes: data=2.\n" in script


def test_xpk_commands_and_the_worker_command_string():
    plan = make_plan("tiny", [TRICKY], "/gcs/runs/Tiny_1", 8)
    backend = make_backend("xpk", plan, {**XPK_ENV, "OLMAX_XPK_ZONE": "us-east5-a"})
    create, wait = backend.attempt_steps(1)
    assert create.argv[:13] == [
        "xpk",
        "workload",
        "create",
        "--cluster",
        "c1",
        "--zone",
        "us-east5-a",
        "--workload",
        "olmax-tiny-1-a1",
        "--tpu-type",
        "v5p-16",
        "--num-slices",
        "1",
    ]
    assert create.argv[13:21] == [
        "--docker-image",
        "gcr.io/p/olmax:1",
        "--env",
        "OLMAX_DISTRIBUTED=auto",
        "--env",
        "LIBTPU_INIT_ARGS=--xla_tpu_scoped_vmem_limit_kib=65536",
        "--command",
        backend.worker_command(),
    ]
    # xpk hands --command to a shell on each VM: it must split back into the worker's argv
    assert shlex.split(backend.worker_command()) == ["python3", "-m", "olmax.cli.worker", *plan.train_args()]
    assert wait.argv == [
        "xpk",
        "workload",
        "list",
        "--cluster",
        "c1",
        "--zone",
        "us-east5-a",
        "--wait-for-job-completion",
        "olmax-tiny-1-a1",
    ]
    delete, create2, _ = backend.attempt_steps(2)
    assert delete.may_fail and delete.argv[2:5] == ["delete", "--cluster", "c1"]
    assert "olmax-tiny-1-a1" in delete.argv and "olmax-tiny-1-a2" in create2.argv
    # the printed line parses back into the same argv
    assert shlex.split(dry_run(backend, plan, resume=False).splitlines()[-1]) == backend.launch_steps()[0].argv


def test_xpk_checks_devices_against_the_slice():
    plan = make_plan("tiny", [], "r", 8)
    with pytest.raises(LaunchError, match=r"v5p-256 x OLMAX_XPK_NUM_SLICES=1 \(128 x 1 = 128 devices\)"):
        make_backend("xpk", plan, {**XPK_ENV, "OLMAX_XPK_TPU_TYPE": "v5p-256"})
    assert make_backend("xpk", plan, {**XPK_ENV, "OLMAX_XPK_TPU_TYPE": "v6e-4", "OLMAX_XPK_NUM_SLICES": "2"})
    ironwood = make_backend("xpk", plan, {**XPK_ENV, "OLMAX_XPK_TPU_TYPE": "tpu7x-8"})  # 4 chips, 8 devices
    assert "--xla_tpu_enable_sparse_core_collective_offload_all_gather=true" in " ".join(ironwood.env_args())
    v5e = make_backend("xpk", make_plan("tiny", [], "r", 4), {**XPK_ENV, "OLMAX_XPK_TPU_TYPE": "v5litepod-4"})
    assert "LIBTPU_INIT_ARGS=--xla_tpu_scoped_vmem_limit_kib=65536" in v5e.env_args()
    with pytest.raises(LaunchError, match="workload name 'Bad_Name'"):
        make_backend("xpk", plan, {**XPK_ENV, "OLMAX_XPK_WORKLOAD": "Bad_Name"})


def test_worker_distributed_arguments():
    assert distributed_args({}) is None
    assert distributed_args({"OLMAX_DISTRIBUTED": "auto"}) == {}
    slurm = {"OLMAX_DISTRIBUTED": "slurm", "OLMAX_COORDINATOR": "n1:12355", "SLURM_NTASKS": "4", "SLURM_PROCID": "3"}
    assert distributed_args(slurm) == {
        "coordinator_address": "n1:12355",
        "num_processes": 4,
        "process_id": 3,
        "cluster_detection_method": "deactivate",
    }
    with pytest.raises(LaunchError, match="needs OLMAX_COORDINATOR"):
        distributed_args({**slurm, "OLMAX_COORDINATOR": ""})
    with pytest.raises(LaunchError, match="'mpi' is not one of"):
        distributed_args({"OLMAX_DISTRIBUTED": "mpi"})


def test_two_workers_form_one_jax_distributed_job(tmp_path):
    """The slurm path for real on CPU: two processes with Slurm's variables find each other."""
    import portpicker

    port = portpicker.pick_unused_port()
    procs = []
    for rank in range(2):
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "olmax.cli.worker", "config", "--recipe", "tiny"],
                env=slurm_env(rank, port, local_devices=2),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outs = [p.communicate(timeout=120) for p in procs]
    for rank, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, err[-2000:]
        assert f"jax.distributed process {rank} of 2, 2 local of 4 devices" in err, err[-2000:]
        assert "name: tiny" in out


def test_cli_dry_run_and_errors(tmp_path):
    runner = CliRunner()
    run_dir = str(tmp_path / "r")
    local = ["launch", "resume-until-done", "--backend", "local", "--recipe", "tiny", "--total-devices", "4"]
    result = runner.invoke(app, [*local, "--run-dir", run_dir, "--dry-run", TRICKY])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("# local: 4 devices (mesh data=1 x fsdp=4 x context=1 x tensor=1): global batch 8")
    assert "resume-until-done until a complete checkpoint of step 40" in lines[1]
    assert shlex.split(lines[-1])[-1] == TRICKY
    assert not (tmp_path / "r").exists()  # a dry run writes nothing
    result = runner.invoke(
        app,
        ["launch", "--backend", "xpk", "--recipe", "tiny", "--total-devices", "8", "--run-dir", run_dir, "--dry-run"],
        env={k: "" for k in XPK_ENV},
    )
    assert result.exit_code == 2 and "OLMAX_XPK_CLUSTER" in result.output
    result = runner.invoke(app, ["launch", "--help-env"])
    assert result.exit_code == 0 and "OLMAX_SLURM_GPUS_PER_NODE (required)" in result.output
    assert "OLMAX_RETRY_BACKOFF_SECONDS (default 300)" in result.output
