"""`olmax status RUN_DIR` on a real small run directory (trained here, with a launcher's state), and
its incremental metrics reading (appends, and a file rewritten shorter or longer by a resumed
trainer, locally and through fsspec)."""

import json
import shutil
import subprocess
import sys
import time

import pytest
from small_run import small_config
from typer.testing import CliRunner

import olmax.trainer.run
from olmax.checkpoint.store import complete_steps
from olmax.checkpoint.surgery import inspect
from olmax.cli.common import app
from olmax.fit.chips import chip_peak
from olmax.launch.resume import LaunchState
from olmax.rundir.exits import ExitStatus, read_record, write_record
from olmax.rundir.report import MetricsReader, run_status
from olmax.trainer.run import train


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("status")
    cfg = small_config(root, "eval.every=0", "checkpoint.every=2", "trainer.max_steps=4")
    train(cfg, root / "run", stop_at=3, progress=False)
    state = LaunchState.load(str(root / "run"))
    state.ended(ExitStatus.TRANSIENT, 75, "the trainer: RemoteReadError: ...", 2)
    state.retrying(preempted=False)
    state.ended(ExitStatus.PREEMPTED, 143, "the trainer: stopped after step 3 of 4", 3)
    write_record(str(root / "run"), ExitStatus.PREEMPTED, "stopped after step 3 of 4")  # as olmax train does
    return root / "run"


def test_status_of_a_real_run(run):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    s = run_status(str(run), MetricsReader(str(run), window=3), peak_tflops=chip_peak("v5p"))
    assert (s["step"], s["total_steps"], s["tokens"], s["total_tokens"]) == (3, 4, 3 * 8 * 64, 4 * 8 * 64)
    times = sorted(r["time/step"] for r in rows[-3:])
    assert s["step_time_s"] == times[1] and s["tokens_per_s"] == pytest.approx(8 * 64 / times[1])
    assert s["eta_s"] == pytest.approx(1 * times[1])
    assert s["mfu"] == pytest.approx(sorted(r["throughput/device/TFLOPs"] for r in rows[-3:])[1] / 459.0)
    assert s["loss"] == rows[-1]["train/CE loss"]
    assert s["loss_smoothed"] == pytest.approx(sum(r["train/CE loss"] for r in rows[-3:]) / 3)
    assert s["skipped_steps"] == sum(r["optim/step skipped"] > 0 for r in rows)
    ckpt = json.loads((run / "checkpoints" / "3" / "data" / "metadata").read_text())  # --stop-at saves
    assert (s["checkpoint"], s["data_fingerprint"]) == (3, ckpt["fingerprint"])
    assert (s["attempts"], s["retries"], s["preemptions"]) == (2, 1, 0)
    assert s["last_failure"]["name"] == "PREEMPTED" and s["last_exit"]["name"] == "PREEMPTED"
    out = CliRunner().invoke(app, ["status", str(run)])
    assert out.exit_code == 0, out.output
    assert "step 3 / 4 (75.0%), tokens 1,536 / 2,048" in out.output
    assert "newest complete checkpoint: step 3" in out.output and ckpt["fingerprint"] in out.output
    assert "launcher: 2 attempt(s), 1 retries (0 after preemptions); last failure: PREEMPTED (exit 143" in out.output
    printed = CliRunner().invoke(app, ["status", str(run), "--json", "-"])
    assert json.loads(printed.output.splitlines()[-1])["checkpoint"] == 3
    missing = CliRunner().invoke(app, ["status", str(run.parent / "nothing")])
    assert missing.exit_code == 2 and "nothing/config.yaml does not exist" in missing.output


# a Python that cannot import jax, jaxlib or orbax: any import of them fails
NO_JAX = """
import sys
class NoJax:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("jax", "jaxlib", "orbax"):
            raise ModuleNotFoundError(f"{name} is blocked: this command must not import it")
sys.meta_path.insert(0, NoJax())
from olmax.cli import main
sys.argv = ["olmax", *sys.argv[1:]]
main()
"""


