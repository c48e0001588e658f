"""The lm-eval adapter against lm-eval's own HF backend (HFLM) on a tiny random model exported to HF
(`convert_to_hf` with its tokenizer; HFLM loads the directory as it is, offline): the same
per-request log-likelihoods (fp32 tolerance), greedy flags, rolling log-likelihoods, greedy
generations, the same accuracy on a small local arc_easy-format task read offline, and the same
figures and generations on user task YAMLs (`olmax eval tasks --include-path`); `olmax lm-eval`
runs lm-eval's own command line with the olmax model on them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

lm_eval = pytest.importorskip("lm_eval")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.models.huggingface import HFLM  # noqa: E402
from models import byte_level_tokenizer, numpy_params, vocab_size  # noqa: E402

from olmax.checkpoint.store import save_params  # noqa: E402
from olmax.config.model import ModelConfig  # noqa: E402
from olmax.convert.hf import convert_to_hf  # noqa: E402
from olmax.evals.lm_eval_adapter import OlmaxLM  # noqa: E402
from olmax.evals.tasks import evaluate_tasks  # noqa: E402

pytestmark = pytest.mark.parity

TEXTS = [
    "The sun rises in the east and sets in the west.",
    "Water boils at one hundred degrees.",
    "Plants need light to grow.",
    "A magnet attracts iron.",
    "Question: What is ice? Answer: frozen water",
]
QUESTIONS = [
    ("What do plants need to grow?", ["light", "sand", "noise"], "A"),
    ("Where does the sun rise?", ["north", "east", "down"], "B"),
    ("What does a magnet attract?", ["wood", "glass", "iron"], "C"),
    ("At what temperature does water boil?", ["one hundred degrees", "ten degrees"], "A"),
]


@pytest.fixture(scope="module", autouse=True)
def one_task_index_per_include_path():
    """lm-eval's TaskManager parses every one of its ~14k task YAMLs when it is built (~10 s on 2 cores)
    and evaluate_tasks builds one per call. The index depends only on the include paths, so in this
    module each is built once and reused (the `olmax lm-eval` subprocess builds its own)."""
    import lm_eval.tasks

    build, built = lm_eval.tasks.TaskManager, {}

    def task_manager(include_path=None, **kwargs):
        key = repr((include_path, sorted(kwargs.items())))
        if key not in built:
            built[key] = build(include_path=include_path, **kwargs)
        return built[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lm_eval.tasks, "TaskManager", task_manager)
        yield


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lm_eval")
    tok_file = byte_level_tokenizer(tmp / "tokenizer.json", TEXTS * 4 + [q for q, _, _ in QUESTIONS], 320)
    cfg = ModelConfig(
        vocab_size=vocab_size(tok_file),
        d_model=32,
        n_layers=2,  # a sliding and a full layer: every program compiles two layers, not a scanned four
        n_heads=4,
        n_kv_heads=2,
        head_dim=8,
        mlp_hidden=64,
        sliding_window=8,
        max_position=64,
        compute_dtype="float32",
    )
    params = numpy_params(cfg, 0)
    params["lm_head"] = params["lm_head"] * 50  # sharper distributions: argmax and accuracy are not ties
    special = {"eos_token_id": 0, "pad_token_id": 0, "bos_token_id": None}  # the tokenizer's, not dolma2's
    save_params(tmp / "ckpt", params, cfg, {"source": "test", "special_tokens": special})
    convert_to_hf(tmp / "ckpt", tmp / "hf", dtype="float32", tokenizer=tok_file)
    hf = HFLM(pretrained=str(tmp / "hf"), device="cpu", dtype="float32", batch_size=3, max_length=64)
    ours = OlmaxLM(str(tmp / "ckpt"), tokenizer=tok_file, batch_size=3, max_length=64)
    return ours, hf, tmp


def requests(kind, args):
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


def test_loglikelihoods_match_hf(models):
    ours, hf, _ = models
    pairs = [(q, " " + c) for q, choices, _ in QUESTIONS for c in choices] + [
        ("", "Plants need light"),
        ("A long " * 30, " tail"),
    ]
    a = ours.loglikelihood(requests("loglikelihood", pairs))
    b = hf.loglikelihood(requests("loglikelihood", pairs))
    np.testing.assert_allclose([x[0] for x in a], [x[0] for x in b], rtol=1e-4, atol=1e-4)
    assert [x[1] for x in a] == [x[1] for x in b]
    texts = [(t,) for t in TEXTS] + [(" ".join(TEXTS * 3),)]  # the last spans several 64-token windows
    np.testing.assert_allclose(
        ours.loglikelihood_rolling(requests("loglikelihood_rolling", texts)),
        hf.loglikelihood_rolling(requests("loglikelihood_rolling", texts)),
        rtol=1e-4,
    )


def test_generate_until_matches_hf(models):
    ours, hf, _ = models
    args = [
        ("The sun rises", {"until": ["\n"], "max_gen_toks": 12, "do_sample": False}),
        ("Question: What is ice? Answer:", {"until": ["."], "max_gen_toks": 20, "do_sample": False}),
    ]
    assert ours.generate_until(requests("generate_until", args)) == hf.generate_until(requests("generate_until", args))


def test_a_request_stops_at_its_own_until_strings_only(models):
    """Two requests with different `until` strings in one call (one batch before HFLM's grouping): the
    first must run past a string that only the second stops at, as HFLM (which batches by gen_kwargs)
    gives. The second's string is two tokens from the middle of the first's own output."""
    ours, hf, _ = models
    free = ("The sun rises", {"until": ["\n"], "max_gen_toks": 12, "do_sample": False})
    text = hf.generate_until(requests("generate_until", [free]))[0]
    ids = ours.tok_encode(text)
    k = next(
        k
        for k in range(len(ids) // 3, len(ids) - 2)
        if ours.tok_encode(ours.tok_decode(ids[k : k + 2])) == ids[k : k + 2]
    )
    other = (
        "Question: What is ice? Answer:",
        {"until": [ours.tok_decode(ids[k : k + 2])], "max_gen_toks": 20, "do_sample": False},
    )
    got = ours.generate_until(requests("generate_until", [free, other]))
    assert got == hf.generate_until(requests("generate_until", [free, other]))
    assert got[0] == text


@pytest.mark.slow  # the default suite's 10 minutes (docs/testing.md)
def test_same_accuracy_on_a_local_task(models):
    import pyarrow as pa

    ours, hf, tmp = models
    rows = [
        {"id": str(i), "question": q, "choices": {"text": c, "label": list("ABC"[: len(c)])}, "answerKey": k}
        for i, (q, c, k) in enumerate(QUESTIONS)
    ]
    table = pa.Table.from_pylist(rows)
    split = tmp / "evals" / "arc_easy" / "validation"
    split.mkdir(parents=True)
    with pa.OSFile(str(split / "data-00000-of-00001.arrow"), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
        w.write_table(table)
    a = evaluate_tasks(ours, ["arc_easy"], data_dir=str(tmp / "evals"), bootstrap_iters=0)
    b = evaluate_tasks(hf, ["arc_easy"], data_dir=str(tmp / "evals"), bootstrap_iters=0)
    assert a["tasks"]["arc_easy"]["acc"] == b["tasks"]["arc_easy"]["acc"]
    assert a["tasks"]["arc_easy"]["acc_norm"] == b["tasks"]["arc_easy"]["acc_norm"]
    assert a["macro"]["acc"] == a["tasks"]["arc_easy"]["acc"]


# -- user task YAMLs ------------------------------------------------------------------------------

TASK_YAMLS = {
    "toy_mc": """task: toy_mc
dataset_path: json
dataset_kwargs: {{data_files: {{validation: {data}/mc.jsonl}}}}
validation_split: validation
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: choices
doc_to_target: label
metric_list: [{{metric: acc}}, {{metric: acc_norm}}]
""",
    "toy_ppl": """task: toy_ppl
dataset_path: json
dataset_kwargs: {{data_files: {{test: {data}/ppl.jsonl}}}}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list: [{{metric: word_perplexity}}, {{metric: byte_perplexity}}, {{metric: bits_per_byte}}]
""",
    "toy_gen": """task: toy_gen
dataset_path: json
dataset_kwargs: {{data_files: {{validation: {data}/gen.jsonl}}}}
validation_split: validation
output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs: {{until: ["\\n", "."], max_gen_toks: 8, do_sample: false}}
metric_list: [{{metric: exact_match}}]
""",
}


@pytest.fixture(scope="module")
def user_tasks(models):
    _, _, tmp = models
    tasks, data = tmp / "my_tasks", tmp / "my_data"
    tasks.mkdir()
    data.mkdir()
    rows = {
        "mc": [{"question": q, "choices": c, "label": "ABC".index(k)} for q, c, k in QUESTIONS],
        "ppl": [{"text": t} for t in TEXTS],
        "gen": [{"question": q, "answer": c["ABC".index(k)]} for q, c, k in QUESTIONS],
    }
    for name, docs in rows.items():
        (data / f"{name}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    for name, text in TASK_YAMLS.items():
        (tasks / f"{name}.yaml").write_text(text.format(data=data))
    return tasks


@pytest.mark.slow  # ~22 s on 2 cores; test_same_accuracy_on_a_local_task keeps lm-eval's figure in the default run
def test_eval_tasks_on_user_tasks_reports_what_lm_eval_reports(models, user_tasks, tmp_path):
    from typer.testing import CliRunner

    from olmax.cli.common import app

    _, hf, tmp = models
    names = ["toy_mc", "toy_ppl", "toy_gen"]
    result = CliRunner().invoke(
        app,
        [
            "eval",
            "tasks",
            "--ckpt",
            str(tmp / "ckpt"),
            "--tasks",
            ",".join(names),
            "--include-path",
            str(user_tasks),
            "--tokenizer",
            str(tmp / "tokenizer.json"),
            "--batch",
            "3",
            "--max-length",
            "64",
            "--json",
            str(tmp_path / "r.json"),
        ],
    )
    assert result.exit_code == 0, result.output
    ours = json.loads((tmp_path / "r.json").read_text())
    theirs = evaluate_tasks(hf, names, include_path=[str(user_tasks)])
    expected = {
        "toy_mc": {"acc", "acc_norm"},
        "toy_ppl": {"word_perplexity", "byte_perplexity", "bits_per_byte"},
        "toy_gen": {"exact_match"},
    }
    for task, metrics in expected.items():
        figures = ours["tasks"][task]
        assert (
            set(figures) == set(theirs["tasks"][task]) == {"num_fewshot", *metrics, *(m + "_stderr" for m in metrics)}
        )
        for metric in metrics:
            np.testing.assert_allclose(figures[metric], theirs["tasks"][task][metric], rtol=1e-5)
            if figures[metric + "_stderr"] is not None or theirs["tasks"][task][metric + "_stderr"] is not None:
                np.testing.assert_allclose(
                    figures[metric + "_stderr"], theirs["tasks"][task][metric + "_stderr"], rtol=0.05
                )  # bootstrap: resampled, not identical
    assert set(ours["generations"]) == {"toy_gen"}
    assert ours["generations"]["toy_gen"] == theirs["generations"]["toy_gen"]
    assert len(ours["generations"]["toy_gen"]) == len(QUESTIONS)


# a second process starting lm-eval's CLI: the slow run; the test above runs the same adapter in-process
@pytest.mark.slow
def test_olmax_lm_eval_runs_lm_evals_cli(models, user_tasks, tmp_path):
    _, _, tmp = models
    src = Path(__file__).resolve().parents[2] / "src"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    cmd = [
        sys.executable,
        "-m",
        "olmax.cli",
        "lm-eval",
        "--model",
        "olmax",
        "--model_args",
        f"ckpt={tmp / 'ckpt'},tokenizer={tmp / 'tokenizer.json'},max_length=64",
        "--batch_size",
        "3",
        "--tasks",
        "toy_mc,toy_gen",
        "--include_path",
        str(user_tasks),
        "--limit",
        "3",
        "--output_path",
        str(tmp_path / "out"),
        "--log_samples",
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    [results] = list((tmp_path / "out").rglob("results_*.json"))
    report = json.loads(results.read_text())
    assert set(report["results"]) == {"toy_mc", "toy_gen"} and report["config"]["model"] == "olmax"
    assert report["n-samples"]["toy_mc"]["effective"] == 3
    samples = {p.name.split("_2")[0]: p for p in (tmp_path / "out").rglob("samples_*.jsonl")}
    assert set(samples) == {"samples_toy_mc", "samples_toy_gen"}
    assert len(samples["samples_toy_gen"].read_text().splitlines()) == 3
