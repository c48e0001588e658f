"""The sequence length every eval command scores at: unless --seq-len, --recipe/--config or an
override sets it, the data.seq_len the checkpoint was trained at (its `experiment` item), else the
model's max_position (a converted checkpoint); a length above max_position is refused (exit 2)."""

import json

import jax
import numpy as np
import pytest
from models import tiny_eval_model
from typer.testing import CliRunner

from olmax.checkpoint.store import RunCheckpoints, save_params
from olmax.cli.common import app
from olmax.config.checkpoint import CheckpointConfig
from olmax.config.data import DataConfig
from olmax.config.experiment import ExperimentConfig
from olmax.config.mesh import MeshConfig
from olmax.evals.scoring import eval_seq_len, trained_seq_len
from olmax.evals.verify import verify
from olmax.model.olmo3 import init_params
from olmax.model.sharding import make_mesh
from olmax.step.state import init_train_state

CFG = tiny_eval_model(max_position=64)
TRAINED = 32  # the run's data.seq_len: neither the config default (8192) nor max_position


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("seqlen")
    exp = ExperimentConfig(model=CFG, data=DataConfig(seq_len=TRAINED), checkpoint=CheckpointConfig(keep=5))
    mesh = make_mesh(MeshConfig(data=1, fsdp=-1, tensor=1))
    ckpts = RunCheckpoints(tmp / "run" / "checkpoints", exp)
    state = init_train_state(exp, mesh, jax.random.key(0))
    for step in (10, 20):
        ckpts.save(step, state, {}, mesh)
    ckpts.close()
    converted = save_params(tmp / "converted", jax.jit(init_params, static_argnums=0)(CFG, jax.random.key(0)), CFG, {})
    tokens = np.random.default_rng(0).integers(0, 5000, 16 * 64).astype(np.uint32)
    tokens.tofile(tmp / "000000.npy")
    domains = tmp / "domains.jsonl"
    domains.write_text(json.dumps({"text": "word " * 200}) + "\n")
    return {
        "dir": tmp,
        "run": str(tmp / "run" / "checkpoints"),
        "converted": str(converted),
        "shard": str(tmp / "000000.npy"),
        "domains": str(domains),
        "cache": str(tmp / "cache"),
    }


def test_the_rule(setup):
    assert trained_seq_len(setup["run"], 20) == TRAINED
    assert trained_seq_len(setup["converted"], 0) is None
    assert eval_seq_len(None, setup["run"], 20, CFG) == TRAINED
    assert eval_seq_len(None, setup["converted"], 0, CFG) == CFG.max_position
    assert eval_seq_len(48, setup["run"], 20, CFG) == 48
    with pytest.raises(ValueError, match="sequence length 128 exceeds the max_position 64 of .*converted"):
        eval_seq_len(128, setup["converted"], 0, CFG)


def cli(setup, *args):
    return CliRunner().invoke(app, [*args, "--json", str(setup["dir"] / "out.json")])


def report(setup):
    return json.loads((setup["dir"] / "out.json").read_text())


def test_eval_loss_defaults_to_the_trained_length(setup):
    base = ["eval", "loss", "--ckpt", setup["run"], "--data", setup["shard"], "--work-dir", setup["cache"]]
    r = cli(setup, *base, "--batch", "2", "--max-batches", "1")
    assert r.exit_code == 0, r.output
    assert report(setup)["seq_len"] == TRAINED
    assert report(setup)["results"]["000000"]["tokens"] == 2 * (TRAINED - 1)
    r = cli(setup, *base, "--batch", "2", "--max-batches", "1", "data.seq_len=16")  # an override sets it
    assert r.exit_code == 0, r.output
    assert report(setup)["seq_len"] == 16
    r = cli(setup, *base, "--seq-len", "128")
    assert r.exit_code == 2 and "sequence length 128 exceeds the max_position 64" in r.output


@pytest.mark.slow  # the default suite's 10 minutes (docs/testing.md)
def test_eval_kl_and_domains_default_to_the_trained_length(setup):
    r = cli(
        setup,
        *("eval", "kl", "--ckpt-a", setup["run"], "--ckpt-b", setup["converted"], "--data", setup["shard"]),
        *("--work-dir", setup["cache"], "--batch", "2", "--max-batches", "1"),
    )
    assert r.exit_code == 0, r.output
    assert report(setup)["seq_len"] == TRAINED and report(setup)["tokens"] == 2 * TRAINED
    r = cli(setup, "eval", "domains", "--ckpt", setup["run"], "--data", setup["domains"], "--batch", "2")
    assert r.exit_code == 0, r.output
    assert report(setup)["seq_len"] == TRAINED
    r = cli(setup, "eval", "domains", "--ckpt", setup["run"], "--data", setup["domains"], "--seq-len", "1024")
    assert r.exit_code == 2 and "exceeds the max_position 64" in r.output


@pytest.mark.slow  # verify evaluates through eval loss / kl / domains, whose defaults the default run checks
def test_verify_defaults_to_the_trained_length(setup):
    step = f"{setup['run']}/20"  # one checkpoint on each side: one landmark
    r = verify(
        step,
        step,
        setup["dir"] / "verify",
        data=[setup["shard"]],
        batch=2,
        data_cfg=DataConfig(work_dir=setup["cache"]),
    )
    assert r["seq_len"] == TRAINED and r["instances"] == 8
    r = cli(
        setup,
        *("verify", "--a", setup["run"], "--b", setup["run"], "--out", str(setup["dir"] / "v2")),
        *("--data", setup["shard"], "--work-dir", setup["cache"], "--seq-len", "65"),
    )
    assert r.exit_code == 2 and "sequence length 65 exceeds the max_position 64" in r.output


def test_tasks_context_defaults_to_the_trained_length(setup):
    pytest.importorskip("lm_eval")
    from olmax.evals.lm_eval_adapter import OlmaxLM

    assert OlmaxLM(setup["run"]).max_length == TRAINED
    assert OlmaxLM(setup["converted"]).max_length == CFG.max_position
    with pytest.raises(ValueError, match="exceeds the max_position 64"):
        OlmaxLM(setup["run"], max_length=65)


def test_a_recipe_sets_the_length(setup):
    """--recipe/--config set data.seq_len themselves (here the tiny recipe's 256, above max_position)."""
    r = cli(setup, "eval", "loss", "--ckpt", setup["run"], "--recipe", "tiny", "--data", setup["shard"])
    assert r.exit_code == 2 and "sequence length 256 exceeds the max_position 64" in r.output
