"""An objective defined outside olmax trains with no edit to olmax: SimPO (Meng et al. 2024, "SimPO: Simple
Preference Optimization with a Reference-Free Reward": -log sigmoid(beta (mean log-prob chosen - mean
log-prob rejected) - gamma), no reference model), in a module of its own, installed as an
`olmax.objectives` entry point of a distribution on sys.path. Its config section comes with it
(`simpo.gamma=...` overrides it, checks run, config.yaml and the checkpoint keep it); the module is
docs/extending.md's example, as the page shows it. The trainer makes
its batches from what it declares (preference pairs without a reference pass), the step, the metrics and
`olmax status` ask it. An unknown objective is an error naming the known ones, never the LM loss."""

import json
import math
import sys

import jax
import pytest
from small_run import SMALL
from test_extending import plugin_example

from olmax.config.experiment import experiment_type
from olmax.config.io import apply_overrides, to_yaml
from olmax.config.objective import plugin
from olmax.config.recipes import get_recipe
from olmax.data.chat_files import tokenize_chat
from olmax.errors import ConfigError
from olmax.objectives.registry import objective_named
from olmax.rundir.progress import read_run_config
from olmax.rundir.report import MetricsReader, run_status
from olmax.trainer.run import train


@pytest.fixture
def simpo(tmp_path, monkeypatch):
    """The plug-in installed: its module and a dist-info declaring it, on sys.path."""
    (tmp_path / "olmax_simpo.py").write_text(plugin_example())  # docs/extending.md's module, as it is
    dist = tmp_path / "olmax_simpo-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: olmax-simpo\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[olmax.objectives]\nsimpo = olmax_simpo:SimPO\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    plugin.cache_clear(), experiment_type.cache_clear()
    yield tmp_path
    plugin.cache_clear(), experiment_type.cache_clear()
    sys.modules.pop("olmax_simpo", None)


def _pairs(tmp_path):
    rows = []
    for i in range(16):
        question = [{"role": "user", "content": f"What is {i} plus {i}?"}]
        rows.append(
            {
                "chosen": question + [{"role": "assistant", "content": f"{2 * i}."}],
                "rejected": question + [{"role": "assistant", "content": f"{i + 1}, I think so."}],
            }
        )
    src = tmp_path / "pairs.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tokenize_chat([src], tmp_path / "pairs", "instruct")
    return tmp_path / "pairs"


def test_a_plugin_objective_trains_with_no_edit_to_olmax(simpo):
    data = _pairs(simpo)
    overrides = SMALL + [
        f"data.work_dir={simpo / 'cache'}",
        f"data.paths=[{data}]",
        "trainer.objective=simpo",
        "simpo.gamma=0.25",
        "trainer.global_batch=4",
        "trainer.max_steps=2",
        "checkpoint.every=1",
        "optimizer.z_loss=0",
        "optimizer.lr=3e-3",
        "eval.every=0",
    ]
    cfg = apply_overrides(get_recipe("tiny"), overrides)
    assert cfg.simpo.gamma == 0.25 and cfg.simpo.beta == 2.0 and cfg.rows_per_step == 8  # two rows a pair
    assert "simpo:\n  beta: 2.0\n  gamma: 0.25" in to_yaml(cfg)
    with pytest.raises(ConfigError, match="simpo.beta must be positive"):
        apply_overrides(cfg, ["simpo.beta=0"])
    with pytest.raises(ConfigError, match="does not take data.packing=obfd"):  # what every objective on pairs refuses
        apply_overrides(cfg, ["data.packing=obfd"])

    run_dir = simpo / "run"
    (run_dir).mkdir()
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    rows = train(cfg, run_dir, devices=jax.devices()[:4], progress=False, stop_at=1)
    # at the random init the chosen and rejected mean log-probs are close: the margin is near -gamma, and
    # the loss, a mean of softplus(-margin), at least softplus of minus the mean margin (Jensen)
    first = rows[0]
    assert first["train/SimPO margin"] == pytest.approx(-0.25, abs=0.3)
    softplus = math.log1p(math.exp(-first["train/SimPO margin"]))
    assert softplus - 1e-6 <= first["train/SimPO loss"] <= softplus + 0.1
    rows += train(read_run_config(str(run_dir)), run_dir, devices=jax.devices()[:4], progress=False)  # resumes
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[-1]["train/SimPO margin"] > rows[0]["train/SimPO margin"]  # it learns to prefer the chosen side
    status = run_status(str(run_dir), MetricsReader(str(run_dir), window=4))
    assert status["loss_name"] == "SimPO loss" and status["loss"] == rows[-1]["train/SimPO loss"]
    assert status["checkpoint"] == 2


def test_unknown_objectives_are_errors_naming_the_known():
    with pytest.raises(ConfigError, match=r"trainer.objective='simpo' is not one of lm, dpo, grpo"):
        apply_overrides(get_recipe("tiny"), ["trainer.objective=simpo"])
    with pytest.raises(ConfigError, match="not one of lm, dpo, grpo"):
        objective_named("dpo2")
