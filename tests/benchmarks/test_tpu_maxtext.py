"""benchmarks/tpu_maxtext.py's side-by-side rows: MaxText is told the fit olmax measured (layers,
parameter dtype, kept activations, micro-batches, tiles), and benchmarks/tpu_throughput.py's --fit
parses what it names. MaxText itself is not needed: this checks the command line built for it."""

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import tpu_maxtext  # noqa: E402
import tpu_throughput  # noqa: E402

KEEP_ALL = "q_proj,k_proj,v_proj,attn_context,o_proj,mlp_gate,mlp_down,mlp_up"
ENV = {"smoke": False, "set": [], "peak_tflops": 197.0}


def _argv(row: dict) -> dict:
    cfg = tpu_maxtext.config_of(row, ENV)
    argv = tpu_maxtext.maxtext_argv(cfg, row, 13, Path("/src"), Path("/out"), smoke=False)
    assert argv[:3] == ["-m", "maxtext.trainers.pre_train.train", "/src/maxtext/configs/base.yml"]
    pairs = dict(a.split("=", 1) for a in argv[3:])
    assert len(pairs) == len(argv) - 3  # no option given twice
    return pairs


def test_the_7b_layer_row_runs_maxtext_at_olmax_s_fit():
    row = {
        "row": "7b-layers",
        "n_layers": 1,
        "param_dtype": "bfloat16",
        "remat": KEEP_ALL,
        "micro_batch": 1,
        "accum_steps": 1,
    }
    a = _argv(row)
    assert a["model_name"] == "olmo3-7b-pt" and a["override_model_config"] == "True"
    assert (a["base_num_decoder_layers"], a["scan_layers"]) == ("1", "False")  # MaxText scans 4 layers at a time
    assert (a["base_emb_dim"], a["base_num_query_heads"], a["head_dim"], a["base_mlp_dim"]) == (
        "4096",
        "32",
        "128",
        "11008",
    )
    assert a["vocab_size"] == "100278" and a["sliding_window_size"] == "4096"
    assert (a["weight_dtype"], a["mu_dtype"], a["dtype"]) == ("bfloat16", "float32", "bfloat16")
    assert (a["per_device_batch_size"], a["gradient_accumulation_steps"], a["max_target_length"]) == ("1", "1", "8192")
    assert a["num_vocab_tiling"] == "8"  # 8192 tokens in chunks of the recipe's loss_chunk (1024)
    assert a["remat_policy"] == "custom"
    kept = ("query_proj", "key_proj", "value_proj", "context", "out_proj", "mlpwi_0", "mlpwi_1", "mlpwo")
    assert all(a[t] == "device" for t in kept)
    assert a["attention"] == "flash" and (a["sa_block_q"], a["sa_block_kv"], a["sa_block_kv_compute"]) == (
        "2048",
        "2048",
        "1024",
    )
    assert a["steps"] == "13" and a["skip_jax_distributed_system"] == "True"


def test_a_partial_set_and_full_recompute_map_to_maxtext_names():
    row = {
        "row": "1b",
        "n_layers": 8,
        "param_dtype": "float32",
        "remat": "q_proj,k_proj,attn_context",
        "micro_batch": 1,
        "accum_steps": 1,
    }
    a = _argv(row)
    assert a["scan_layers"] == "True" and a["base_emb_dim"] == "2048" and a["base_mlp_dim"] == "8192"
    assert [t for t in ("query_proj", "key_proj", "value_proj", "context", "out_proj") if a[t] == "device"] == [
        "query_proj",
        "key_proj",
        "context",
    ]
    assert _argv({**row, "remat": "full"})["remat_policy"] == "full"
    assert _argv({**row, "remat": "none"})["remat_policy"] == "none"
    offload = _argv({**row, "remat": "offload_qkv_out_proj"})
    assert [offload[t] for t in ("query_proj", "key_proj", "value_proj", "out_proj", "context", "mlpwo")] == [
        "offload",
        "offload",
        "offload",
        "offload",
        "remat",
        "remat",
    ]
    micro = _argv({**row, "row": "190m", "n_layers": 12, "micro_batch": 1, "accum_steps": 2, "remat": "full"})
    assert (micro["per_device_batch_size"], micro["gradient_accumulation_steps"]) == ("1", "2")
    assert micro["base_emb_dim"] == "768" and micro["num_vocab_tiling"] == "8"


def test_fit_names_what_it_fixes_and_refuses_a_typo():
    assert tpu_throughput.parse_fit("1b:7:float32:full") == ("1b", tpu_throughput.Fit(7, "float32", "full", None))
    assert tpu_throughput.parse_fit(f"190m:::{KEEP_ALL}:2") == ("190m", tpu_throughput.Fit(None, None, KEEP_ALL, 2))
    for bad in ("2b:7", "1b:seven", "1b:7:fp32", "1b:1:float32:full:1:9"):
        with pytest.raises(argparse.ArgumentTypeError, match="1b|2b"):
            tpu_throughput.parse_fit(bad)


def test_maxtext_s_exact_count_has_its_own_windows_and_vocabulary():
    """MaxText's OLMo 3 layer i is global only when i % 4 == 3; olmax (as OLMo-core) makes the last
    layer global too. One layer: MaxText's is windowed (4096 of 8192), olmax's global."""
    from olmax.fit.flops import exact_step_flops

    row = {
        "row": "7b-layers",
        "n_layers": 1,
        "param_dtype": "bfloat16",
        "remat": "full",
        "micro_batch": 1,
        "accum_steps": 1,
    }
    m = tpu_maxtext.config_of(row, ENV).model
    ours, theirs = exact_step_flops(m, 8192, 1), tpu_maxtext.maxtext_exact_flops(m, 8192, 1)
    per_pair = 3 * 2 * 2 * 32 * 128  # forward + backward, two head_dim dots per pair, per query head
    causal, windowed = 8192 * 8193 // 2, 4096 * 4097 // 2 + 4096 * 4096
    assert ours.attention == per_pair * causal
    head = 3 * 2 * 8192 * 4096  # the output layer's FLOPs per vocabulary row
    assert theirs == ours.weights - head * (100352 - 100278) + per_pair * windowed
    four = tpu_maxtext.config_of({**row, "n_layers": 4}, ENV).model  # layer 3 global in both
    assert tpu_maxtext.maxtext_exact_flops(four, 8192, 1) == exact_step_flops(four, 8192, 1).total - head * 74