@pytest.mark.parametrize(
    "command",
    [
        ["status", "{run}", "--json", "-"],
        ["status", "{run}", "--chip", "v5p"],
        ["config", "--recipe", "tiny_dpo", "trainer.global_batch=4"],
        ["launch", "--backend", "local", "--recipe", "tiny", "--total-devices", "8", "--run-dir", "{run}", "--dry-run"],
    ],
)
def test_commands_that_read_files_import_no_jax(run, command):
    """`olmax status` (and the config and launch plans) read files only: they run where jax cannot be
    imported, and status reads the newest checkpoint as Orbax lists it, without Orbax."""
    args = [a.format(run=run) for a in command]
    out = subprocess.run([sys.executable, "-c", NO_JAX, *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    if args[-1] == "-":
        shown = json.loads(out.stdout.splitlines()[-1])
        assert shown["checkpoint"] == complete_steps(run / "checkpoints")[-1] == 3
        assert shown["data_fingerprint"] == inspect(run / "checkpoints")["data"]["fingerprint"]


def test_follow_stops_once_the_run_has_ended(run, tmp_path, monkeypatch):
    """--follow keeps following after a preemption or a crash (a launcher may resubmit) and stops, with
    the final state printed, on an exit record after which nothing continues the run."""
    for final in (ExitStatus.DONE, ExitStatus.USER_ERROR):
        copy = tmp_path / final.name
        shutil.copytree(run, copy)  # the fixture's record: PREEMPTED
        later = [ExitStatus.CRASHED, final]  # what the trainers of the next attempts write

        def sleep(seconds, copy=copy, later=later):
            assert later, "still following a run that has ended"
            write_record(str(copy), later.pop(0), "stopped after step 4 of 4")

        monkeypatch.setattr(time, "sleep", sleep)
        out = CliRunner().invoke(app, ["status", str(copy), "--follow", "--every", "0"])
        assert out.exit_code == 0, out.output
        assert not later and out.output.count("step 3 / 4") == 3
        assert out.output.endswith(f"the run has ended ({final.name}): no longer following\n")
        assert f"last trainer exit: {final.name} ({int(final)})" in out.output.splitlines()[-2]


def test_a_starting_trainer_removes_the_previous_exit_record(tmp_path, monkeypatch):
    """A run continued with `olmax train` after it was DONE must not read as ended while it trains."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_record(str(run_dir), ExitStatus.DONE, "stopped after step 40 of 40")
    seen = []
    monkeypatch.setattr(olmax.trainer.run, "train", lambda cfg, run_dir, **_: seen.append(read_record(run_dir)) or [])
    args = ["train", "--recipe", "tiny", "--run-dir", str(run_dir), "trainer.max_steps=80"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    assert seen == [None] and read_record(str(run_dir))["name"] == "DONE"  # this trainer's own record


def test_metrics_reader_follows_appends_and_rewrites(tmp_path):
    path = tmp_path / "metrics.jsonl"
    row = lambda step, skipped=0.0: json.dumps({"step": step, "optim/step skipped": skipped}) + "\n"
    path.write_text(row(1) + row(2, 1.0) + row(3)[:7])  # the last row is being written
    reader = MetricsReader(str(tmp_path), window=2)
    reader.refresh()
    assert [r["step"] for r in reader.rows] == [1, 2] and reader.skipped == 1
    path.write_text(row(1) + row(2, 1.0) + row(3) + row(4, 1.0))
    reader.refresh()
    assert [r["step"] for r in reader.rows] == [3, 4] and reader.skipped == 2
    path.write_text(row(1) + row(2, 1.0))  # a resumed trainer dropped steps 3 and 4
    reader.refresh()
    assert [r["step"] for r in reader.rows] == [1, 2] and reader.skipped == 1


@pytest.mark.parametrize("where", ["local", "url"])
def test_metrics_reader_starts_over_when_a_resume_rewrites_the_file_longer(tmp_path, where):
    import fsspec

    run_dir = str(tmp_path) if where == "local" else f"memory://olmax-status-{tmp_path.name}"
    path = f"{run_dir}/metrics.jsonl"

    def write(text):  # whole-file writes, as the trainer's rewrite (os.replace) and a gs:// sync do
        with fsspec.open(path, "w") as f:
            f.write(text)

    def row(step, skipped=0.0, seconds=1.0):
        return json.dumps({"step": step, "optim/step skipped": skipped, "time/step": seconds}) + "\n"

    write(row(1) + row(2, 1.0) + row(3) + row(4, 1.0) + row(5)[:9])  # step 5 being written when it died
    reader = MetricsReader(run_dir, window=3)
    reader.refresh()
    assert [r["step"] for r in reader.rows] == [2, 3, 4] and reader.skipped == 2
    # resumed from the checkpoint of step 2: steps 3, 4, 5 logged again (other times, step 4 not
    # skipped this time) and a step 6, so the file is longer than what was read
    write(row(1) + row(2, 1.0) + row(3, 0.0, 1.25) + row(4, 0.0, 1.5) + row(5, 0.0, 1.25) + row(6))
    reader.refresh()
    assert [(r["step"], r["time/step"]) for r in reader.rows] == [(4, 1.5), (5, 1.25), (6, 1.0)]
    assert reader.skipped == 1  # step 2 only: the skipped step 4 of the dead attempt is gone
    write(row(1) + row(2, 1.0) + row(3, 0.0, 1.25) + row(4, 0.0, 1.5) + row(5, 0.0, 1.25) + row(6) + row(7, 1.0))
    reader.refresh()  # an append: read on
    assert [r["step"] for r in reader.rows] == [5, 6, 7] and reader.skipped == 2
    if where == "url":
        fsspec.filesystem("memory").rm(path)
