"""RL prompts in the Dolci-*-RL layout: rendered with the generation prompt, unusable rows skipped and
counted, malformed rows an error naming file and row."""

import json

import pytest

from olmax.data.chat import render
from olmax.data.chat_corpus import chat_file, read_rows
from olmax.data.prompts import read_prompts
from olmax.data.tokenize import TokenizeError
from olmax.data.tokenizer import load_tokenizer


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_prompts_are_the_rendered_generation_prompt():
    rows = read_rows("rl_heldout")
    got = read_prompts([chat_file("rl_heldout")], "think", max_prompt_len=512)
    tok = load_tokenizer("dolma2")
    eos = tok.decode([tok.info.eos_token_id])
    assert len(got.prompts) == len(rows) and got.skipped == {}
    first = got.prompts[0]
    assert first.ids == tuple(tok.encode(render("think", rows[0]["messages"], eos, add_generation_prompt=True)))
    assert tok.decode(list(first.ids)).endswith("<|im_start|>assistant\n<think>")
    assert (first.ground_truths, first.verifiers) == ((rows[0]["ground_truth"],), ("math",))


def test_unusable_rows_are_counted_and_malformed_rows_named(tmp_path):
    user = [{"role": "user", "content": "What is 1 + 1?"}]
    long = [{"role": "user", "content": "word " * 200}]
    rows = [
        {"messages": user, "ground_truth": "2", "dataset": "math"},
        {"messages": user, "ground_truth": "", "dataset": "math"},
        {"messages": long, "ground_truth": "2", "dataset": "math"},
        {"messages": user, "ground_truth": ["2", '{"func_name": "x"}'], "dataset": ["math", "ifeval"]},
    ]
    got = read_prompts([_write(tmp_path / "p.jsonl", rows)], "instruct", max_prompt_len=100)
    assert [p.verifiers for p in got.prompts] == [("math",), ("math", "ifeval")]
    assert got.prompts[1].ground_truths == ("2", '{"func_name": "x"}')
    assert got.skipped == {"no_ground_truth": 1, "too_long": 1}
    bad = _write(tmp_path / "bad.jsonl", [rows[0], {"messages": user, "ground_truth": "2"}])
    with pytest.raises(TokenizeError, match=r"bad.jsonl:2: no `dataset`"):
        read_prompts([bad], "instruct", 100)
    unpaired = _write(tmp_path / "unpaired.jsonl", [{"messages": user, "ground_truth": ["2"], "dataset": ["a", "b"]}])
    with pytest.raises(TokenizeError, match=r"unpaired.jsonl:1: 2 verifier names \(`dataset`\) but 1 ground truths"):
        read_prompts([unpaired], "instruct", 100)
    with pytest.raises(TokenizeError, match="does not exist"):
        read_prompts([tmp_path / "missing.jsonl"], "instruct", 100)
