"""Where metrics go beyond metrics.jsonl (whose resume behaviour tests/trainer/test_train.py checks): the W&B
writer (offline, no network) and the plain progress lines of a run without a terminal."""

import pytest
from small_run import small_config

from olmax.config.io import apply_overrides
from olmax.config.recipes import get_recipe
from olmax.errors import ConfigError
from olmax.trainer.metrics import Progress
from olmax.trainer.run import train


@pytest.mark.slow  # ~11 s on 2 cores: two wandb runs
def test_wandb_offline_needs_no_network_and_resumes_the_same_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens: any upload would fail
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = small_config(
        tmp_path, "wandb.mode=offline", "wandb.project=olmax-test", "trainer.max_steps=2", "checkpoint.every=1"
    )
    run = tmp_path / "run"
    train(cfg, run, stop_at=1, progress=False)
    train(cfg, run, progress=False)
    run_id = (run / "wandb_id").read_text().strip()
    attempts = sorted((run / "wandb").glob("offline-run-*"))
    assert len(attempts) == 2 and all(a.name.endswith(f"-{run_id}") for a in attempts)
    logged = (attempts[-1] / f"run-{run_id}.wandb").read_bytes()
    for name in ("train/CE loss", "optim/total grad norm", "throughput/device/TPS"):
        assert name.encode() in logged


def test_wandb_mode_is_checked():
    with pytest.raises(ConfigError, match="wandb.mode='of' is not one of disabled, online, offline"):
        apply_overrides(get_recipe("tiny"), ["wandb.mode=of"])


def test_plain_progress_lines_without_a_terminal(capsys):
    progress = Progress(start=10, last=14, tokens_per_step=1000, every=2, terminal=False)
    for step in range(11, 15):
        progress.update({"step": step, "train/CE loss": 5.0 - step / 10, "optim/LR": 1e-3})
    progress.close()
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" |")[0] for line in lines] == ["step 12/14", "step 14/14"]
    assert "CE loss 3.8000" in lines[0] and "tok/s" in lines[0] and "eta " in lines[0]
    assert lines[1].endswith("eta 0s")
