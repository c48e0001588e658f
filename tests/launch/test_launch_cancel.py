"""A job stopped on purpose through the scheduler is not resubmitted; a preemption or a time limit is.
End to end through resume_until_done with the real Slurm and xpk backends, whose cluster commands
(sbatch and sacct; xpk and kubectl) are stand-ins on PATH that play one scenario: each attempt's
"trainer" writes its exit record into the run directory as `olmax train` does on SIGTERM (PREEMPTED),
makes its checkpoint, and the scheduler then reports the state a real cluster would."""

import json
import os

import pytest
from launch_env import SLURM_ENV, XPK_ENV, stub

from olmax.checkpoint.store import complete_steps
from olmax.launch import slurm
from olmax.launch.backends import make_backend
from olmax.launch.plan import make_plan
from olmax.launch.resume import RetryPolicy, resume_until_done
from olmax.rundir.exits import ExitStatus

PREEMPTED = int(ExitStatus.PREEMPTED)

# The trainer's side of an attempt: make checkpoint STEP, write the record {status: RECORD} unless it
# is null (killed before it could), as olmax.rundir.exits.write_record does.
TRAINER = """
import json, os
def trainer(run_dir, step, record):
    if step:
        os.makedirs(os.path.join(run_dir, "checkpoints", str(step)), exist_ok=True)
    if record is not None:
        with open(os.path.join(run_dir, "exit_status.json"), "w") as f:
            json.dump({"status": record, "name": "?", "message": f"SIGTERM: saved step {step}"}, f)
def turn(scenario_file, key):
    # the number of the call, counted in a file beside the scenario: which attempt, which sacct call
    path = f"{scenario_file}.{key}"
    n = int(open(path).read()) + 1 if os.path.exists(path) else 1
    open(path, "w").write(str(n))
    return n
"""

# sbatch --wait: submit job 100+N for attempt N, play its trainer, exit as `sbatch --wait` would.
SBATCH = (
    TRAINER
    + """
import sys
scenario_file = os.environ["SCENARIO"]
attempt = turn(scenario_file, "sbatch")
plan = json.load(open(scenario_file))["attempts"][attempt - 1]
assert "--wait" in sys.argv, sys.argv
script = sys.argv[-1]
run_dir = os.path.dirname(os.path.dirname(script))
print(f"Submitted batch job {100 + attempt}", flush=True)
trainer(run_dir, plan["step"], plan["record"])
sys.exit(plan["exit"])
"""
)

# sacct -j JOB -X -n -P -o State: the job's state lines, one per call, the last one repeated
SACCT = (
    TRAINER
    + """
import sys
scenario_file = os.environ["SCENARIO"]
job = sys.argv[sys.argv.index("-j") + 1]
assert sys.argv[3:] == ["-X", "-n", "-P", "-o", "State"], sys.argv
states = json.load(open(scenario_file))["attempts"][int(job) - 101]["sacct"]
print(states[min(turn(scenario_file, "sacct-" + job), len(states)) - 1])
"""
)


def _slurm_run(tmp_path, monkeypatch, attempts, max_retries=0, final=12):
    """resume_until_done with the Slurm backend against the scenario; (status, sleeps, log lines, state)."""
    bin_dir, run_dir = tmp_path / "bin", tmp_path / "run"
    bin_dir.mkdir(parents=True)
    stub(bin_dir, "sbatch", SBATCH)
    stub(bin_dir, "sacct", SACCT)
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"attempts": attempts}))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SCENARIO", str(scenario))
    monkeypatch.setattr(slurm, "SACCT_WAIT_S", 0.0)
    plan = make_plan("tiny", [f"trainer.max_steps={final}"], str(run_dir), 8)
    sleeps, lines = [], []
    backend = make_backend("slurm", plan, SLURM_ENV)
    status = resume_until_done(
        backend,
        plan,
        RetryPolicy(max_retries, 7.0),
        complete_steps=complete_steps,
        sleep=sleeps.append,
        echo=lines.append,
    )
    state = json.loads((run_dir / "launch_state.json").read_text())
    return status, sleeps, lines, state


