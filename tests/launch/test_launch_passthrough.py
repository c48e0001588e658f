"""`olmax launch` passes on everything `olmax train` takes (--config, overrides, --chip,
--allow-data-change, --allow-config-change) and extra environment (--env KEY=VALUE) on every backend,
with quoting checked by the shell rules each backend's command goes through; the job-state readings
of the Slurm and xpk backends (olmax.rundir.exits)."""

import json
import os
import shlex
import subprocess
import sys

import pytest
from launch_env import SLURM_ENV, TRICKY, XPK_ENV, stub
from typer.testing import CliRunner

from olmax.cli.common import app
from olmax.config.io import save_yaml
from olmax.config.recipes import get_recipe
from olmax.errors import LaunchError
from olmax.launch.backends import dry_run, make_backend
from olmax.launch.outcome import Ended, Outcome
from olmax.launch.plan import TrainOptions, make_plan, parse_env
from olmax.rundir.exits import ExitStatus

# values a shell would split or expand: spaces, both quotes, $, and '=' inside the value
ENV = ["LIBTPU_INIT_ARGS=--xla_tpu_flag=true --other='a b'", 'NOTE=it\'s "$HOME"', "XLA_FLAGS=--xla_a=1"]


def _plan(tmp_path, run_dir, devices=8):
    config = tmp_path / "my exp.yaml"
    save_yaml(get_recipe("tiny"), config)
    options = TrainOptions(str(config), "v5p", True, True, parse_env(ENV))
    return make_plan(None, [TRICKY], run_dir, devices, stop_at=5, options=options)


def _train_args(plan):
    return [
        "train",
        "--config",
        plan.options.config,
        "--chip",
        "v5p",
        "--allow-data-change",
        "--allow-config-change",
        "--run-dir",
        plan.run_dir,
        "--stop-at",
        "5",
        TRICKY,
    ]


def test_local_passes_options_and_environment_through_a_shell(tmp_path):
    plan = _plan(tmp_path, str(tmp_path / "run a"), devices=2)
    backend = make_backend("local", plan, {"XLA_FLAGS": "--inherited=1"})
    (command,) = backend.launch_steps()
    assert command.argv[3:] == _train_args(plan)
    assert command.env == {
        "LIBTPU_INIT_ARGS": "--xla_tpu_flag=true --other='a b'",
        "NOTE": 'it\'s "$HOME"',
        "XLA_FLAGS": "--xla_a=1 --xla_force_host_platform_device_count=2",
    }  # --env wins
    echo = (
        "import json, os, sys; "
        "print(json.dumps([{k: os.environ[k] for k in sys.argv[1:2] + ['NOTE', 'LIBTPU_INIT_ARGS']}, sys.argv[2:]]))"
    )
    printed = dry_run(backend, plan, resume=True).splitlines()[-1]
    shell = printed.replace(shlex.join(command.argv[:3]), shlex.join([sys.executable, "-c", echo, "XLA_FLAGS"]))
    env, argv = json.loads(subprocess.run(["sh", "-c", shell], capture_output=True, text=True, check=True).stdout)
    assert env == {k: command.env[k] for k in env} and argv == _train_args(plan)


def test_xpk_passes_env_as_xpk_env_flags_and_options_in_the_command(tmp_path):
    plan = _plan(tmp_path, "/gcs/runs/r1")
    backend = make_backend("xpk", plan, XPK_ENV)
    create, _ = backend.attempt_steps(1)
    flags = [create.argv[i + 1] for i, a in enumerate(create.argv) if a == "--env"]
    assert flags == ["OLMAX_DISTRIBUTED=auto", *ENV]
    assert shlex.split(backend.worker_command()) == ["python3", "-m", "olmax.cli.worker", *_train_args(plan)]
    assert shlex.split(dry_run(backend, plan, resume=False).splitlines()[-1]) == backend.launch_steps()[0].argv


def test_slurm_script_exports_env_and_passes_options(tmp_path):
    plan = _plan(tmp_path, str(tmp_path / "run dir"))
    backend = make_backend("slurm", plan, SLURM_ENV)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub(bin_dir, "scontrol", "print('node-a7')\n")
    stub(
        bin_dir,
        "srun",
        "import json, os, sys\nprint(json.dumps([sys.argv[1:], "
        "{k: os.environ[k] for k in ('LIBTPU_INIT_ARGS', 'NOTE', 'XLA_FLAGS')}]))\n",
    )
    script = tmp_path / "job.sbatch"
    script.write_text(backend.script())
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node-a7"}
    argv, seen = json.loads(
        subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, check=True).stdout
    )
    assert argv[-len(_train_args(plan)) :] == _train_args(plan)
    assert seen == dict(parse_env(ENV))
    assert "# file " in dry_run(backend, plan, resume=True) and "export NOTE=" in dry_run(backend, plan, resume=True)


