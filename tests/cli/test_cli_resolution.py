"""One config resolution path for the commands that read data (`olmax data order | check`, `olmax eval
loss | kl | domains`, `olmax verify`): --recipe/--config plus dotted overrides, as `olmax train`, with
the old flags as shorthands for single fields."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from models import tiny_eval_model
from typer.testing import CliRunner

from olmax.checkpoint.store import save_params
from olmax.cli.common import app, resolve_experiment
from olmax.config.checkpoint import EvalConfig
from olmax.config.data import DataConfig
from olmax.config.experiment import ExperimentConfig
from olmax.config.io import save_yaml
from olmax.config.trainer import TrainerConfig
from olmax.errors import ConfigError
from olmax.model.olmo3 import init_params

VOCAB, EOS, PAD = 300, 299, 298
MODEL = tiny_eval_model(vocab_size=VOCAB)
SHARDS = ("data/{TOKENIZER}/web/000000.npy", "data/{TOKENIZER}/code/000001.npy")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Two raw token shards under a mix base, a mix file naming them, a tiny checkpoint and an experiment
    YAML whose data reads the mix."""
    tmp = tmp_path_factory.mktemp("resolution")
    base = tmp / "base"
    rng = np.random.default_rng(0)
    shards = []
    for rel in SHARDS:
        path = base / rel.replace("{TOKENIZER}", "allenai/dolma3-tokenizer")
        path.parent.mkdir(parents=True)
        rng.integers(0, PAD, size=16 * 40).astype(np.uint16).tofile(path)
        shards.append(str(path))
    mix = tmp / "mix.txt"
    mix.write_text("".join(f"{name},{rel}\n" for name, rel in zip(("web", "code"), SHARDS)))
    one = tmp / "one.txt"
    one.write_text(f"web,{SHARDS[0]}\n")
    data = DataConfig(
        paths=(str(mix),),
        seq_len=16,
        vocab_size=VOCAB,
        eos_token_id=EOS,
        pad_token_id=PAD,
        mix_base=str(base),
        work_dir=str(tmp / "cache"),
    )
    save_yaml(
        ExperimentConfig(
            model=MODEL, data=data, eval=EvalConfig(data=(str(one),)), trainer=TrainerConfig(global_batch=8)
        ),
        tmp / "exp.yaml",
    )
    save_params(tmp / "ckpt", init_params(MODEL, jax.random.key(0)), MODEL, {"source": "test"})
    return {
        "tmp": tmp,
        "base": str(base),
        "shards": shards,
        "mix": str(mix),
        "one": str(one),
        "config": str(tmp / "exp.yaml"),
        "ckpt": str(tmp / "ckpt"),
        "cache": str(tmp / "cache"),
    }


def run(*args) -> dict:
    """The command's --json report (it must succeed)."""
    out = Path(args[-1])
    result = CliRunner().invoke(app, [str(a) for a in args[:-1]] + ["--json", str(out)])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())


def test_a_mix_file_with_a_base_is_read_by_eval_loss_and_data_order(setup):
    tmp = setup["tmp"]
    # eval loss reads eval.data (the one-shard mix) with the config's mix base, tokenizer and seq_len
    mixed = run(
        "eval",
        "loss",
        "--ckpt",
        setup["ckpt"],
        "--config",
        setup["config"],
        "--batch",
        "4",
        "--max-batches",
        "2",
        tmp / "loss_mix.json",
    )
    direct = run(
        "eval",
        "loss",
        "--ckpt",
        setup["ckpt"],
        "--data",
        setup["shards"][0],
        "--seq-len",
        "16",
        "--work-dir",
        setup["cache"],
        "data.vocab_size=300",
        "data.eos_token_id=299",
        "data.pad_token_id=298",
        "--batch",
        "4",
        "--max-batches",
        "2",
        tmp / "loss_direct.json",
    )
    (a,), (b,) = mixed["results"].values(), direct["results"].values()
    assert a["data"] == setup["one"] and a["tokens"] == b["tokens"] == 2 * 4 * 15
    assert a["CE loss"] == b["CE loss"]

    # data order reads data.paths (the two-shard mix); the same shards given directly order alike
    mixed = run("data", "order", "--config", setup["config"], "--steps", "1:3", tmp / "order_mix.json")
    direct = run(
        "data",
        "order",
        "--paths",
        setup["shards"][0],
        "--paths",
        setup["shards"][1],
        "--seq-len",
        "16",
        "--vocab-size",
        "300",
        "--eos-id",
        "299",
        "--pad-id",
        "298",
        "--global-batch",
        "8",
        "--work-dir",
        setup["cache"],
        "--steps",
        "1:3",
        tmp / "order_direct.json",
    )
    assert mixed["files"] == setup["shards"] and mixed == direct

    # without the base, the mix file is refused by name
    result = CliRunner().invoke(
        app, ["eval", "loss", "--ckpt", setup["ckpt"], "--config", setup["config"], "data.mix_base=null"]
    )
    assert result.exit_code == 2 and f"mix file {setup['one']} needs a base (data.mix_base" in result.output


def test_a_shorthand_flag_and_its_override_resolve_alike(setup):
    flags = {
        "data.paths": ["gs://bucket/x.npy", "demo:heldout"],
        "data.seq_len": 2048,
        "data.work_dir": "/c",
        "trainer.global_batch": 16,
        "data.mix_base": None,
    }
    overrides = [
        "data.paths=[gs://bucket/x.npy, demo:heldout]",
        "data.seq_len=2048",
        "data.work_dir=/c",
        "trainer.global_batch=16",
    ]
    for recipe in (None, "tiny"):
        a = resolve_experiment(recipe, None, [], flags, need_base=False)
        assert a == resolve_experiment(recipe, None, overrides, need_base=False)
        assert a.data.paths == ("gs://bucket/x.npy", "demo:heldout") and a.trainer.global_batch == 16
    assert resolve_experiment(None, None, [], need_base=False) == ExperimentConfig()
    with pytest.raises(ConfigError, match="data.seq_len is given both by its flag and as an override"):
        resolve_experiment("tiny", None, ["data.seq_len=8"], {"data.seq_len": 16})

    # on the command line: the same report
    tmp = setup["tmp"]
    by_flags = run(
        "data",
        "order",
        "--config",
        setup["config"],
        "--seq-len",
        "32",
        "--seed",
        "7",
        "--global-batch",
        "4",
        tmp / "flags.json",
    )
    by_overrides = run(
        "data",
        "order",
        "--config",
        setup["config"],
        "data.seq_len=32",
        "data.seed=7",
        "trainer.global_batch=4",
        tmp / "overrides.json",
    )
    assert by_flags == by_overrides and by_flags["instances"] == 2 * 40 // 2


def test_a_typo_in_an_override_is_an_error_naming_it(setup):
    result = CliRunner().invoke(
        app, ["eval", "loss", "--ckpt", setup["ckpt"], "--config", setup["config"], "data.seq_lne=16"]
    )
    assert result.exit_code == 2 and "Key 'seq_lne' not in 'DataConfig'" in result.output
    # as a user runs it: `olmax` prints the error and exits with status 2
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    proc = subprocess.run(
        [sys.executable, "-m", "olmax.cli", "data", "order", "--config", setup["config"], "data.seq_lne=16"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2 and "config error: Key 'seq_lne' not in 'DataConfig'" in proc.stderr, proc.stderr
