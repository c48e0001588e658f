"""`olmax verify`: identical checkpoints give deltas of exactly 0 and "within noise" everywhere; a
perturbed B "differs" on held-out loss and KL; A's and B's figures are those `olmax eval loss` and
`olmax eval domains` give on their own; the sigma is the textbook standard error where the clusters
are equal; the CLI writes the report files."""

import gzip
import json
import math

import jax
import numpy as np
import pytest
from models import byte_level_tokenizer, numpy_params, tiny_eval_model, vocab_size
from typer.testing import CliRunner

from olmax.checkpoint.store import save_params
from olmax.cli.common import app
from olmax.config.data import DataConfig
from olmax.evals.domains import eval_domains
from olmax.evals.heldout import eval_loss
from olmax.evals.verify import DIFFERS, WITHIN, compare_tasks, paired_delta, verify

# A 300-token vocabulary: on the CPU the suite's programs run unoptimized (tests/conftest.py), and
# over dolma2's 100k ids the output layers and KL of every verify call took most of this file's time.
CFG = tiny_eval_model(vocab_size=300, max_position=16)
SEQ, STEPS = 16, (10, 20)


DOCS = {
    "lit": ["In the beginning was the word.", "And the word was with God, and the word was God."],
    "code": ["def f(x):\n    return x * 2", "for i in range(10):\n    print(i, i * i)  # squares"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("verify")
    params = numpy_params(CFG, 0)
    perturbed = dict(params)
    perturbed["lm_head"] = params["lm_head"] + 0.2 * jax.random.normal(jax.random.key(1), params["lm_head"].shape)
    for name, p in (("a", params), ("b", params), ("c", perturbed)):
        for step in STEPS:
            save_params(tmp / name / "checkpoints", p, CFG, {}, step=step)
    tokens = np.random.default_rng(0).integers(0, CFG.vocab_size, 10 * SEQ).astype(np.uint32)
    shard = tmp / "000000.npy"
    tokens.tofile(shard)
    domains = tmp / "domains"
    domains.mkdir()
    with gzip.open(domains / "mixed.jsonl.gz", "wt") as f:
        for domain, texts in DOCS.items():
            for text in texts:
                f.write(json.dumps({"text": text, "domain": domain}) + "\n")
    tokenizer = byte_level_tokenizer(
        tmp / "tokenizer.json", [t for texts in DOCS.values() for t in texts], CFG.vocab_size
    )
    assert vocab_size(tokenizer) <= CFG.vocab_size
    return {
        "dir": tmp,
        "shard": str(shard),
        "domains": str(domains),
        "data_cfg": DataConfig(work_dir=str(tmp / "cache")),
        "tokenizer": tokenizer,
    }


def run(runs, b, out):
    return verify(
        runs["dir"] / "a",
        runs["dir"] / b,
        runs["dir"] / out,
        landmarks=list(STEPS),
        data=[runs["shard"]],
        seq_len=SEQ,
        batch=4,
        max_batches=2,
        domains=runs["domains"],
        tokenizer=runs["tokenizer"],
        data_cfg=runs["data_cfg"],
    )


def test_identical_checkpoints_are_within_noise(runs):
    r = run(runs, "b", "same")
    assert r["landmarks"] == list(STEPS) and r["instances"] == 8
    assert r["verdicts"] == {"heldout": WITHIN, "domains": WITHIN, "kl": WITHIN}
    for row in r["rows"]:
        assert row["heldout"]["delta"] == 0.0 and row["heldout"]["sigma"] == 0.0
        assert row["kl"]["kl_mean"] == 0.0 and row["kl"]["top1_agreement"] == 1.0
        for d in list(row["domains"]["domains"].values()) + [row["domains"]["micro"]]:
            assert d["delta"] == 0.0 and d["verdict"] == WITHIN
    # A's figures are what the single-checkpoint commands report
    alone = eval_loss(
        str(runs["dir"] / "a" / "checkpoints"),
        [runs["shard"]],
        seq_len=SEQ,
        batch=4,
        max_batches=2,
        data_cfg=runs["data_cfg"],
        step=10,
    )["results"]["000000"]
    assert r["rows"][0]["heldout"]["a"] == pytest.approx(alone["CE loss"], rel=1e-9)
    assert r["rows"][0]["heldout"]["tokens"] == alone["tokens"]
    dom = eval_domains(
        str(runs["dir"] / "a" / "checkpoints"),
        runs["domains"],
        seq_len=SEQ,
        batch=4,
        step=10,
        tokenizer=runs["tokenizer"],
    )
    micro = r["rows"][0]["domains"]["micro"]
    assert micro["a"] == pytest.approx(dom["micro"]["loss"], rel=1e-9)
    assert micro["bpb_a"] == pytest.approx(dom["micro"]["bpb"], rel=1e-9)
    assert r["rows"][0]["domains"]["domains"]["code"]["a"] == pytest.approx(dom["domains"]["code"]["loss"], rel=1e-9)


@pytest.mark.slow  # the default suite's 10 minutes (docs/testing.md)
def test_perturbed_b_differs(runs):
    r = run(runs, "c", "perturbed")
    assert r["verdicts"]["heldout"] == DIFFERS and r["verdicts"]["kl"] == DIFFERS
    h = r["rows"][0]["heldout"]
    alone = eval_loss(
        str(runs["dir"] / "c" / "checkpoints"),
        [runs["shard"]],
        seq_len=SEQ,
        batch=4,
        max_batches=2,
        data_cfg=runs["data_cfg"],
        step=10,
    )["results"]["000000"]
    assert h["b"] == pytest.approx(alone["CE loss"], rel=1e-9)
    assert h["delta"] == pytest.approx(h["b"] - h["a"], abs=1e-12) and abs(h["delta"]) > 2 * h["sigma"] > 0
    assert r["rows"][0]["kl"]["kl_mean"] > 1e-2
    md = (runs["dir"] / "perturbed" / "verify.md").read_text()
    assert "| held-out loss | **differs** | \\|delta\\| <= 2 sigma" in md


def test_sigma_is_the_standard_error_for_equal_clusters():
    rng = np.random.default_rng(0)
    a, b = rng.normal(30, 3, 12), rng.normal(31, 3, 12)
    n = np.full(12, 15)
    r = paired_delta(a, b, n)
    per_cluster = (b - a) / n
    assert r["delta"] == pytest.approx(per_cluster.mean(), rel=1e-12)
    assert r["sigma"] == pytest.approx(per_cluster.std(ddof=1) / math.sqrt(12), rel=1e-12)
    assert paired_delta(a[:1], b[:1], n[:1])["sigma"] is None


def test_task_sigma_in_quadrature():
    a = {"tasks": {"arc_easy": {"acc": 0.5, "acc_stderr": 0.03}}, "macro": {"acc": 0.5, "acc_stderr": 0.03}}
    b = {"tasks": {"arc_easy": {"acc": 0.6, "acc_stderr": 0.04}}, "macro": {"acc": 0.6, "acc_stderr": 0.04}}
    r = compare_tasks(a, b, 2.0)
    assert r["macro"]["delta"] == pytest.approx(0.1) and r["macro"]["sigma"] == pytest.approx(0.05)
    assert r["macro"]["verdict"] == WITHIN  # 0.1 <= 2 * 0.05
    assert compare_tasks(a, b, 1.0)["tasks"]["arc_easy"]["verdict"] == DIFFERS


def test_cli_writes_the_report(runs):
    out = runs["dir"] / "cli"
    res = CliRunner().invoke(
        app,
        [
            "verify",
            "--a",
            str(runs["dir"] / "a"),
            "--b",
            str(runs["dir"] / "b" / "checkpoints"),
            "--landmarks",
            "20",
            "--out",
            str(out),
            "--data",
            runs["shard"],
            "--seq-len",
            str(SEQ),
            "--batch",
            "4",
            "--max-batches",
            "1",
            "--work-dir",
            str(runs["dir"] / "cache"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert {p.name for p in out.iterdir()} == {"verify.md", "verify.json", "deltas.png"}
    report = json.loads((out / "verify.json").read_text())
    assert report["landmarks"] == [20] and report["verdicts"]["heldout"] == WITHIN
    assert "held-out loss" in res.output and "within noise" in res.output
    bad = CliRunner().invoke(
        app,
        [
            "verify",
            "--a",
            str(runs["dir"] / "a"),
            "--b",
            str(runs["dir"] / "b"),
            "--landmarks",
            "15",
            "--out",
            str(out),
            "--data",
            runs["shard"],
        ],
    )
    assert bad.exit_code == 2 and "landmark steps [15] are not in A" in bad.output


def test_one_run_at_two_steps(runs):
    """Single checkpoints (step directories) are compared as given: here A at step 10 against C at 20."""
    out = runs["dir"] / "pair"
    r = verify(
        runs["dir"] / "a" / "checkpoints" / "10",
        runs["dir"] / "c" / "checkpoints" / "20",
        out,
        data=[runs["shard"]],
        seq_len=SEQ,
        batch=4,
        max_batches=1,
        data_cfg=runs["data_cfg"],
    )
    assert (r["landmarks"], r["landmarks_b"]) == ([10], [20])
    alone = eval_loss(
        str(runs["dir"] / "c" / "checkpoints"),
        [runs["shard"]],
        seq_len=SEQ,
        batch=4,
        max_batches=1,
        data_cfg=runs["data_cfg"],
        step=20,
    )["results"]["000000"]
    assert r["rows"][0]["heldout"]["b"] == pytest.approx(alone["CE loss"], rel=1e-9)
    assert r["verdicts"]["heldout"] == DIFFERS
    assert "| 10 vs 20 |" in (out / "verify.md").read_text()
    # one side a single checkpoint: the run on the other side is taken at the same step
    same = verify(
        runs["dir"] / "a",
        runs["dir"] / "b" / "checkpoints" / "20",
        runs["dir"] / "pair2",
        data=[runs["shard"]],
        seq_len=SEQ,
        batch=4,
        max_batches=1,
        data_cfg=runs["data_cfg"],
    )
    assert (same["landmarks"], same["landmarks_b"]) == ([20], [20]) and same["verdicts"]["heldout"] == WITHIN
    with pytest.raises(ValueError, match="--landmarks applies to runs"):
        verify(runs["dir"] / "a" / "checkpoints" / "10", runs["dir"] / "b", out, landmarks=[10])


@pytest.mark.slow  # ~1 min: lm-eval's start-up and four task runs
@pytest.mark.parity  # lm-eval runs on torch
def test_tasks_surface_end_to_end(runs):
    """--tasks inside verify: lm-eval runs offline on local copies (arc_easy's and google/boolq's
    columns); identical checkpoints agree exactly, and A's accuracies are what `eval tasks` reports."""
    pytest.importorskip("lm_eval")
    import pyarrow as pa

    from olmax.evals.tasks import run_tasks

    data_dir = runs["dir"] / "task_data"
    arc = [
        {"id": str(i), "question": q, "choices": {"text": c, "label": ["A", "B", "C"]}, "answerKey": k}
        for i, (q, c, k) in enumerate(
            [
                ("Where does the sun rise?", ["north", "east", "down"], "B"),
                ("What do plants need?", ["light", "sand", "noise"], "A"),
                ("What is ice?", ["fire", "frozen water", "air"], "B"),
            ]
        )
    ]
    boolq = [
        {"question": "is water wet", "answer": True, "passage": "Water is a liquid."},
        {"question": "is fire cold", "answer": False, "passage": "Fire is hot."},
        {"question": "do fish swim", "answer": True, "passage": "Fish live in water."},
    ]
    for task, rows in (("arc_easy", arc), ("boolq", boolq)):
        split = data_dir / task / "validation"
        split.mkdir(parents=True)
        table = pa.Table.from_pylist(rows)
        with pa.OSFile(str(split / "data-00000-of-00001.arrow"), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
            w.write_table(table)
    kw = dict(
        landmarks=[20],
        data=[runs["shard"]],
        seq_len=SEQ,
        batch=4,
        max_batches=1,
        data_cfg=runs["data_cfg"],
        tasks=["arc_easy", "boolq"],
        data_dir=str(data_dir),
        tokenizer=runs["tokenizer"],
    )
    same = verify(runs["dir"] / "a", runs["dir"] / "b", runs["dir"] / "tasks_same", **kw)
    assert same["verdicts"]["tasks"] == WITHIN
    for t in list(same["rows"][0]["tasks"]["tasks"].values()) + [same["rows"][0]["tasks"]["macro"]]:
        assert t["delta"] == 0.0
    alone = run_tasks(
        str(runs["dir"] / "a" / "checkpoints"),
        ["arc_easy", "boolq"],
        data_dir=str(data_dir),
        tokenizer=runs["tokenizer"],
        step=20,
    )
    for task in ("arc_easy", "boolq"):
        assert same["rows"][0]["tasks"]["tasks"][task]["a"] == alone["tasks"][task]["acc"]
    # lm-eval's boolq reads super_glue's `label`: the local google/boolq `answer` becomes it (yes = 1)
    from lm_eval.tasks import TaskManager, get_task_dict

    from olmax.evals.lm_eval_adapter import offline_datasets

    with offline_datasets(data_dir):
        boolq_task = get_task_dict(["boolq"], TaskManager())["boolq"]
    assert [boolq_task.doc_to_target(d) for d in boolq_task.validation_docs()] == [1, 0, 1]
    assert "## Task accuracy (lm-eval)" in (runs["dir"] / "tasks_same" / "verify.md").read_text()
