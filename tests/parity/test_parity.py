"""Logit parity of converted checkpoints against the references: transformers' Olmo3ForCausalLM and
ai2-olmo-core's model, on random tiny models and random tokens.

fp32 bounds: kl_mean < 1e-6 and top-1 agreement 1.0 (a correct conversion gives ~1e-12). The per-layer
check must find no divergent layer, and must find the right one when a conversion is wrong.
"""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from models import FULL, SLIDING, make_hf_checkpoint, make_olmo_core_model, olmax_config_of
from typer.testing import CliRunner

from olmax.checkpoint.store import load_params, save_params
from olmax.cli.common import app
from olmax.convert.hf import convert_from_hf
from olmax.convert.olmo_core import convert_from_olmo_core
from olmax.parity.logits import (
    PARITY_BOUNDS,
    ParityBounds,
    compare,
    judge,
    layer_metrics,
    logit_metrics,
    olmax_outputs,
    random_tokens,
    run_hf_parity,
)

pytestmark = pytest.mark.parity

YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "original_max_position_embeddings": 64,
    "attention_factor": 1.1386294361119891,
}

# Each case: the model shape and the (batch, seq_len) it runs on. The window is 8 tokens everywhere,
# so 64-token sequences are 8 windows long. Vocabularies are not multiples of 128 unless said.
CASES = {
    "gqa_odd_head_dim": (dict(vocab=300, d_model=64, n_heads=4, n_kv_heads=2, head_dim=24), (2, 64)),
    "mha_theta_500k": (
        dict(vocab=1000, d_model=64, n_heads=4, n_kv_heads=4, rope={"rope_type": "default", "rope_theta": 500000.0}),
        (2, 48),
    ),
    "mqa_two_groups": (dict(vocab=256, d_model=48, n_layers=8, n_heads=6, n_kv_heads=1, head_dim=8, mlp=64), (1, 64)),
    "all_global_layers": (dict(vocab=200, n_layers=3, layer_types=[FULL] * 3), (2, 32)),
    "yarn": (dict(vocab=300, rope=YARN, max_position=256), (2, 64)),
    "yarn_full_layers_only": (
        dict(vocab=300, max_position=256, rope={SLIDING: {"rope_type": "default", "rope_theta": 10000.0}, FULL: YARN}),
        (2, 64),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_hf_parity_fp32(tmp_path, name):
    shape, (batch, seq_len) = CASES[name]
    src = make_hf_checkpoint(tmp_path / "hf", **shape)
    convert_from_hf(str(src), tmp_path / "ckpt")
    report = run_hf_parity(str(src), str(tmp_path / "ckpt"), dtype="float32", seq_len=seq_len, batch=batch, seed=1)
    assert report["kl_mean"] < 1e-6, report
    assert report["top1_agreement"] == 1.0, report
    assert report["top10_overlap"] >= 0.99, report
    assert report["max_abs_logit_diff"] < 1e-3, report
    assert report["first_divergent_layer"] is None, report["layer_rel_diff"]
    assert report["verdict"] == "PASS" and report["broken"] == [], report


def test_hf_parity_bf16(tmp_path):
    """bfloat16 on both sides: a figure (docs/conversion.md), bounded here only loosely, ~10x above
    what is measured (kl_mean ~5e-4, top-1 ~0.97), so a bf16-only bug (a wrong cast) still fails."""
    src = make_hf_checkpoint(tmp_path / "hf", vocab=300, head_dim=24)
    convert_from_hf(str(src), tmp_path / "ckpt")
    report = run_hf_parity(str(src), str(tmp_path / "ckpt"), dtype="bfloat16", seq_len=64, batch=2)
    assert report["kl_mean"] < 5e-3, report
    assert report["top1_agreement"] > 0.9, report
    assert report["first_divergent_layer"] is None, report["layer_rel_diff"]
    assert report["verdict"] == "PASS" and report["bounds"] == vars(PARITY_BOUNDS["bfloat16"]), report


def test_olmo_core_parity_fp32(tmp_path):
    """ai2-olmo-core's own model, its state dict read by our OLMo-core reader; GQA, 8 windows long,
    theta 1e4, vocabulary 300 padded to 384 as OLMo-core pads it. Compared over the padded logits too."""
    import torch

    model = make_olmo_core_model(vocab=384, n_layers=5, n_heads=4, n_kv_heads=2, window=8, theta=10000)
    torch.save(model.state_dict(), tmp_path / "model.pt")
    cfg = olmax_config_of(model, vocab_size=300, sliding_window=8, rope_theta=1e4, compute_dtype="float32")
    convert_from_olmo_core(tmp_path / "model.pt", cfg, tmp_path / "ckpt")

    tokens = random_tokens(300, 2, 64, seed=3)
    layers: list = []
    hooks = [block.register_forward_hook(lambda _m, _a, out: layers.append(out)) for block in model.blocks.values()]
    with torch.no_grad():
        ref_logits = model(torch.from_numpy(tokens).long()).numpy()
    for hook in hooks:
        hook.remove()
    params, cfg, _ = load_params(tmp_path / "ckpt")
    logits, our_layers = olmax_outputs(params, cfg, tokens)

    report = compare(
        ref_logits,
        logits,
        torch.stack(layers).numpy(),
        our_layers,
        vocab_size=300,
        tolerance=PARITY_BOUNDS["float32"].layer_tol,
    )
    assert report["kl_mean"] < 1e-6 and report["top1_agreement"] == 1.0, report
    assert report["first_divergent_layer"] is None, report["layer_rel_diff"]
    assert np.abs(ref_logits - logits).max() < 1e-3  # the 84 padded logits as well


@pytest.mark.parametrize("broken_layer", [0, 2])
def test_wrong_conversion_is_caught_at_its_layer(tmp_path, broken_layer):
    """Swap the attention and MLP output norms of one layer (the classic reordered-norm mistake): the
    per-layer check must name exactly that layer, and the logits must fail the fp32 bounds."""
    src = make_hf_checkpoint(tmp_path / "hf", vocab=300, n_layers=4)
    convert_from_hf(str(src), tmp_path / "ckpt")
    params, cfg, meta = load_params(tmp_path / "ckpt")
    layers = {k: np.array(v) for k, v in params["layers"].items()}
    layers["attn_norm"][broken_layer], layers["mlp_norm"][broken_layer] = (
        layers["mlp_norm"][broken_layer].copy(),
        layers["attn_norm"][broken_layer].copy(),
    )
    save_params(tmp_path / "broken", {**jax.tree.map(np.asarray, params), "layers": layers}, cfg, meta)

    report = run_hf_parity(str(src), str(tmp_path / "broken"), dtype="float32", seq_len=32, batch=1)
    assert report["first_divergent_layer"] == broken_layer, report["layer_rel_diff"]
    assert all(x < PARITY_BOUNDS["float32"].layer_tol for x in report["layer_rel_diff"][:broken_layer])
    assert report["kl_mean"] > 1e-3
    assert report["verdict"] == "FAIL"
    assert report["broken"][0].startswith("kl_mean") and report["broken"][-1].startswith(f"layer {broken_layer} ")


def test_logit_metrics_by_hand():
    # Token 0: p = (1/4, 3/4) against q = (1/2, 1/2); token 1 identical.
    ref = np.array([[[0.0, np.log(3.0)], [1.0, 2.0]]], np.float32)
    ours = np.array([[[0.0, 0.0], [1.0, 2.0]]], np.float32)
    m = logit_metrics(ref, ours, vocab_size=2)
    kl0 = 0.25 * np.log(0.25 / 0.5) + 0.75 * np.log(0.75 / 0.5)
    assert m["kl_mean"] == pytest.approx(kl0 / 2, rel=1e-6) and m["kl_max"] == pytest.approx(kl0, rel=1e-6)
    assert m["top1_agreement"] == 0.5  # argmax 1 vs 0 (first of a tie), then 1 vs 1
    assert m["max_abs_logit_diff"] == pytest.approx(np.log(3.0), rel=1e-6)


def test_top10_overlap_and_vocab_slicing():
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(1, 3, 50)).astype(np.float32)
    ours = ref.copy()
    ours[..., 40:] = 100.0  # padded ids beyond vocab_size=40: must not count
    assert logit_metrics(ref, ours, vocab_size=40)["top10_overlap"] == 1.0
    top = np.argsort(-ref[0, 0, :40])
    ours[0, 0, top[:3]] = -100.0  # token 0 loses 3 of its top 10
    m = logit_metrics(ref, ours, vocab_size=40)
    assert m["top10_overlap"] == pytest.approx((7 / 10 + 1 + 1) / 3)
    assert m["top1_agreement"] == pytest.approx(2 / 3)


def test_layer_metrics_threshold_and_nan():
    ref = np.ones((3, 2, 4), np.float32)
    ours = ref.copy()
    ours[1] += 1e-3  # relative RMS difference 1e-3
    ours[2] = np.nan
    m = layer_metrics(ref, ours, tolerance=1e-2)
    assert m["first_divergent_layer"] == 2
    assert m["layer_rel_diff"][1] == pytest.approx(1e-3, rel=1e-3)
    assert layer_metrics(ref, ours, tolerance=1e-4)["first_divergent_layer"] == 1


def test_cli_parity_writes_json(tmp_path):
    src = make_hf_checkpoint(tmp_path / "hf", vocab=300, n_layers=4)
    convert_from_hf(str(src), tmp_path / "ckpt")
    out = tmp_path / "parity.json"
    result = CliRunner().invoke(
        app,
        [
            "parity",
            "--hf",
            str(src),
            "--ckpt",
            str(tmp_path / "ckpt"),
            "--seq-len",
            "32",
            "--batch",
            "2",
            "--seed",
            "5",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["kl_mean"] < 1e-6 and report["top1_agreement"] == 1.0
    assert len(report["layer_max_abs_diff"]) == 4 and report["first_divergent_layer"] is None
    assert (report["seq_len"], report["batch"], report["seed"], report["dtype"]) == (32, 2, 5, "float32")
    assert "kl_mean" in result.output
    assert report["verdict"] == "PASS" and report["bounds"] == vars(PARITY_BOUNDS["float32"])
    assert result.stdout.splitlines()[-1] == (
        "verdict: PASS (float32: kl_mean <= 1e-06, top1_agreement >= 0.999, max_abs_logit_diff <= 0.01, "
        "layer_rel_diff <= 0.001)"
    )

    result = CliRunner().invoke(app, ["parity", "--hf", str(src), "--ckpt", str(tmp_path / "ckpt"), "--dtype", "fp8"])
    assert result.exit_code == 2 and "--dtype must be one of" in result.output


def test_parity_refuses_different_architectures(tmp_path):
    a = make_hf_checkpoint(tmp_path / "a", vocab=300)
    b = make_hf_checkpoint(tmp_path / "b", vocab=400)
    convert_from_hf(str(b), tmp_path / "ckpt")
    result = CliRunner().invoke(app, ["parity", "--hf", str(a), "--ckpt", str(tmp_path / "ckpt")])
    assert result.exit_code == 2 and "vocab_size: HF 300, olmax 400" in result.output


def test_cli_parity_fails_a_different_model(tmp_path):
    """The same architecture with other weights: FAIL, the broken bounds named on the last line and in
    --json, exit status 3; bounds loosened past the figures (the options) turn it into a PASS."""
    reference = make_hf_checkpoint(tmp_path / "hf", vocab=300, n_layers=2, seed=0)
    other = make_hf_checkpoint(tmp_path / "other", vocab=300, n_layers=2, seed=1)
    convert_from_hf(str(other), tmp_path / "ckpt")
    args = ["parity", "--hf", str(reference), "--ckpt", str(tmp_path / "ckpt"), "--seq-len", "32"]

    result = CliRunner().invoke(app, args + ["--json", str(tmp_path / "fail.json")])
    assert result.exit_code == 3, result.output
    report = json.loads((tmp_path / "fail.json").read_text())
    assert report["verdict"] == "FAIL" and report["first_divergent_layer"] == 0
    assert [b.split()[0] for b in report["broken"]] == ["kl_mean", "top1_agreement", "max_abs_logit_diff", "layer"]
    last = result.stdout.splitlines()[-1]
    assert last.startswith("verdict: FAIL (float32): kl_mean ") and "; layer 0 layer_rel_diff " in last, last

    loose = ["--max-kl", "1e3", "--min-top1", "0", "--max-logit-diff", "1e9", "--layer-tol", "1e9"]
    result = CliRunner().invoke(app, args + loose + ["--json", str(tmp_path / "loose.json")])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "loose.json").read_text())
    assert report["verdict"] == "PASS" and report["bounds"]["max_kl_mean"] == 1e3
    assert result.stdout.splitlines()[-1].startswith("verdict: PASS (float32: kl_mean <= 1000, ")

    result = CliRunner().invoke(app, args + ["--min-top1", "1.5"])
    assert result.exit_code == 2 and "--min-top1 must be within 0..1" in result.output


def test_judge_names_each_broken_bound():
    good = {
        "kl_mean": 1e-12,
        "top1_agreement": 1.0,
        "max_abs_logit_diff": 1e-5,
        "first_divergent_layer": None,
        "layer_rel_diff": [1e-7, 2e-7],
    }
    fp32, bf16 = PARITY_BOUNDS["float32"], PARITY_BOUNDS["bfloat16"]
    assert judge(good, fp32) == []
    assert judge({**good, "kl_mean": float("nan")}, fp32) == ["kl_mean nan > 1e-06"]  # NaN never passes
    assert judge({**good, "top1_agreement": 0.99}, fp32) == ["top1_agreement 0.99 < 0.999"]
    assert judge({**good, "top1_agreement": 0.99}, bf16) == []
    # bfloat16 judges the distribution, not single logits: a 0.2 difference is rounding there
    assert judge({**good, "max_abs_logit_diff": 0.2}, fp32) == ["max_abs_logit_diff 0.2 > 0.01"]
    assert judge({**good, "max_abs_logit_diff": 0.2}, bf16) == []
    diverged = {**good, "first_divergent_layer": 1, "layer_rel_diff": [1e-7, 0.41]}
    assert judge(diverged, ParityBounds(1.0, 0.0, None, 0.1)) == ["layer 1 layer_rel_diff 0.41 > 0.1"]
