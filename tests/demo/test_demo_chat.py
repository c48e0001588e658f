"""`olmax demo chat` and its shipped corpus. Fast: the shipped files are exactly what
olmax.data.chat_corpus writes, the held-out problems are not trained on, each file is in the layout its
stage reads, and a stage that stopped early stops the demo. Slow: the whole demo (base, SFT, DPO, RL)
runs, and RL teaches the answer format the verifier reads."""

import json
import os
import re
import subprocess
import sys

import pytest

from olmax.data import chat_corpus
from olmax.data.chat import check_messages


def test_shipped_corpus_is_what_the_generator_writes():
    for name, rows in chat_corpus.build().items():
        assert chat_corpus.chat_file(name).read_bytes() == chat_corpus.encode(rows), name


def _problem(text: str) -> str:
    return re.search(r"\d+ [+-] \d+", text).group(0)


def test_held_out_prompts_are_not_trained_on():
    """Held out by wording, not by sum: every held-out prompt asks a trained sum in a wording that no
    training file pairs with it (and no training file holds its text)."""

    def prompts(name, key):
        return [row[key][0]["content"] for row in chat_corpus.read_rows(name)]

    held = prompts("rl_heldout", "messages")
    assert held == prompts("sft_heldout", "messages") == prompts("prefs_heldout", "chosen")
    assert 60 < len(held) < 100
    for name, key in (("sft", "messages"), ("prefs", "chosen"), ("rl", "messages")):
        trained = prompts(name, key)
        assert not set(held) & set(trained), name
        assert {_problem(t) for t in held} <= {_problem(t) for t in trained}, name  # its sum in other wordings
        wording = {text.replace(_problem(text), "{}") for text in trained}
        assert {text.replace(_problem(text), "{}") for text in held} <= wording, name  # its wording, other sums
        for text in held:
            asked = {t.replace(_problem(t), "{}") for t in trained if _problem(t) == _problem(text)}
            assert text.replace(_problem(text), "{}") not in asked, (name, text)


def test_rows_are_in_each_stage_layout():
    for name in ("sft", "sft_heldout"):
        for row in chat_corpus.read_rows(name):
            messages = check_messages(row["messages"], name)
            assert [m["role"] for m in messages] == ["user", "assistant"]
    for name in ("prefs", "prefs_heldout"):
        for row in chat_corpus.read_rows(name):
            assert row["chosen"][0] == row["rejected"][0] and row["chosen"][1] != row["rejected"][1]
            # the pair differs in the sum, never in the format: DPO is not what teaches the demo to box
            assert ("\\boxed{" in row["chosen"][1]["content"]) == ("\\boxed{" in row["rejected"][1]["content"])
    for name in ("rl", "rl_heldout"):
        for row in chat_corpus.read_rows(name):
            assert row["dataset"] == "math" and int(row["ground_truth"]) >= 0
            assert [m["role"] for m in row["messages"]] == ["user"]


def test_what_is_questions_are_answered_boxed_the_rest_two_in_ten():
    """The verifier credits a boxed answer only; the SFT rows box it when the question reads "What is
    ...?" and in 2 rows of 10 otherwise (stating it in words in the rest), the number the true one."""
    rows = chat_corpus.read_rows("sft")
    for k, r in enumerate(rows):
        question, answer = r["messages"][0]["content"], r["messages"][1]["content"]
        a, op, b = re.search(r"(\d+) ([+-]) (\d+)", question).groups()
        c = int(a) + int(b) if op == "+" else int(a) - int(b)
        boxed = question.startswith("What is") or k % 10 < 2
        assert answer == f"{a} {op} {b} = {c}. The answer is " + (f"\\boxed{{{c}}}." if boxed else f"{c}."), k


def test_a_stage_that_stopped_early_stops_the_demo(tmp_path, monkeypatch):
    """A stage whose trainer returned before its last step (SIGTERM saves and returns) must not hand its
    checkpoint to the next stage: the demo stops, naming the stage and the step, and a rerun resumes."""
    from olmax.demo import chat as demo_chat

    monkeypatch.setattr(demo_chat, "train", lambda cfg, run_dir, progress: None)
    monkeypatch.setattr(demo_chat, "read_metrics", lambda run_dir: [{"step": 255, "train/CE loss": 1.0}])
    args = ("tiny_sft", tmp_path / "sft", tmp_path / "data", tmp_path / "base", [], False)
    with pytest.raises(demo_chat.StageStopped, match=r"sft stage stopped at step 255 of 300.*rerun"):
        demo_chat._stage(*args)
    monkeypatch.setattr(demo_chat, "read_metrics", lambda run_dir: [{"step": 300, "train/CE loss": 1.0}])
    assert demo_chat._stage(*args)["steps"] == 300


@pytest.mark.slow
def test_demo_chat_as_a_user_runs_it_each_stage_does_its_part(tmp_path):
    """`olmax demo chat` as a user runs it: its own process on one CPU device (not the suite's 8 fake
    ones), about 20 minutes on 2 cores. SFT teaches the sums and the "What is ...?" questions' boxed
    answers; DPO lifts the preference accuracy on held-out pairs above 0.5 and keeps the sums; RL,
    rewarded by the math verifier, teaches the model to box every answer, so the held-out solve rate
    rises far beyond the noise of 79 prompts (docs/post-training/demo-chat.md has the figures)."""
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["OLMAX_CACHE"] = str(tmp_path / "cache")
    olmax = [sys.executable, "-m", "olmax.cli", "demo", "chat", "--run-dir", str(run)]
    subprocess.run(olmax, env=env, check=True, stdout=subprocess.DEVNULL, timeout=3600)
    s = json.loads((run / "summary.json").read_text())
    assert (run / "post_training.png").is_file()
    exact = {stage: s[stage]["held_out_exact"] for stage in ("sft", "dpo", "rl")}
    assert s["base"]["held_out"]["solved"] == 0 == exact["sft"]["before"]
    assert s["sft"]["last_loss"] < s["sft"]["first_loss"] / 10
    assert s["sft"]["held_out"]["answered"] >= 0.5 * s["sft"]["held_out"]["of"]
    assert 0.05 <= exact["sft"]["after"] <= 0.4  # the "What is" questions' answers, boxed
    assert s["dpo"]["preference_accuracy"] > 0.5
    assert s["dpo"]["held_out"]["answered"] >= 0.75 * s["sft"]["held_out"]["answered"]  # it keeps most sums
    assert exact["rl"]["before"] == exact["dpo"]["after"]
    assert len(s["rl"]["reward_by_step"]) == s["rl"]["steps"] == 40
    assert s["rl"]["held_out"]["formatted"] >= 0.9 * s["rl"]["held_out"]["of"]
    assert exact["rl"]["after"] >= exact["rl"]["before"] + 0.2
