"""`olmax demo chat` and its shipped corpus. Fast: the shipped files are exactly what
olmax.data.chat_corpus writes, the held-out problems are not trained on, each file is in the layout its
stage reads, and a stage that stopped early stops the demo. Slow: the whole demo (base, SFT, DPO, RL)
runs, and RL teaches the answer format the verifier reads."""

import re

import pytest

from olmax.data import chat_corpus
from olmax.data.chat import check_messages


def test_shipped_corpus_is_what_the_generator_writes():
    for name, rows in chat_corpus.build().items():
        assert chat_corpus.chat_file(name).read_bytes() == chat_corpus.encode(rows), name


def test_held_out_problems_are_not_trained_on():
    def problems(name, key):
        return {re.search(r"\d+ [+-] \d+", row[key][0]["content"]).group(0) for row in chat_corpus.read_rows(name)}

    held = problems("rl_heldout", "messages")
    assert held == problems("sft_heldout", "messages")
    for name, key in (("sft", "messages"), ("prefs", "chosen"), ("rl", "messages")):
        assert not held & problems(name, key), name
    assert 60 < len(held) < 100


def test_rows_are_in_each_stage_layout():
    for name in ("sft", "sft_heldout"):
        for row in chat_corpus.read_rows(name):
            messages = check_messages(row["messages"], name)
            assert [m["role"] for m in messages] == ["user", "assistant"]
    for row in chat_corpus.read_rows("prefs"):
        assert row["chosen"][0] == row["rejected"][0] and row["chosen"][1] != row["rejected"][1]
        # the pair differs in the sum, never in the format: DPO is not what teaches the demo to box
        assert ("\\boxed{" in row["chosen"][1]["content"]) == ("\\boxed{" in row["rejected"][1]["content"])
    for name in ("rl", "rl_heldout"):
        for row in chat_corpus.read_rows(name):
            assert row["dataset"] == "math" and int(row["ground_truth"]) >= 0
            assert [m["role"] for m in row["messages"]] == ["user"]


def test_three_demonstrations_in_ten_box_their_answer():
    """The verifier credits a boxed answer only; the SFT rows box 3 in 10 and state the rest in words,
    each answer's number the true one either way."""
    rows = chat_corpus.read_rows("sft")
    boxed = [r for r in rows if "\\boxed{" in r["messages"][1]["content"]]
    assert len(boxed) == sum(k % 10 < 3 for k in range(len(rows)))
    for r in rows:
        a, op, b = re.search(r"(\d+) ([+-]) (\d+)", r["messages"][0]["content"]).groups()
        c = int(a) + int(b) if op == "+" else int(a) - int(b)
        assert r["messages"][1]["content"].endswith((f"is \\boxed{{{c}}}.", f"is {c}."))


def test_a_stage_that_stopped_early_stops_the_demo(tmp_path, monkeypatch):
    """A stage whose trainer returned before its last step (SIGTERM saves and returns) must not hand its
    checkpoint to the next stage: the demo stops, naming the stage and the step, and a rerun resumes."""
    from olmax import demo_chat

    monkeypatch.setattr(demo_chat, "train", lambda cfg, run_dir, progress: None)
    monkeypatch.setattr(demo_chat, "read_metrics", lambda run_dir: [{"step": 255, "train/CE loss": 1.0}])
    args = ("tiny_sft", tmp_path / "sft", tmp_path / "data", tmp_path / "base", [], False)
    with pytest.raises(demo_chat.StageStopped, match=r"sft stage stopped at step 255 of 300.*rerun"):
        demo_chat._stage(*args)
    monkeypatch.setattr(demo_chat, "read_metrics", lambda run_dir: [{"step": 300, "train/CE loss": 1.0}])
    assert demo_chat._stage(*args)["steps"] == 300


@pytest.mark.slow
def test_demo_chat_runs_every_stage_and_rl_teaches_what_the_verifier_reads(tmp_path, monkeypatch):
    """The whole demo (about 20 minutes on 2 cores): SFT teaches some sums, stated in words as most of
    its demonstrations are; RL, rewarded by the math verifier, teaches the model to box them, on
    held-out prompts too (held-out solved 0 -> 9 here, measured; 0 -> 15 from the CLI on one device).
    Not robust: on 2026-12-04 it failed (RL 8 of 79 boxed, 0 -> 1 solved; docs/post-training.md)."""
    from olmax.demo_chat import run_chat_demo

    monkeypatch.setenv("OLMAX_CACHE", str(tmp_path / "cache"))
    s = run_chat_demo(tmp_path / "run", progress=False)
    of = s["sft"]["held_out"]["of"]
    assert s["sft"]["last_loss"] < s["sft"]["first_loss"] / 10
    assert s["base"]["held_out"]["solved"] == 0
    assert s["sft"]["held_out"]["answered"] >= 3 and s["sft"]["held_out"]["formatted"] <= 0.2 * of
    assert len(s["rl"]["reward_by_step"]) == s["rl"]["steps"] == 40
    before, after = s["rl"]["held_out_exact"]["before"], s["rl"]["held_out_exact"]["after"]
    assert before == s["dpo"]["held_out"]["solved"] <= 2
    assert s["rl"]["held_out"]["formatted"] >= 0.9 * of and after >= before + 4
    assert (tmp_path / "run" / "summary.json").is_file() and (tmp_path / "run" / "post_training.png").is_file()
