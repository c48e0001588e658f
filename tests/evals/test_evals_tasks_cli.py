"""`olmax eval tasks` and `olmax verify --tasks` on the command line without the task data at hand:
a task whose dataset cannot be downloaded (offline, no --data-dir) ends with a message naming the
task and the remedies (exit 2), not a traceback; verify reads users' own task YAMLs through
--include-path, as `eval tasks` does."""

import jax
import numpy as np
import pytest
from models import tiny_eval_model
from typer.testing import CliRunner

from olmax.checkpoint.store import save_params
from olmax.cli.common import app
from olmax.model.olmo3 import init_params

pytest.importorskip("lm_eval")

CFG = tiny_eval_model(n_layers=1, max_position=16)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return str(
        save_params(
            tmp_path_factory.mktemp("tasks") / "ckpt",
            jax.jit(init_params, static_argnums=0)(CFG, jax.random.key(0)),
            CFG,
            {},
        )
    )


@pytest.fixture
def offline(monkeypatch):
    """No network, and `datasets` told so: it fails at once instead of after its retries."""
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.mark.slow  # the default suite's 10 minutes (docs/testing.md)
def test_unreachable_task_data_is_a_clear_error(ckpt, offline):
    r = CliRunner().invoke(app, ["eval", "tasks", "--ckpt", ckpt, "--tasks", "arc_easy", "--limit", "2"])
    assert r.exit_code == 2, r.output
    assert "eval error: task arc_easy: its data could not be downloaded" in r.output
    assert "--data-dir" in r.output and "--include-path" in r.output
    assert "Traceback" not in r.output


@pytest.mark.slow  # ~12 s on 2 cores: two verify runs
def test_verify_looks_in_include_path(ckpt, tmp_path):
    own = tmp_path / "own_tasks"
    own.mkdir()
    shard = tmp_path / "000000.npy"
    np.random.default_rng(0).integers(0, 5000, 8 * 16).astype(np.uint32).tofile(shard)
    r = CliRunner().invoke(
        app,
        [
            *("verify", "--a", f"{ckpt}/0", "--b", f"{ckpt}/0", "--out", str(tmp_path / "v")),
            *("--data", str(shard), "--work-dir", str(tmp_path / "cache"), "--batch", "2", "--max-batches", "1"),
            *("--tasks", "no_such_task", "--include-path", str(own)),
        ],
    )
    assert r.exit_code == 2, r.output
    assert f"unknown lm-eval task(s) no_such_task (also looked in {own})" in r.output