def test_scancel_is_not_resubmitted_though_the_trainer_recorded_a_preemption(tmp_path, monkeypatch):
    """scancel: SIGTERM to the job, the trainer saves and records PREEMPTED; sacct, a few seconds
    behind, first still says RUNNING, then `CANCELLED by 123`. Not resubmitted; the launcher exits 143
    and says why, and launch_state.json names the attempt CANCELLED."""
    attempt = {
        "step": 4,
        "record": PREEMPTED,
        "exit": PREEMPTED,
        "sacct": ["RUNNING", "COMPLETING", "CANCELLED by 123"],
    }
    status, sleeps, lines, state = _slurm_run(tmp_path, monkeypatch, [attempt, {"step": 12, "record": 0, "exit": 0}])
    assert status == PREEMPTED and sleeps == []
    assert (tmp_path / "scenario.json.sbatch").read_text() == "1"  # submitted once
    assert (tmp_path / "scenario.json.sacct-101").read_text() == "3"  # asked again while accounting lagged
    ended = next(line for line in lines if "attempt 1 ended" in line)
    assert "CANCELLED (Slurm job 101: CANCELLED by 123 (scancel: stopped on purpose); the trainer: SIGTERM" in ended
    assert "cancelled on purpose through the scheduler: not resubmitting" in lines[-1]
    assert "step 4" in lines[-1]
    last = state["last_attempt"]
    assert (last["name"], last["status"], state["last_failure"]) == ("CANCELLED", PREEMPTED, last)
    assert "CANCELLED by 123" in last["why"] and (state["attempts"], state["retries"]) == (1, 0)


def test_a_slurm_preemption_and_the_time_limit_are_resubmitted(tmp_path, monkeypatch):
    """Slurm PREEMPTED with the trainer's PREEMPTED record; the time limit's TERM@300, after which the
    job ends FAILED (the trainer saved and exited 143 in time) or TIMEOUT (it saved, then outlived the
    limit): all three resubmitted without counting against max_retries=0, until the final step."""
    attempts = [
        {"step": 3, "record": PREEMPTED, "exit": PREEMPTED, "sacct": ["RUNNING", "PREEMPTED"]},
        {"step": 6, "record": PREEMPTED, "exit": PREEMPTED, "sacct": ["FAILED"]},
        {"step": 9, "record": PREEMPTED, "exit": 9 + 128, "sacct": ["TIMEOUT"]},
        {"step": 12, "record": 0, "exit": 0, "sacct": ["COMPLETED"]},
    ]
    status, sleeps, lines, state = _slurm_run(tmp_path, monkeypatch, attempts)
    assert status == 0 and sleeps == [7.0, 7.0, 7.0]
    assert any("attempt 1 ended: exit status 143, PREEMPTED (the trainer: SIGTERM: saved step 3)" in x for x in lines)
    # where the scheduler's reading differs from the trainer's record, the log shows both
    assert any(
        "attempt 3 ended: exit status 137, PREEMPTED (the trainer: SIGTERM: saved step 9; Slurm job 103: TIMEOUT)" in x
        for x in lines
    )
    assert lines[-1].endswith("done: complete checkpoint at step 12 (final step 12) after 4 attempt(s)")
    assert (state["attempts"], state["retries"], state["preemptions"]) == (4, 3, 3)


def test_without_a_trainer_record_the_slurm_state_decides(tmp_path, monkeypatch):
    """A job cancelled while it waited in the queue (no trainer ran) is CANCELLED too; a TIMEOUT
    without a record (killed at the limit before it saved) is a crash that counts."""
    status, sleeps, lines, state = _slurm_run(
        tmp_path / "a", monkeypatch, [{"step": 0, "record": None, "exit": 1, "sacct": ["CANCELLED by 0"]}]
    )
    assert (
        status == PREEMPTED
        and sleeps == []
        and state["last_attempt"]["why"].startswith("Slurm job 101: CANCELLED by 0")
    )
    status, sleeps, lines, state = _slurm_run(
        tmp_path / "b", monkeypatch, [{"step": 0, "record": None, "exit": 137, "sacct": ["TIMEOUT"]}] * 2, max_retries=1
    )
    assert status == ExitStatus.CRASHED and sleeps == [7.0]
    assert "giving up: 2 attempts in a row" in lines[-1]


def test_sacct_that_never_catches_up_leaves_the_record_to_decide(tmp_path, monkeypatch):
    """Accounting still RUNNING after every try: the trainer's PREEMPTED record decides (resubmitted)."""
    attempts = [
        {"step": 4, "record": PREEMPTED, "exit": PREEMPTED, "sacct": ["RUNNING"]},
        {"step": 12, "record": 0, "exit": 0, "sacct": ["COMPLETED"]},
    ]
    status, sleeps, lines, state = _slurm_run(tmp_path, monkeypatch, attempts)
    assert status == 0 and sleeps == [7.0]
    assert (tmp_path / "scenario.json.sacct-101").read_text() == str(slurm.SACCT_TRIES)


# xpk: `workload create` / `workload delete` / `workload list [--wait-for-job-completion W | --filter-by-job W]`.
# The wait plays the attempt's trainer and exits as xpk does; a deleted workload's JobSet is gone.
XPK = (
    TRAINER
    + """
import sys
scenario_file = os.environ["SCENARIO"]
scenario = json.load(open(scenario_file))
args = sys.argv[1:]
assert args[0] == "workload" and args[2:4] == ["--cluster", "c1"], args
if args[1] == "list" and "--wait-for-job-completion" in args:
    name = args[args.index("--wait-for-job-completion") + 1]
    plan = scenario["attempts"][int(name.rsplit("-a", 1)[1]) - 1]
    trainer(scenario["run_dir"], plan["step"], plan["record"])
    if plan["deleted"]:
        open(f"{scenario_file}.deleted-{name}", "w").close()
    sys.exit(plan["exit"])
if args[1] == "list":
    sys.exit(scenario.get("list_exit", 0))
if args[1] == "create":
    sys.exit(scenario.get("create_exit", 0))
"""
)

