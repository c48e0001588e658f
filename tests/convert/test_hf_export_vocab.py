"""HF exports of models whose vocabulary is not dolma2's (`olmax convert --to-hf --tokenizer none`):
a model trained with its own vocabulary, or a random-init experiment, leaves olmax as config, weights
and generation config, with no tokenizer files. The reference is transformers' Olmo3ForCausalLM: an
HF -> olmax -> HF round trip of vocabularies that are not a multiple of olmax's padding gives back
its logits; the default dolma2 tokenizer is still refused for such a model, with a hint to the way out."""

import json
from dataclasses import replace

import jax
import numpy as np
import pytest
from models import make_hf_checkpoint, small_model, word_tokenizer
from safetensors.numpy import load_file
from typer.testing import CliRunner

from olmax.checkpoint.store import load_params, save_params
from olmax.cli.common import app
from olmax.model.olmo3 import init_params

# What `--tokenizer none` writes: no tokenizer.json, tokenizer_config.json or special_tokens_map.json.
WEIGHTS_ONLY = {"config.json", "model.safetensors", "generation_config.json"}
DOLMA2_IDS = {"eos_token_id": 100257, "pad_token_id": 100277, "bos_token_id": None}


def convert(*args: str):
    return CliRunner().invoke(app, ["convert", *args])


def small_checkpoint(path, vocab_size: int, special_tokens: dict):
    cfg = small_model(vocab_size=vocab_size, max_position=128)
    params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.key(0))
    save_params(path, params, cfg, {"source": "test", "special_tokens": special_tokens})
    return params


@pytest.mark.parity
@pytest.mark.parametrize("vocab", [1000, 50, 257])  # padded to 1024, 128, 384: none a multiple of 128
def test_round_trip_without_a_tokenizer_gives_back_the_logits(tmp_path, vocab):
    import torch
    from transformers import Olmo3Config, Olmo3ForCausalLM

    from olmax.model.olmo3 import forward

    # head_dim given, as the export writes it explicitly (so that the two configs compare equal)
    src = make_hf_checkpoint(tmp_path / "hf", vocab=vocab, n_layers=3, head_dim=16, seed=vocab)
    ckpt, back_dir, report_file = tmp_path / "ckpt", tmp_path / "back", tmp_path / "report.json"
    assert convert("--from-hf", str(src), "--out", str(ckpt)).exit_code == 0
    result = convert("--to-hf", str(ckpt), "--out", str(back_dir), "--tokenizer", "none", "--json", str(report_file))
    assert result.exit_code == 0, result.output
    assert "no tokenizer files written (--tokenizer none)" in result.output
    report = json.loads(report_file.read_text())
    assert report["tokenizer"] == "none" and report["tokenizer_files"] == []
    assert "no tokenizer files written" in report["note"] and "left out" not in report["note"]

    assert {p.name for p in back_dir.iterdir()} == WEIGHTS_ONLY
    # The special ids come from the checkpoint, which recorded the source's config.json.
    ids = {"eos_token_id": vocab - 2, "pad_token_id": vocab - 1, "bos_token_id": None}
    assert json.loads((back_dir / "generation_config.json").read_text()) == ids
    assert report["special_tokens"] == ids
    ignore = {"transformers_version", "_name_or_path"}
    original_cfg, back_cfg = (
        {k: v for k, v in Olmo3Config.from_pretrained(d).to_dict().items() if k not in ignore} for d in (src, back_dir)
    )
    assert back_cfg == original_cfg and back_cfg["vocab_size"] == vocab

    original = Olmo3ForCausalLM.from_pretrained(src).eval()
    back, info = Olmo3ForCausalLM.from_pretrained(back_dir, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert (back.generation_config.eos_token_id, back.generation_config.pad_token_id) == (vocab - 2, vocab - 1)
    tokens = np.random.default_rng(vocab).integers(0, vocab, (2, 40))
    tokens[0, :2] = vocab - 1, 0  # the first and the last id of the vocabulary
    with torch.no_grad():
        expected = original(torch.from_numpy(tokens)).logits.numpy()
        got = back.eval()(torch.from_numpy(tokens)).logits.numpy()
    assert got.shape == expected.shape == (2, 40, vocab)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)

    # And olmax in between: the same logits over the real vocabulary, exactly 0 over its padding.
    params, cfg, _ = load_params(ckpt)
    mine = np.asarray(forward(params, tokens.astype(np.int32), replace(cfg, compute_dtype="float32")))
    assert mine.shape == (2, 40, cfg.padded_vocab_size) and not mine[..., vocab:].any()
    np.testing.assert_allclose(mine[..., :vocab], expected, atol=2e-4, rtol=1e-4)