def test_cli_dry_run_shows_everything_and_bad_input_is_refused(tmp_path):
    config = tmp_path / "exp.yaml"
    save_yaml(get_recipe("tiny"), config)
    args = [
        "launch",
        "--config",
        str(config),
        "--total-devices",
        "8",
        "--run-dir",
        str(tmp_path / "r"),
        "--chip",
        "h100",
        "--allow-data-change",
        "--env",
        "A=b c",
        "--env",
        "XLA_FLAGS=--x=1",
        "--dry-run",
        "trainer.max_steps=7",
    ]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    line = out.output.splitlines()[-1]
    assert line.startswith("A='b c' XLA_FLAGS='--x=1 --xla_force_host_platform_device_count=8' ")
    assert shlex.split(line)[-8:] == [
        "--config",
        str(config),
        "--chip",
        "h100",
        "--allow-data-change",
        "--run-dir",
        str(tmp_path / "r"),
        "trainer.max_steps=7",
    ]
    bad = CliRunner().invoke(app, [*args[:-2], "--env", "1A=x", "--dry-run"])
    assert bad.exit_code == 2 and "--env '1A=x' is not KEY=VALUE" in bad.output
    bad = CliRunner().invoke(
        app, ["launch", "--recipe", "tiny", "--total-devices", "8", "--run-dir", "r", "--chip", "abacus", "--dry-run"]
    )
    assert bad.exit_code == 2 and "abacus" in bad.output
    with pytest.raises(LaunchError, match="--env 'NOVALUE'"):
        parse_env(["NOVALUE"])


def test_slurm_and_xpk_read_their_job_states(tmp_path, monkeypatch):
    """The backends' own readings (without the trainer's record, which olmax.launch.outcome weighs)."""
    plan = make_plan("tiny", [], str(tmp_path / "r"), 8)
    slurm = make_backend("slurm", plan, SLURM_ENV)
    log = tmp_path / "attempt-1.log"
    log.write_text("Submitted batch job 4242\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    (sbatch,) = slurm.attempt_steps(1)
    for state, code, row in [
        ("PREEMPTED", 1, ExitStatus.PREEMPTED),
        ("NODE_FAIL", 1, ExitStatus.TRANSIENT),
        ("FAILED", 75, ExitStatus.TRANSIENT),
        ("COMPLETED", 0, ExitStatus.DONE),
        ("OUT_OF_MEMORY", 1, ExitStatus.CRASHED),
        ("TIMEOUT", 143, ExitStatus.CRASHED),
    ]:
        stub(bin_dir, "sacct", f"import sys\nassert sys.argv[1:3] == ['-j', '4242']\nprint({state!r})\n")
        got = slurm.outcome(Ended(1, code, sbatch, log))
        assert (got.status, got.cancelled) == (row, False), state
    stub(bin_dir, "sacct", "print('CANCELLED by 1000')\n")
    assert slurm.outcome(Ended(1, 143, sbatch, log)).name == "CANCELLED"
    assert not slurm.outcome(Ended(1, 143, sbatch, log)).retried
    (bin_dir / "sacct").unlink()  # no accounting: the exit code alone
    assert slurm.outcome(Ended(1, 143, sbatch, log)) == Outcome(
        ExitStatus.PREEMPTED, "Slurm job 4242: no sacct; exit code"
    )
    xpk = make_backend("xpk", plan, XPK_ENV)
    create, wait = xpk.attempt_steps(1)
    assert xpk.outcome(Ended(1, 0, wait, log)).status is ExitStatus.DONE
    stub(bin_dir, "xpk", "import sys\nsys.exit(1)\n")  # the cluster cannot be asked
    assert xpk.outcome(Ended(1, 125, wait, log)) == Outcome(
        ExitStatus.CRASHED, "xpk: workload failed; whether its JobSet still exists is unknown"
    )
    # a workload that was never created was not deleted by anyone: a crash, retried
    assert xpk.outcome(Ended(1, 1, create, log)) == Outcome(ExitStatus.CRASHED, "xpk workload create exited 1")
