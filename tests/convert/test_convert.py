"""Checkpoint conversion HF / OLMo-core <-> olmax and the olmax checkpoint format.

The references are transformers' Olmo3ForCausalLM / Olmo3Config and ai2-olmo-core's own HF
converter (olmo_core.nn.hf); tiny random models, built here, stand in for the real checkpoints.
The model builders are in tests/models.py (test_parity.py uses them too). Tests that need torch,
transformers or ai2-olmo-core are marked `parity`.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import replace
from pathlib import Path

import jax
import numpy as np
import pytest
from models import (
    FULL,
    SLIDING,
    make_hf_checkpoint,
    make_hf_config,
    make_olmo_core_model,
    olmax_config_of,
    olmax_layer_types,
    word_tokenizer,
)
from safetensors.numpy import load_file
from typer.testing import CliRunner

from olmax.checkpoint.store import CheckpointError, load_params, read_config, save_params
from olmax.cli.common import app
from olmax.config.mesh import MeshConfig
from olmax.config.model import ModelConfig
from olmax.convert.hf import convert_from_hf, convert_to_hf, hf_config, model_config_from_hf, resolve_hf_dir
from olmax.convert.olmo_core import convert_from_olmo_core
from olmax.convert.tensors import ConversionError
from olmax.model.olmo3 import _is_spec, param_shardings, param_specs
from olmax.model.sharding import make_mesh


def tensors_of(hf_dir: Path) -> dict[str, np.ndarray]:
    out = {}
    for f in sorted(hf_dir.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ----------------------------------------------------------------------------------------------
# config.json -> ModelConfig


@pytest.mark.parity
def test_model_config_from_hf_reads_every_field():
    rope = {
        "rope_type": "yarn",
        "rope_theta": 20000.0,
        "factor": 4.0,
        "beta_fast": 16.0,
        "beta_slow": 2.0,
        "original_max_position_embeddings": 64,
    }
    hf = make_hf_config(
        vocab=1000,
        d_model=96,
        n_layers=10,
        n_heads=6,
        n_kv_heads=2,
        head_dim=20,
        mlp=160,
        window=16,
        rope=rope,
        max_position=256,
    ).to_dict()
    hf["architectures"] = ["Olmo3ForCausalLM"]
    cfg = model_config_from_hf(hf)
    assert (cfg.vocab_size, cfg.padded_vocab_size, cfg.d_model, cfg.n_layers) == (1000, 1024, 96, 10)
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.mlp_hidden) == (6, 2, 20, 160)
    assert (cfg.sliding_window, cfg.global_every, cfg.norm_eps, cfg.max_position) == (16, 4, 1e-6, 256)
    assert [cfg.layer_window(i) for i in range(10)] == [16, 16, 16, None, 16, 16, 16, None, 16, None]
    assert (cfg.rope_type, cfg.rope_theta, cfg.yarn_factor) == ("yarn", 20000.0, 4.0)
    assert (cfg.yarn_beta_fast, cfg.yarn_beta_slow, cfg.yarn_original_max_position) == (16.0, 2.0, 64)
    assert cfg.yarn_layers == "all"


@pytest.mark.parity
def test_legacy_yarn_config_scales_the_full_attention_layers_only():
    # A transformers-4 config.json (flat rope_theta + rope_scaling), as AI2's long-context checkpoints
    # have: Olmo3Config gives the scaling to the full-attention layers only, and so does olmax.
    hf = make_hf_config(n_layers=8).to_dict()
    hf.update(
        architectures=["Olmo3ForCausalLM"],
        rope_parameters=None,
        rope_theta=5e5,
        rope_scaling={"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64},
    )
    cfg = model_config_from_hf(hf)
    assert (cfg.rope_type, cfg.yarn_factor, cfg.yarn_layers, cfg.rope_theta) == ("yarn", 8.0, "global", 5e5)
    assert [cfg.layer_rope_scaled(i) for i in range(8)] == [False, False, False, True] * 2
    written = hf_config(cfg, dtype="float32", special_tokens={})["rope_parameters"]
    assert written[SLIDING] == {"rope_type": "default", "rope_theta": 5e5}
    assert written[FULL]["rope_type"] == "yarn" and written[FULL]["factor"] == 8.0


def test_model_config_from_hf_legacy_and_uniform_patterns():
    # A transformers-4 config (flat rope_theta, no layer_types), as the OLMo 3 hub checkpoints have.
    legacy = {
        "architectures": ["Olmo3ForCausalLM"],
        "model_type": "olmo3",
        "vocab_size": 100278,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 8,
        "num_attention_heads": 4,
        "rope_theta": 500000,
        "rms_norm_eps": 1e-6,
        "sliding_window": 4096,
    }
    cfg = model_config_from_hf(legacy)
    assert (cfg.global_every, cfg.sliding_window, cfg.rope_theta, cfg.n_kv_heads, cfg.head_dim) == (4, 4096, 5e5, 4, 16)
    assert cfg.padded_vocab_size == 100352
    all_full = model_config_from_hf({**legacy, "layer_types": [FULL] * 8})
    assert all(all_full.layer_window(i) is None for i in range(8))
    last_only = model_config_from_hf({**legacy, "num_hidden_layers": 3, "layer_types": [SLIDING, SLIDING, FULL]})
    assert [last_only.layer_window(i) for i in range(3)] == [4096, 4096, None]


@pytest.mark.parity
@pytest.mark.parametrize(
    "change, message",
    [
        ({"architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2"}, "not an OLMo 3 checkpoint"),
        ({"layer_types": [SLIDING, FULL, SLIDING, SLIDING, FULL]}, "not representable"),
        ({"layer_types": [SLIDING] * 5}, "no layer uses full attention"),
        ({"layer_types": [SLIDING] * 4}, "each of the 5 layers"),
        (
            {
                "rope_parameters": {
                    SLIDING: {"rope_type": "default", "rope_theta": 1e4},
                    FULL: {"rope_type": "default", "rope_theta": 5e5},
                }
            },
            "different RoPE",
        ),
        (
            {
                "rope_parameters": {
                    SLIDING: {"rope_type": "yarn", "rope_theta": 1e4, "factor": 8.0},
                    FULL: {"rope_type": "default", "rope_theta": 1e4},
                }
            },
            "different RoPE",
        ),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "keyed by layer type"),
        (
            {
                "rope_parameters": {
                    t: {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0} for t in (SLIDING, FULL)
                }
            },
            "rope_type='llama3'",
        ),
        (
            {
                "rope_parameters": {
                    t: {"rope_type": "yarn", "rope_theta": 1e4, "factor": 8.0, "attention_factor": 1.0}
                    for t in (SLIDING, FULL)
                }
            },
            "attention_factor",
        ),
        ({"tie_word_embeddings": True}, "tie_word_embeddings"),
        ({"attention_bias": True}, "attention_bias"),
        ({"num_attention_heads": 5}, "n_kv_heads"),
    ],
)
def test_model_config_from_hf_rejects_what_olmax_cannot_represent(change, message):
    hf = {**make_hf_config().to_dict(), "architectures": ["Olmo3ForCausalLM"], **change}
    with pytest.raises(ConversionError, match=message):
        model_config_from_hf(hf, where="test")


# ----------------------------------------------------------------------------------------------
# HF -> olmax -> HF


@pytest.mark.parity
def test_round_trip_reproduces_every_tensor_bit_for_bit(tmp_path):
    from transformers import Olmo3Config, Olmo3ForCausalLM

    src = make_hf_checkpoint(tmp_path / "hf", vocab=300, head_dim=24)
    convert_from_hf(str(src), tmp_path / "ckpt")
    convert_to_hf(tmp_path / "ckpt", tmp_path / "back", tokenizer=word_tokenizer(tmp_path))

    original, back = tensors_of(src), tensors_of(tmp_path / "back")
    assert set(back) == set(original)
    for name, tensor in original.items():
        assert back[name].dtype == tensor.dtype and np.array_equal(back[name], tensor), name
    # Same tensors, same metadata: safetensors writes the same bytes.
    assert sha256(tmp_path / "back" / "model.safetensors") == sha256(src / "model.safetensors")

    ignore = {"transformers_version", "_name_or_path"}
    a = {k: v for k, v in Olmo3Config.from_pretrained(src).to_dict().items() if k not in ignore}
    b = {k: v for k, v in Olmo3Config.from_pretrained(tmp_path / "back").to_dict().items() if k not in ignore}
    assert a == b

    _, info = Olmo3ForCausalLM.from_pretrained(tmp_path / "back", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]


@pytest.mark.parity
def test_bfloat16_source_round_trips_in_bfloat16(tmp_path):
    src = make_hf_checkpoint(tmp_path / "hf", dtype="bfloat16")
    convert_from_hf(str(src), tmp_path / "ckpt")
    params, cfg, meta = load_params(tmp_path / "ckpt")
    assert meta["source_dtype"] == "bfloat16" and params["embed"].dtype == np.float32  # fp32 master copy
    convert_to_hf(tmp_path / "ckpt", tmp_path / "back", tokenizer=word_tokenizer(tmp_path))
    assert json.loads((tmp_path / "back" / "config.json").read_text())["dtype"] == "bfloat16"
    assert sha256(tmp_path / "back" / "model.safetensors") == sha256(src / "model.safetensors")


@pytest.mark.parity
def test_sharded_checkpoints_in_and_out(tmp_path):
    from transformers import Olmo3ForCausalLM

    src = make_hf_checkpoint(tmp_path / "hf", max_shard_size="200KB")
    assert (src / "model.safetensors.index.json").is_file()
    convert_from_hf(str(src), tmp_path / "ckpt")
    summary = convert_to_hf(
        tmp_path / "ckpt", tmp_path / "back", tokenizer=word_tokenizer(tmp_path), max_shard_bytes=300_000
    )
    assert len(summary["files"]) > 1
    index = json.loads((tmp_path / "back" / "model.safetensors.index.json").read_text())
    original = tensors_of(src)
    assert set(index["weight_map"]) == set(original)
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in original.values())
    back = tensors_of(tmp_path / "back")
    assert all(np.array_equal(back[n], t) for n, t in original.items())
    _, info = Olmo3ForCausalLM.from_pretrained(tmp_path / "back", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]


@pytest.mark.parametrize("umask,shard_bytes", [(0o022, None), (0o027, 20_000)], ids=["022-one-file", "027-shards"])
def test_hf_export_files_all_get_the_umask_mode(tmp_path, umask, shard_bytes):
    """Every file of an export, the weights included, has the mode a new file gets under the umask
    (safetensors alone would leave the weights at 0600)."""
    cfg = ModelConfig(vocab_size=300, d_model=32, n_layers=2, n_heads=2, n_kv_heads=2, head_dim=16, mlp_hidden=64)
    params = jax.tree.map(lambda s: np.zeros(s.shape, np.float32), param_specs(cfg), is_leaf=_is_spec)
    save_params(tmp_path / "ckpt", params, cfg, {"source": "test"})
    tokenizer = word_tokenizer(tmp_path)
    shards = {} if shard_bytes is None else {"max_shard_bytes": shard_bytes}
    old = os.umask(umask)
    try:
        summary = convert_to_hf(tmp_path / "ckpt", tmp_path / "hf", tokenizer=tokenizer, **shards)
    finally:
        os.umask(old)
    assert (len(summary["files"]) > 1) == (shard_bytes is not None)
    modes = {f.name: oct(stat.S_IMODE(f.stat().st_mode)) for f in (tmp_path / "hf").iterdir()}
    assert set(modes.values()) == {oct(0o666 & ~umask)}, modes
    assert set(summary["files"]) <= set(modes)


@pytest.mark.parity
def test_conversion_pads_the_vocabulary_with_zeros(tmp_path):
    src = make_hf_checkpoint(tmp_path / "hf", vocab=300)
    convert_from_hf(str(src), tmp_path / "ckpt")
    params, cfg, meta = load_params(tmp_path / "ckpt")
    hf = tensors_of(src)
    assert params["embed"].shape == (384, 64) and params["lm_head"].shape == (64, 384)
    np.testing.assert_array_equal(np.asarray(params["embed"][:300]), hf["model.embed_tokens.weight"])
    np.testing.assert_array_equal(np.asarray(params["lm_head"][:, :300]), hf["lm_head.weight"].T)
    assert not np.asarray(params["embed"][300:]).any() and not np.asarray(params["lm_head"][:, 300:]).any()
    np.testing.assert_array_equal(
        np.asarray(params["layers"]["q_proj"][3]), hf["model.layers.3.self_attn.q_proj.weight"].T
    )
    np.testing.assert_array_equal(
        np.asarray(params["layers"]["attn_norm"][1]), hf["model.layers.1.post_attention_layernorm.weight"]
    )
    assert meta["source"]["format"] == "hf" and meta["special_tokens"]["eos_token_id"] == 298


@pytest.mark.parity
def test_hf_input_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConversionError, match="no config.json"):
        convert_from_hf(str(tmp_path / "empty"), tmp_path / "o1")
    src = make_hf_checkpoint(tmp_path / "hf")
    (src / "model.safetensors").unlink()
    with pytest.raises(ConversionError, match="neither model.safetensors"):
        convert_from_hf(str(src), tmp_path / "o2")
    with pytest.raises(ConversionError, match="--revision applies to a hub id"):
        resolve_hf_dir(str(src), revision="main")
    with pytest.raises(ConversionError, match="neither an existing directory nor a hub id"):
        resolve_hf_dir(str(tmp_path / "a" / "b" / "c"))


@pytest.mark.parity
def test_hf_tensor_mismatches_are_named(tmp_path):
    src = make_hf_checkpoint(tmp_path / "hf", n_layers=5)
    config = json.loads((src / "config.json").read_text())
    config.update(num_hidden_layers=4, layer_types=olmax_layer_types(4))
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConversionError, match=r"11 unexpected tensors: model\.layers\.4\."):
        convert_from_hf(str(src), tmp_path / "o1")
    config.update(num_hidden_layers=5, layer_types=olmax_layer_types(5), intermediate_size=128)
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ConversionError, match=r"gate_proj.weight has shape \(96, 64\), the model config needs \(128, 64\)"
    ):
        convert_from_hf(str(src), tmp_path / "o2")


def test_hub_id_offline_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ConversionError, match="cannot download allenai/no-such-model"):
        resolve_hf_dir("allenai/no-such-model", revision="stage1-step0")


@pytest.mark.parity
def test_output_must_be_new_or_empty(tmp_path):
    src = make_hf_checkpoint(tmp_path / "hf")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "file").write_text("x")
    with pytest.raises(ConversionError, match="not an empty directory"):
        convert_from_hf(str(src), tmp_path / "used")
    convert_from_hf(str(src), tmp_path / "ckpt")
    with pytest.raises(ConversionError, match="not an empty directory"):
        convert_to_hf(tmp_path / "ckpt", src, tokenizer=word_tokenizer(tmp_path))


# ----------------------------------------------------------------------------------------------
# OLMo-core -> olmax


@pytest.mark.parity
@pytest.mark.parametrize("container", ["model.pt", "model.safetensors", "distributed"])
def test_olmo_core_reader_matches_olmo_cores_own_hf_converter(tmp_path, container):
    """Our reader of OLMo-core names against OLMo-core's own converter to HF names, read by our HF
    reader: both must give the same olmax parameters (padded vocabulary kept: 384 rows)."""
    import torch
    from olmo_core.nn.hf import convert_state_to_hf, get_hf_config
    from safetensors.torch import save_file
    from transformers import Olmo3ForCausalLM

    model = make_olmo_core_model(vocab=384, theta=500000)  # 500000: see docs/conversion.md on rope_theta
    state = model.state_dict()
    path = tmp_path / container
    if container == "model.pt":
        torch.save(state, path)
    elif container == "model.safetensors":
        save_file({k: v.contiguous() for k, v in state.items()}, path)
    else:
        from olmo_core.distributed.checkpoint import save_model_and_optim_state

        save_model_and_optim_state(path, model)
    cfg = olmax_config_of(model, vocab_size=384, sliding_window=8, rope_theta=500000.0)
    convert_from_olmo_core(path, cfg, tmp_path / "ours")

    hf_config = get_hf_config(model)
    hf_config.architectures = ["Olmo3ForCausalLM"]
    hf_model = Olmo3ForCausalLM(hf_config)
    hf_model.load_state_dict(convert_state_to_hf(hf_config, state))
    hf_model.save_pretrained(tmp_path / "hf")
    convert_from_hf(str(tmp_path / "hf"), tmp_path / "via_hf")

    ours, our_cfg, meta = load_params(tmp_path / "ours")
    theirs, their_cfg, _ = load_params(tmp_path / "via_hf")
    assert meta["source"]["format"] == "olmo_core" and meta["source_dtype"] == "float32"
    assert replace(their_cfg, max_position=cfg.max_position) == cfg
    for (path_, a), b in zip(jax.tree_util.tree_leaves_with_path(ours), jax.tree.leaves(theirs)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=jax.tree_util.keystr(path_))


@pytest.mark.parity
def test_olmo_core_vocabulary_rows_are_checked(tmp_path):
    import torch

    model = make_olmo_core_model(vocab=384)
    torch.save(model.state_dict(), tmp_path / "model.pt")
    ok = olmax_config_of(model, vocab_size=300, sliding_window=8, rope_theta=1e4)  # 384 = padded(300): kept
    convert_from_olmo_core(tmp_path / "model.pt", ok, tmp_path / "ok")
    bad = replace(ok, vocab_size=500)
    with pytest.raises(ConversionError, match="embeddings.weight has 384 rows; .* needs 500 or 512"):
        convert_from_olmo_core(tmp_path / "model.pt", bad, tmp_path / "bad")
    with pytest.raises(ConversionError, match="does not exist"):
        convert_from_olmo_core(tmp_path / "nothing.pt", ok, tmp_path / "none")


# ----------------------------------------------------------------------------------------------
# The checkpoint format


@pytest.mark.parity
def test_load_params_onto_a_mesh(tmp_path):
    src = make_hf_checkpoint(tmp_path / "hf", vocab=300, n_kv_heads=4, mlp=128)
    convert_from_hf(str(src), tmp_path / "ckpt")
    cfg, meta = read_config(tmp_path / "ckpt")
    mesh = make_mesh(MeshConfig(data=1, fsdp=4, tensor=2))
    shardings = param_shardings(cfg, mesh)
    params, cfg2, meta2 = load_params(tmp_path / "ckpt", shardings=shardings)
    assert cfg2 == cfg and meta2 == meta and meta["olmax_version"]
    q = params["layers"]["q_proj"]
    assert q.sharding == shardings["layers"]["q_proj"] and len(q.sharding.device_set) == 8
    plain, _, _ = load_params(tmp_path / "ckpt")
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(plain)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_checkpoint_errors(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_params(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        load_params(tmp_path / "empty")

    cfg = ModelConfig(vocab_size=200, d_model=32, n_layers=2, n_heads=2, n_kv_heads=2, head_dim=16, mlp_hidden=64)
    params = jax.tree.map(lambda s: np.zeros(s.shape, np.float32), param_specs(cfg), is_leaf=_is_spec)
    save_params(tmp_path / "ck", params, cfg, {"source": "test"})
    with pytest.raises(CheckpointError, match="already has a checkpoint at step 0"):
        save_params(tmp_path / "ck", params, cfg, {})
    with pytest.raises(CheckpointError, match="no checkpoint at step 7; it has steps \\[0\\]"):
        load_params(tmp_path / "ck", step=7)
    with pytest.raises(CheckpointError, match=r"\['lm_head'\]: shape \(32, 200\), config says \(32, 256\)"):
        save_params(tmp_path / "other", {**params, "lm_head": np.zeros((32, 200), np.float32)}, cfg, {})

    # A config that no longer matches the stored arrays (a corrupt or hand-edited checkpoint).
    config_file = next((tmp_path / "ck" / "0" / "config").glob("*"))
    stored = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**stored, "mlp_hidden": 96}))
    with pytest.raises(
        CheckpointError, match=r"\['layers'\]\['gate_proj'\]: shape \(2, 32, 64\), config says \(2, 32, 96\)"
    ):
        load_params(tmp_path / "ck")
    config_file.write_text(json.dumps({**stored, "attention": "flash"}))
    with pytest.raises(CheckpointError, match="model config stored in .* is invalid"):
        load_params(tmp_path / "ck")


# ----------------------------------------------------------------------------------------------
# CLI


@pytest.mark.parity
def test_cli_convert_both_ways(tmp_path):
    src = make_hf_checkpoint(tmp_path / "hf")
    runner = CliRunner()
    result = runner.invoke(
        app, ["convert", "--from-hf", str(src), "--out", str(tmp_path / "ckpt"), "--json", str(tmp_path / "in.json")]
    )
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "in.json").read_text())["source_dtype"] == "float32"
    result = runner.invoke(
        app,
        [
            "convert",
            "--to-hf",
            str(tmp_path / "ckpt"),
            "--out",
            str(tmp_path / "back"),
            "--dtype",
            "bfloat16",
            "--tokenizer",
            word_tokenizer(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    assert all(t.dtype.name == "bfloat16" for t in tensors_of(tmp_path / "back").values())


@pytest.mark.parity
def test_cli_convert_from_olmo_core_with_a_recipe(tmp_path):
    import torch

    model = make_olmo_core_model(vocab=384, n_layers=4)
    torch.save(model.state_dict(), tmp_path / "model.pt")
    overrides = [
        "model.vocab_size=300",
        "model.d_model=64",
        "model.n_layers=4",
        "model.n_heads=4",
        "model.n_kv_heads=2",
        "model.head_dim=16",
        "model.mlp_hidden=256",
        "model.sliding_window=8",
        "model.rope_theta=10000.0",
    ]
    result = CliRunner().invoke(
        app,
        [
            "convert",
            "--from-olmo-core",
            str(tmp_path / "model.pt"),
            "--recipe",
            "tiny",
            "--out",
            str(tmp_path / "ckpt"),
            *overrides,
        ],
    )
    assert result.exit_code == 0, result.output
    cfg, meta = read_config(tmp_path / "ckpt")
    assert (cfg.vocab_size, cfg.n_layers, cfg.rope_theta) == (300, 4, 1e4)
    assert meta["special_tokens"] == {"eos_token_id": 100257, "pad_token_id": 100277, "bos_token_id": None}


def test_cli_convert_usage_errors(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["convert", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "exactly one of" in result.output
    result = runner.invoke(app, ["convert", "--from-hf", str(tmp_path), "--to-hf", str(tmp_path), "--out", "x"])
    assert result.exit_code == 2 and "exactly one of" in result.output
    result = runner.invoke(app, ["convert", "--from-olmo-core", str(tmp_path), "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "needs --recipe or --config" in result.output
    result = runner.invoke(app, ["convert", "--from-hf", str(tmp_path), "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "conversion error" in result.output and "no config.json" in result.output


@pytest.mark.slow  # ~30 s: 2.3 GB of parameters through Orbax
def test_an_array_over_the_in_flight_bound_round_trips(tmp_path):
    """save_params/load_params bound Orbax's bytes in flight to 1 GB, which Orbax enforces per array:
    a larger array (here a 1.13 GB embedding; the 7B's stacked MLP weights are 5.8 GB) must still go."""
    import jax.numpy as jnp

    from olmax.model.olmo3 import abstract_params

    cfg = ModelConfig(
        vocab_size=100278,
        d_model=2816,
        n_layers=1,
        n_heads=22,
        n_kv_heads=22,
        head_dim=128,
        mlp_hidden=256,
        sliding_window=64,
        max_position=128,
    )
    params = jax.tree.map(lambda a: jnp.full(a.shape, 0.5, a.dtype), abstract_params(cfg))
    assert params["embed"].nbytes > 1e9
    save_params(tmp_path / "big", params, cfg, {})
    loaded, _, _ = load_params(tmp_path / "big")
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(loaded)):
        assert a.shape == b.shape and float(jnp.sum(b)) == float(jnp.sum(a))
