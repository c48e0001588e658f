"""The complete HF export (`olmax convert --to-hf`): weights, config, the tokenizer and the generation
config load with transformers' AutoTokenizer / AutoModelForCausalLM from the directory alone, offline;
the exported dolma2 tokenizer is AI2's tokenizer file, field for field (against a digest of that file
shipped in tests/fixtures), and gives olmax's ids on real text; `olmax generate` equals transformers'
`generate` on the export."""

import gzip
import hashlib
import json
from pathlib import Path

import jax
import numpy as np
import pytest
from models import numpy_params, small_model
from typer.testing import CliRunner

from olmax.checkpoint.store import save_params
from olmax.cli.common import app
from olmax.config.model import ModelConfig
from olmax.convert.hf import convert_to_hf
from olmax.convert.tensors import ConversionError
from olmax.data.tokenizer import Dolma2Tokenizer
from olmax.model.olmo3 import init_params

# AI2's dolma2 tokenizer file (allenai_dolma2.json, 2.7 MB) with its vocabulary and merges replaced by
# their digests (`summarised`); tests/fixtures/README.md says where the file comes from.
DOLMA2_SUMMARY = Path(__file__).resolve().parents[1] / "fixtures" / "allenai_dolma2.summary.json"
DEMO_HELDOUT = Path(__file__).resolve().parents[2] / "src" / "olmax" / "data" / "demo" / "heldout.jsonl.gz"
CFG = small_model(n_layers=3, max_position=128, compute_dtype="float32")
DOLMA2 = {"eos_token_id": 100257, "pad_token_id": 100277, "bos_token_id": None}


def real_texts(n: int) -> list[str]:
    with gzip.open(DEMO_HELDOUT, "rt") as f:
        return [json.loads(line)["text"] for _, line in zip(range(n), f)]


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    params = numpy_params(CFG, 0, std=0.02)
    params["lm_head"] *= 50  # a clear argmax: greedy decoding is not decided by ties
    save_params(tmp / "ckpt", params, CFG, {"source": "test", "special_tokens": DOLMA2})
    summary = convert_to_hf(tmp / "ckpt", tmp / "hf", dtype="float32")
    return tmp, summary


def summarised(tokenizer_json: dict) -> dict:
    """A tokenizer.json with `model.vocab` and `model.merges` replaced by their sizes and the sha256 of
    their JSON (the vocabulary as [token, id] pairs in id order): equal summaries mean equal files."""
    digest = lambda x: hashlib.sha256(json.dumps(x, ensure_ascii=False).encode()).hexdigest()
    model = dict(tokenizer_json["model"])
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    model["vocab"] = {"entries": len(vocab), "sha256": digest(vocab)}
    model["merges"] = {"entries": len(model["merges"]), "sha256": digest(model["merges"])}
    return {**tokenizer_json, "model": model}


def test_rebuilt_dolma2_tokenizer_is_ai2s_file(dolma2_json):
    ours, ai2 = summarised(json.loads(dolma2_json.read_text())), json.loads(DOLMA2_SUMMARY.read_text())
    for field in ai2:  # field by field, so that a difference is named
        assert ours[field] == ai2[field], field
    assert ours == ai2


def test_the_export_is_complete(export):
    tmp, summary = export
    names = {p.name for p in (tmp / "hf").iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "generation_config.json",
    } <= names and summary["tokenizer"] == "dolma2"
    tok_cfg = json.loads((tmp / "hf" / "tokenizer_config.json").read_text())
    assert tok_cfg["eos_token"] == "<|endoftext|>" and tok_cfg["pad_token"] == "<|pad|>"
    assert tok_cfg["bos_token"] is None and tok_cfg["model_max_length"] == CFG.max_position
    gen = json.loads((tmp / "hf" / "generation_config.json").read_text())
    assert (gen["eos_token_id"], gen["pad_token_id"]) == (100257, 100277)


