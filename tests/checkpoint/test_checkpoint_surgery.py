"""Checkpoint surgery: warm-start (stage 2 from stage 1) and inspect, against OLMo-core's semantics."""

import json

import jax
import numpy as np
import pytest
from small_run import small_config
from typer.testing import CliRunner

from olmax.checkpoint.store import CheckpointError, load_params
from olmax.checkpoint.surgery import inspect, restore_state, warm_start
from olmax.cli.common import app
from olmax.errors import ConfigError
from olmax.trainer.run import train

KEYS = ["train/CE loss", "optim/total grad norm", "optim/LR", "data/instances"]


@pytest.mark.parity
def test_olmo_core_keeps_the_bias_correction_counter_with_the_moments():
    """The fact warm-start follows: OLMo-core's AdamW stores its step counter per parameter inside the
    optimizer state, so loading stage-1 optimizer state into a fresh stage-2 optimizer restores it."""
    import torch
    from olmo_core.optim.adamw import SkipStepAdamW

    p = torch.nn.Parameter(torch.ones(4))
    stage1 = SkipStepAdamW([p], lr=1e-2)
    for i in range(3):
        p.grad = torch.full((4,), 0.1 * (i + 1))
        stage1.latest_loss, stage1.latest_grad_norm = torch.tensor(1.0), torch.tensor(1.0)
        stage1.step()
    stage2 = SkipStepAdamW([p], lr=1e-2)
    stage2.load_state_dict(stage1.state_dict())
    assert float(stage2.state[p]["step"]) == 3.0
    assert torch.equal(stage2.state[p]["exp_avg"], stage1.state[p]["exp_avg"])


@pytest.fixture(scope="module")
def stage1(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("surgery")
    cfg = small_config(tmp)
    straight = train(cfg, tmp / "straight", progress=False)
    train(cfg, tmp / "s1", stop_at=3, progress=False)
    train(small_config(tmp, "trainer.max_steps=2"), tmp / "fresh2", progress=False)  # a stage 2 from scratch
    return tmp, straight


@pytest.mark.slow  # the module fixture trains three short runs (~1 min on 2 cores)
def test_warm_start_without_reset_continues_the_run_exactly(stage1):
    tmp, straight = stage1
    warm_start(tmp / "s1" / "checkpoints", tmp / "ws_keep", keep=("params", "moments"), reset_step=False)
    rows = train(small_config(tmp, f"checkpoint.init_from={tmp / 'ws_keep'}"), tmp / "cont", progress=False)
    assert [r["step"] for r in rows] == [4, 5, 6]
    for a, b in zip(straight[3:], rows):
        assert {k: a[k] for k in KEYS} == {k: b[k] for k in KEYS}


@pytest.mark.slow  # the module fixture trains three short runs (~1 min on 2 cores)
def test_warm_start_stage2_resets_step_schedule_window_keeps_moments(stage1):
    tmp, _ = stage1
    src = tmp / "s1" / "checkpoints"
    result = CliRunner().invoke(
        app,
        [
            "ckpt",
            "warm-start",
            str(src),
            str(tmp / "ws"),
            "--keep",
            "params,moments",
            "--reset-step",
            "--json",
            str(tmp / "ws.json"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads((tmp / "ws.json").read_text())["adam_count"] == 3
    r = inspect(tmp / "ws")
    assert r["step"] == 0 and r["tokens_seen"] == 0 and r["data"] is None
    assert r["meta"]["warm_start"]["from_step"] == 3
    src_report = inspect(src)
    assert r["params"] == src_report["params"] and r["opt_state"] == src_report["opt_state"]  # shapes, dtypes

    fresh = [json.loads(line) for line in (tmp / "fresh2" / "metrics.jsonl").read_text().splitlines()]
    stage2 = train(
        small_config(tmp, "trainer.max_steps=2", f"checkpoint.init_from={tmp / 'ws'}"), tmp / "s2", progress=False
    )
    assert [r["step"] for r in stage2] == [1, 2]
    assert [r["optim/LR"] for r in stage2] == [r["optim/LR"] for r in fresh]  # the schedule restarted
    assert stage2[0]["data/instances"] == fresh[0]["data/instances"]  # the data from its start
    p1, _, _ = load_params(src)
    s2 = restore_state(
        tmp / "s2" / "checkpoints", 2, small_config(tmp, "trainer.max_steps=2", f"checkpoint.init_from={tmp / 'ws'}")
    )
    assert int(s2.step) == 2 and int(s2.opt_state.adam.count) == 5  # bias correction continued from 3
    assert int(s2.opt_state.window.seen) == 2  # the window was emptied at the warm start
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(s2.params)))


@pytest.mark.slow  # the module fixture trains three short runs (~1 min on 2 cores)
def test_warm_start_params_only_gives_a_fresh_optimizer(stage1):
    tmp, _ = stage1
    summary = warm_start(tmp / "s1" / "checkpoints", tmp / "ws_params", keep=("params",), reset_step=True)
    assert summary["adam_count"] == 0
    with pytest.raises(ConfigError, match="keep must list params"):
        warm_start(tmp / "s1" / "checkpoints", tmp / "ws_bad", keep=("moments",))
    with pytest.raises(CheckpointError, match="is not empty"):
        warm_start(tmp / "s1" / "checkpoints", tmp / "ws_params")


@pytest.mark.slow  # the module fixture trains three short runs (~1 min on 2 cores)
def test_inspect_diffs_configs(stage1, tmp_path):
    tmp, _ = stage1
    result = CliRunner().invoke(
        app,
        [
            "ckpt",
            "inspect",
            str(tmp / "straight" / "checkpoints"),
            "--against",
            str(tmp / "s1" / "checkpoints"),
            "--json",
            str(tmp_path / "i.json"),
        ],
    )
    assert result.exit_code == 0, result.output
    r = json.loads((tmp_path / "i.json").read_text())
    assert r["step"] == 6 and r["steps"] == [3, 6] and r["tokens_seen"] == 6 * 8 * 64
    assert r["params"]["['embed']"]["dtype"] == "float32"
    assert r["data"] is not None
    assert r["config_diff"] == {}  # the same run
    r2 = inspect(tmp / "straight" / "checkpoints", against=tmp / "fresh2" / "checkpoints")
    assert r2["config_diff"] == {"trainer.max_steps": [6, 2]}
    assert "step 6" in result.output and "tokens seen 3072" in result.output