def test_export_without_a_tokenizer_leaves_out_ids_outside_the_vocabulary(tmp_path):
    """A random-init experiment with a tiny vocabulary, its checkpoint recording dolma2's ids (as an
    OLMo-core conversion with a dolma2 recipe does): the weights go out, the ids that are not tokens
    of the model do not, and the report says which."""
    ckpt, out, report_file = tmp_path / "ckpt", tmp_path / "hf", tmp_path / "report.json"
    params = small_checkpoint(ckpt, 1000, DOLMA2_IDS)
    result = convert("--to-hf", str(ckpt), "--out", str(out), "--tokenizer", "none", "--json", str(report_file))
    assert result.exit_code == 0, result.output
    report = json.loads(report_file.read_text())
    assert report["tokenizer"] == "none" and report["tokenizer_files"] == []
    assert report["special_tokens"] == {"eos_token_id": None, "pad_token_id": None, "bos_token_id": None}
    left_out = "left out, outside the 1000-token vocabulary: eos_token_id=100257, pad_token_id=100277"
    assert left_out in report["note"] and left_out in result.output
    assert {p.name for p in out.iterdir()} == WEIGHTS_ONLY
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen == {"eos_token_id": None, "pad_token_id": None, "bos_token_id": None}
    config = json.loads((out / "config.json").read_text())
    assert config["vocab_size"] == 1000 and config["eos_token_id"] is None and config["pad_token_id"] is None
    tensors = load_file(out / "model.safetensors")
    np.testing.assert_array_equal(tensors["model.embed_tokens.weight"], np.asarray(params["embed"])[:1000])
    np.testing.assert_array_equal(tensors["lm_head.weight"], np.asarray(params["lm_head"])[:, :1000].T)


@pytest.mark.parity
def test_transformers_loads_and_generates_from_an_export_with_no_special_ids(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    small_checkpoint(tmp_path / "ckpt", 1000, {})  # a training run's checkpoint records no special ids
    result = convert("--to-hf", str(tmp_path / "ckpt"), "--out", str(tmp_path / "hf"), "--tokenizer", "none")
    assert result.exit_code == 0, result.output
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", local_files_only=True)
    assert type(model).__name__ == "Olmo3ForCausalLM" and model.generation_config.eos_token_id is None
    with torch.no_grad():  # no EOS to stop at: generation runs to max_new_tokens
        out = model.generate(torch.tensor([[1, 2, 999]]), max_new_tokens=5, do_sample=False)
    assert out.shape == (1, 8) and int(out.max()) < 1000


def test_a_mismatching_tokenizer_is_refused_with_the_way_out(tmp_path):
    small_checkpoint(tmp_path / "ckpt", 1000, DOLMA2_IDS)
    result = convert("--to-hf", str(tmp_path / "ckpt"), "--out", str(tmp_path / "hf"))  # dolma2, the default
    assert result.exit_code == 2, result.output
    assert "conversion error: tokenizer dolma2 has 100278 tokens but the model's vocabulary has 1000" in result.output
    assert "--tokenizer FILE" in result.output and "--tokenizer none" in result.output
    assert not (tmp_path / "hf").exists()  # refused before the weights are read or anything is written

    # A tokenizer that fits the vocabulary but not the ids the checkpoint records: the same way out.
    result = convert(
        "--to-hf", str(tmp_path / "ckpt"), "--out", str(tmp_path / "hf"), "--tokenizer", word_tokenizer(tmp_path, 1000)
    )
    assert result.exit_code == 2, result.output
    assert "records eos_token_id=100257 but tokenizer" in result.output and "--tokenizer none" in result.output
    assert not (tmp_path / "hf").exists()