@pytest.mark.parity
def test_transformers_loads_the_export_offline(export):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from olmax.model.olmo3 import forward

    tmp, _ = export
    tok = AutoTokenizer.from_pretrained(tmp / "hf", local_files_only=True)
    assert (tok.eos_token_id, tok.pad_token_id, tok.bos_token) == (100257, 100277, None)
    assert tok.model_max_length == CFG.max_position
    ours = Dolma2Tokenizer()
    texts = real_texts(40) + ["Tabs\tand  spaces,\n\nnumbers 12345, <|endoftext|> ü 日本語 'll 've"]
    for text in texts:
        ids = tok(text)["input_ids"]
        assert ids == ours.encode(text)  # no BOS or EOS added, the added tokens matched literally
        assert tok.decode(ids) == text
    model = AutoModelForCausalLM.from_pretrained(tmp / "hf", local_files_only=True)
    assert type(model).__name__ == "Olmo3ForCausalLM"
    assert model.generation_config.eos_token_id == 100257 and model.generation_config.pad_token_id == 100277
    ids = np.asarray([ours.encode(texts[0])[:48]], np.int32)
    with torch.no_grad():
        theirs = model(torch.from_numpy(ids).long()).logits.numpy()
    from olmax.checkpoint.store import load_params

    params, cfg, _ = load_params(tmp / "ckpt")
    mine = np.asarray(jax.jit(forward, static_argnums=2)(params, ids, cfg))[..., : cfg.vocab_size]  # one compile
    np.testing.assert_allclose(mine, theirs, atol=2e-4, rtol=1e-4)


@pytest.mark.parity
def test_olmax_generate_equals_transformers_generate(export, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp, _ = export
    prompts = ["The", "And Abram went up out of Egypt, he, and his wife", "In the beginning God created"]
    result = CliRunner().invoke(
        app,
        [
            "generate",
            "--ckpt",
            str(tmp / "ckpt"),
            *[a for p in prompts for a in ("--prompt", p)],
            "--max-new-tokens",
            "20",
            "--json",
            str(tmp_path / "gen.json"),
        ],
    )
    assert result.exit_code == 0, result.output
    ours = json.loads((tmp_path / "gen.json").read_text())["results"]
    tok = AutoTokenizer.from_pretrained(tmp / "hf", local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(tmp / "hf", local_files_only=True)
    for prompt, row in zip(prompts, ours):  # transformers one prompt at a time; olmax batched, right-padded
        ids = tok(prompt, return_tensors="pt")["input_ids"]
        assert ids[0].tolist() == row["prompt_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=20, do_sample=False)
        assert out[0, ids.shape[1] :].tolist() == row["ids"], prompt
        assert len(row["ids"]) + len(row["prompt_ids"]) > CFG.sliding_window  # the window is in play
    assert ours[1]["text"] == tok.decode(ours[1]["ids"][:-1] if ours[1]["finish"] == "eos" else ours[1]["ids"])


def test_a_tokenizer_that_does_not_fit_the_model_is_refused(tmp_path):
    from tokenizers import Tokenizer, models

    small = ModelConfig(
        vocab_size=300, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, mlp_hidden=64, sliding_window=8
    )
    save_params(
        tmp_path / "ckpt",
        init_params(small, jax.random.key(0)),
        small,
        {"source": "test", "special_tokens": {"eos_token_id": 298, "pad_token_id": 299, "bos_token_id": None}},
    )
    with pytest.raises(ConversionError, match="100278 tokens but the model's vocabulary has 300"):
        convert_to_hf(tmp_path / "ckpt", tmp_path / "a")  # dolma2 for a 300-token model
    vocab = {f"t{i}": i for i in range(300)} | {"<|endoftext|>": 297, "<|pad|>": 299}
    del vocab["t297"], vocab["t299"]
    Tokenizer(models.WordLevel(vocab, unk_token="t0")).save(str(tmp_path / "tok.json"))
    with pytest.raises(ConversionError, match="eos_token_id=298 but tokenizer .*tok.json has 297"):
        convert_to_hf(tmp_path / "ckpt", tmp_path / "b", tokenizer=str(tmp_path / "tok.json"))
    with pytest.raises(ConversionError, match="missing.json"):
        convert_to_hf(tmp_path / "ckpt", tmp_path / "c", tokenizer=str(tmp_path / "missing.json"))