# kubectl get jobset NAME -n default --ignore-not-found -o name
KUBECTL = """
import os, sys
args = sys.argv[1:]
assert args[:2] == ["get", "jobset"] and args[3:] == ["-n", "default", "--ignore-not-found", "-o", "name"], args
if not os.path.exists(f"{os.environ['SCENARIO']}.deleted-{args[2]}"):
    print(f"jobset.jobset.x-k8s.io/{args[2]}")
"""


def _xpk_run(tmp_path, monkeypatch, attempts, list_exit=0, create_exit=0):
    bin_dir, run_dir = tmp_path / "bin", tmp_path / "run"
    bin_dir.mkdir(parents=True)
    stub(bin_dir, "xpk", XPK)
    stub(bin_dir, "kubectl", KUBECTL)
    scenario = tmp_path / "scenario.json"
    scenario.write_text(
        json.dumps({"attempts": attempts, "run_dir": str(run_dir), "list_exit": list_exit, "create_exit": create_exit})
    )
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SCENARIO", str(scenario))
    plan = make_plan("tiny", ["trainer.max_steps=12"], str(run_dir), 8)
    backend = make_backend("xpk", plan, {**XPK_ENV, "OLMAX_XPK_WORKLOAD": "olmax-run"})
    sleeps, lines = [], []
    status = resume_until_done(
        backend, plan, RetryPolicy(0, 7.0), complete_steps=complete_steps, sleep=sleeps.append, echo=lines.append
    )
    return status, sleeps, lines, json.loads((run_dir / "launch_state.json").read_text())


@pytest.mark.parametrize("wait_exit", [1, 124])  # xpk reading the deleted JobSet's status; the wait's timeout
def test_a_deleted_xpk_workload_is_not_resubmitted(tmp_path, monkeypatch, wait_exit):
    """`xpk workload delete`: the trainers get SIGTERM, save and record PREEMPTED; the wait ends
    non-zero and the attempt's JobSet is gone: CANCELLED, not resubmitted."""
    attempts = [
        {"step": 4, "record": PREEMPTED, "exit": wait_exit, "deleted": True},
        {"step": 12, "record": 0, "exit": 0},
    ]
    status, sleeps, lines, state = _xpk_run(tmp_path, monkeypatch, attempts)
    assert status == PREEMPTED and sleeps == []
    assert (
        "the JobSet olmax-run-a1 is gone (deleted: `xpk workload delete`); the trainer: SIGTERM"
        in state["last_attempt"]["why"]
    )
    assert state["last_attempt"]["name"] == "CANCELLED"
    assert "cancelled on purpose through the scheduler: not resubmitting" in lines[-1]


def test_a_preempted_xpk_workload_is_resubmitted(tmp_path, monkeypatch):
    """A real preemption (node maintenance, a spot slice reclaimed): SIGTERM, PREEMPTED record, the
    JobSet fails (wait 125) but still exists: resubmitted without counting. When the cluster cannot
    be asked (xpk list fails) the record decides too: resubmitted."""
    attempts = [
        {"step": 4, "record": PREEMPTED, "exit": 125, "deleted": False},
        {"step": 12, "record": 0, "exit": 0, "deleted": False},
    ]
    status, sleeps, lines, state = _xpk_run(tmp_path / "a", monkeypatch, attempts)
    assert status == 0 and sleeps == [7.0] and state["preemptions"] == 1
    assert any("PREEMPTED (the trainer: SIGTERM: saved step 4; xpk: workload failed)" in x for x in lines)
    status, sleeps, lines, state = _xpk_run(tmp_path / "b", monkeypatch, attempts, list_exit=1)
    assert status == 0 and sleeps == [7.0]
    assert any("xpk: workload failed; whether its JobSet still exists is unknown" in x for x in lines)


def test_an_xpk_workload_that_was_never_created_is_not_taken_for_a_deleted_one(tmp_path, monkeypatch):
    """`xpk workload create` fails: its JobSet does not exist, but nobody deleted it. A crash that
    counts (max_retries=0: the launcher gives up with 1), not CANCELLED."""
    status, sleeps, lines, state = _xpk_run(tmp_path, monkeypatch, [], create_exit=1)
    assert status == ExitStatus.CRASHED and sleeps == []
    assert state["last_attempt"]["why"] == "xpk workload create exited 1"
    assert "giving up: 1 attempts in a row" in lines[-1]
