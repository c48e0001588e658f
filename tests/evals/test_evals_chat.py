"""Chat models outside training: the HF export's chat template (`convert --to-hf --chat`), `olmax
generate --chat` and lm-eval's chat-template path in the olmax adapter, each against transformers
5.24 / lm-eval 0.4.13 on the export of one tiny random model with the dolma2 vocabulary (AutoTokenizer,
`generate` and lm-eval's `hf` model load the directory offline)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from models import small_model
from typer.testing import CliRunner

from olmax.checkpoint.store import save_params
from olmax.cli.common import app
from olmax.config.model import ModelConfig
from olmax.convert.hf import convert_to_hf
from olmax.convert.tensors import ConversionError
from olmax.data import chat
from olmax.model.olmo3 import abstract_params
from olmax.rollout.text import read_conversations

# max_position 256: the default system prompts alone are ~40 tokens
CFG = small_model(sliding_window=16, max_position=256, compute_dtype="float32")
DOLMA2 = {"eos_token_id": 100257, "pad_token_id": 100277, "bos_token_id": None}
IM_END = 100265
# A user turn alone (the template's default system prompt), a given system prompt, multi-turn, and
# a conversation that ends with the assistant (rendered without the generation prompt too).
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a colour."}],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Count to three."},
    ],
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
]


def random_params() -> dict:
    """N(0, 0.02) weights and unit norms, drawn with numpy (init_params' compile takes seconds here)."""
    rng = np.random.default_rng(0)
    flat, tree = jax.tree.flatten_with_path(abstract_params(CFG))
    leaves = [
        np.ones(a.shape, a.dtype) if path[-1].key.endswith("norm") else rng.normal(0, 0.02, a.shape).astype(a.dtype)
        for path, a in flat
    ]
    params = jax.tree.unflatten(tree, leaves)
    params["lm_head"] *= 50  # a clear argmax: greedy decoding is not decided by ties
    # a token this random model often picks (93839) swaps output rows with <|im_end|>: some chat
    # replies then end at the end-of-turn token, others run to --max-new-tokens
    params["lm_head"][:, [93839, IM_END]] = params["lm_head"][:, [IM_END, 93839]]
    return params


@pytest.fixture(scope="module")
def exports(tmp_path_factory, dolma2_json):
    """One checkpoint, exported with the Instruct template (convert_to_hf) and the Think one (the CLI)."""
    tmp = tmp_path_factory.mktemp("chat")
    params = random_params()
    save_params(tmp / "ckpt", params, CFG, {"source": "test", "special_tokens": DOLMA2})
    tok = str(dolma2_json)
    convert_to_hf(tmp / "ckpt", tmp / "instruct", dtype="float32", tokenizer=tok, chat="instruct")
    args = ["convert", "--to-hf", str(tmp / "ckpt"), "--out", str(tmp / "think"), "--tokenizer", tok, "--chat", "think"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return tmp


def test_the_export_carries_the_chosen_template(exports, tmp_path):
    for name in ("instruct", "think"):
        config = json.loads((exports / name / "tokenizer_config.json").read_text())
        assert config["chat_template"] == chat.template_text(name)
    with pytest.raises(ConversionError, match="drop --tokenizer none"):
        convert_to_hf(exports / "ckpt", tmp_path / "a", tokenizer="none", chat="think")
    with pytest.raises(ConversionError, match="unknown chat template 'tulu'"):
        convert_to_hf(exports / "ckpt", tmp_path / "b", chat="tulu")
    result = CliRunner().invoke(app, ["convert", "--from-hf", "x", "--out", str(tmp_path / "c"), "--chat", "think"])
    assert result.exit_code == 2 and "--chat only applies to --to-hf" in result.output


def test_auto_takes_the_template_the_run_trained_on(exports, dolma2_json, tmp_path, monkeypatch):
    import olmax.convert.hf
    from olmax.data.tokenize import FORMAT, MANIFEST

    paths = []
    think = {"chat": {"template": "think"}}
    for name, chat_block in (("plain", {}), ("think", think), ("other", {}), ("prefs/chosen", think)):
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / MANIFEST).write_text(json.dumps({"format": FORMAT, **chat_block}))
        paths.append(str(tmp_path / name))
    paths[3] = str(tmp_path / "prefs")  # a preference directory (DPO): manifests in chosen/ and rejected/
    paths[2] = str(tmp_path / "other" / "token_ids_part_*.npy")  # a glob of parts: its directory's manifest
    experiment = {"data": {"paths": paths}}
    # the experiment item a training run saves with each checkpoint (the fixture's is a conversion)
    monkeypatch.setattr(olmax.convert.hf, "read_experiment", lambda ckpt, step: experiment)
    for chat_arg, expected in (("auto", chat.template_text("think")), ("none", None)):
        summary = convert_to_hf(exports / "ckpt", tmp_path / chat_arg, tokenizer=str(dolma2_json), chat=chat_arg)
        config = json.loads((tmp_path / chat_arg / "tokenizer_config.json").read_text())
        assert config.get("chat_template") == expected and summary["chat_template"] == (expected and "think")
    (tmp_path / "prefs" / "rejected").mkdir()
    (tmp_path / "prefs" / "rejected" / MANIFEST).write_text(
        json.dumps({"format": FORMAT, "chat": {"template": "instruct"}})
    )
    with pytest.raises(ConversionError, match=r"several chat templates \(instruct, think\)"):
        convert_to_hf(exports / "ckpt", tmp_path / "both")


@pytest.mark.slow  # ~10 s on 2 cores: a training run's checkpoint (init_train_state's compile)
def test_auto_on_a_training_runs_checkpoint(tmp_path):
    """`auto` reads a real run's experiment item; a tokenizer without the ChatML tokens is refused."""
    from tokenizers import Tokenizer, models

    from olmax.checkpoint.store import RunCheckpoints
    from olmax.config.checkpoint import CheckpointConfig
    from olmax.config.data import DataConfig
    from olmax.config.experiment import ExperimentConfig
    from olmax.config.mesh import MeshConfig
    from olmax.data.tokenize import FORMAT, MANIFEST
    from olmax.model.sharding import make_mesh
    from olmax.step.state import init_train_state

    small = ModelConfig(
        vocab_size=300, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, mlp_hidden=64, sliding_window=8
    )
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / MANIFEST).write_text(json.dumps({"format": FORMAT, "chat": {"template": "think"}}))
    data = DataConfig(seq_len=32, paths=(str(tmp_path / "sft"),))
    exp = ExperimentConfig(model=small, data=data, checkpoint=CheckpointConfig(keep=1))
    mesh = make_mesh(MeshConfig(data=1, fsdp=-1, tensor=1))
    ckpts = RunCheckpoints(tmp_path / "run" / "checkpoints", exp)
    ckpts.save(1, init_train_state(exp, mesh, jax.random.key(0)), {}, mesh)
    ckpts.close()
    run = tmp_path / "run" / "checkpoints"
    words = {f"t{i}": i for i in range(296)} | {"<|endoftext|>": 298, "<|pad|>": 299}
    for name, extra in (("chat", {"<|im_start|>": 296, "<|im_end|>": 297}), ("plain", {"t296": 296, "t297": 297})):
        Tokenizer(models.WordLevel(words | extra, unk_token="t0")).save(str(tmp_path / f"{name}.json"))
    summary = convert_to_hf(run, tmp_path / "hf", tokenizer=str(tmp_path / "chat.json"))
    config = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    assert summary["chat_template"] == "think" and config["chat_template"] == chat.template_text("think")
    with pytest.raises(ConversionError, match=r"has no <\|im_start\|> token"):
        convert_to_hf(run, tmp_path / "hf2", tokenizer=str(tmp_path / "plain.json"))


def test_read_conversations(tmp_path):
    one = CONVERSATIONS[0]
    (tmp_path / "one.json").write_text(json.dumps(one))
    (tmp_path / "many.json").write_text(json.dumps(CONVERSATIONS))
    (tmp_path / "rows.jsonl").write_text(json.dumps({"messages": one}) + "\n" + json.dumps(one) + "\n")
    assert read_conversations(tmp_path / "one.json") == [one]
    assert read_conversations(tmp_path / "many.json") == CONVERSATIONS
    assert read_conversations(tmp_path / "rows.jsonl") == [one, one]
    (tmp_path / "bad.json").write_text(json.dumps([[{"role": "robot", "content": "x"}]]))
    with pytest.raises(chat.ChatError, match=r"bad.json\[0\]\[0\]` has unknown role 'robot'"):
        read_conversations(tmp_path / "bad.json")
    result = CliRunner().invoke(app, ["generate", "--ckpt", "x", "--messages", str(tmp_path / "one.json")])
    assert result.exit_code == 2 and "--messages needs --chat" in result.output


@pytest.fixture(scope="module")
def hf_tokenizers(exports):
    from transformers import AutoTokenizer

    return {
        name: AutoTokenizer.from_pretrained(exports / name, local_files_only=True) for name in ("instruct", "think")
    }


@pytest.mark.parity
def test_autotokenizer_renders_olmaxs_text(hf_tokenizers):
    for name, tok in hf_tokenizers.items():
        for messages in CONVERSATIONS:
            for gen in (True, False):
                theirs = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
                assert theirs == chat.render(name, messages, "<|endoftext|>", gen), (name, messages, gen)


@pytest.mark.parity
def test_generate_chat_equals_transformers_generate(exports, hf_tokenizers, tmp_path):
    """Instruct only: the Think template differs in its rendering alone, which the test above checks."""
    import torch
    from transformers import AutoModelForCausalLM

    (tmp_path / "m.json").write_text(json.dumps(CONVERSATIONS[:3]))
    args = ["generate", "--ckpt", str(exports / "ckpt"), "--chat", "instruct", "--messages", str(tmp_path / "m.json")]
    result = CliRunner().invoke(app, [*args, "--max-new-tokens", "12", "--json", str(tmp_path / "gen.json")])
    assert result.exit_code == 0, result.output
    ours = json.loads((tmp_path / "gen.json").read_text())["results"]
    model = AutoModelForCausalLM.from_pretrained(exports / "instruct", local_files_only=True)
    tok = hf_tokenizers["instruct"]
    for row in ours:
        ids = tok.apply_chat_template(row["messages"], add_generation_prompt=True, return_tensors="pt")
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        assert ids[0].tolist() == row["prompt_ids"]
        with torch.no_grad():  # the same stops: EOS and <|im_end|>
            out = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=[100257, IM_END])
        assert out[0, ids.shape[1] :].tolist() == row["ids"], row["messages"]
        assert row["text"] in result.output and row["prompt"] not in result.output  # the reply alone
    assert [r["finish"] for r in ours] == ["eos", "length", "eos"] and ours[0]["ids"][-1] == IM_END


# -- lm-eval --------------------------------------------------------------------------------------

# Two generate_until tasks with a one-shot example (a multi-turn chat under --apply_chat_template);
# the second starts the answer with a gen_prefix, which lm-eval renders without the generation prompt.
TASK_YAML = """task: {name}
dataset_path: json
dataset_kwargs: {{data_files: {{validation: {data}}}}}
validation_split: validation
fewshot_split: validation
num_fewshot: 1
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
{extra}generation_kwargs: {{until: ["\\n\\n"], max_gen_toks: 8, do_sample: false}}
metric_list: [{{metric: exact_match}}]
"""
DOCS = [
    {"question": "What is the capital of France?", "answer": "Paris"},
    {"question": "What colour is the sky?", "answer": "Blue"},
    {"question": "How many legs has a cat?", "answer": "Four"},
]


def test_lm_eval_args():
    from olmax.cli.generation import lm_eval_args

    base = ["--model", "olmax", "--model_args", "ckpt=C", "--tasks", "t"]
    assert lm_eval_args([*base, "--apply_chat_template", "think", "--system-instruction", "Be brief."]) == [
        *base,
        "--apply_chat_template",
        "think",
        "--system_instruction",
        "Be brief.",
        "--model_args",
        "chat_template=think",
    ]
    assert lm_eval_args(["--model=olmax", "--apply_chat_template=instruct"])[-2:] == [
        "--model_args",
        "chat_template=instruct",
    ]
    for args in ([*base, "--apply_chat_template"], ["--model", "hf", "--apply_chat_template", "think"]):
        assert lm_eval_args(args) == args  # the model's own template, or another model's business


@pytest.fixture(scope="module")
def chat_tasks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("chat_tasks")
    (tmp / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    for name, extra in (("chat_plain", ""), ("chat_prefix", 'gen_prefix: "Answer:"\n')):
        (tmp / f"{name}.yaml").write_text(TASK_YAML.format(name=name, data=tmp / "docs.jsonl", extra=extra))
    return tmp


@pytest.fixture(scope="module")
def olmax_lm(exports):
    from olmax.evals.lm_eval_adapter import OlmaxLM

    return OlmaxLM(str(exports / "ckpt"), batch_size=3, max_length=256, chat_template="instruct")


@pytest.mark.parity
def test_adapter_renders_as_hflm(olmax_lm, hf_tokenizers):
    """lm-eval 0.4.13's HFLM.apply_chat_template: the export's template, and continue_final_message
    when there is no generation prompt (a gen_prefix as the final assistant message)."""
    tok = hf_tokenizers["instruct"]
    histories = [CONVERSATIONS[1], [*CONVERSATIONS[1], {"role": "assistant", "content": "Answer:"}]]
    for history, gen in zip(histories, (True, False)):
        theirs = tok.apply_chat_template(
            history, tokenize=False, add_generation_prompt=gen, continue_final_message=not gen
        )
        assert olmax_lm.apply_chat_template(history, gen) == theirs
    assert olmax_lm.chat_template(True) == tok.chat_template
    assert olmax_lm.tokenizer_name == "dolma2__olmo3_instruct"
    with pytest.raises(ValueError, match="needs the olmax model's chat_template"):
        olmax_lm.chat_template("think")


@pytest.mark.slow  # ~60 s on 2 cores: lm-eval's evaluation twice, and the sampling compiles
@pytest.mark.parity
def test_lm_eval_chat_requests_and_generations_match_hf(exports, olmax_lm, chat_tasks):
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    tasks = TaskManager(include_path=str(chat_tasks), include_defaults=False)  # not lm-eval's ~14k task files
    hf = HFLM(pretrained=str(exports / "instruct"), device="cpu", dtype="float32", batch_size=3, max_length=256)
    samples = {}
    for key, lm in (("ours", olmax_lm), ("hf", hf)):
        out = lm_eval.simple_evaluate(
            model=lm,
            tasks=["chat_plain", "chat_prefix"],
            task_manager=tasks,
            apply_chat_template=True,
            system_instruction="Answer briefly.",
            limit=3,
            log_samples=True,
            bootstrap_iters=0,
        )
        samples[key] = {t: [(s["arguments"], s["resps"]) for s in rows] for t, rows in out["samples"].items()}
    assert samples["ours"] == samples["hf"]  # the rendered requests and the greedy generations
    (plain_args, _), (prefix_args, _) = samples["ours"]["chat_plain"][0], samples["ours"]["chat_prefix"][0]
    plain, prefix = plain_args[0][0], prefix_args[0][0]  # each request's (context, gen_kwargs)
    assert plain.startswith("<|im_start|>system\nAnswer briefly. You do not") and plain.count("<|im_start|>user") == 2
    assert plain.endswith("<|im_start|>assistant\n") and prefix.endswith("<|im_start|>assistant\nAnswer:")

    # sampled requests (do_sample), mixed with greedy ones in one call: reproducible, and top_k=1 is greedy
    greedy = {"until": ["\n\n"], "max_gen_toks": 8, "do_sample": False}
    hot = {**greedy, "do_sample": True, "temperature": 2.0}
    args = [(plain, greedy), (plain, hot), (plain, hot), (prefix, {**hot, "top_k": 1})]
    run = lambda: olmax_lm.generate_until([Instance("generate_until", {}, a, i) for i, a in enumerate(args)])
    first = run()
    alone = olmax_lm.generate_until([Instance("generate_until", {}, (prefix, greedy), 0)])[0]
    assert first == run() and first[3] == alone
    assert first[1] != first[2]  # each request its own draws


@pytest.mark.slow  # ~1 min: a subprocess that indexes lm-eval's own task files
@pytest.mark.parity
def test_olmax_lm_eval_applies_the_chat_template(exports, chat_tasks, tmp_path):
    src = Path(__file__).resolve().parents[2] / "src"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    cmd = [
        *(sys.executable, "-m", "olmax.cli", "lm-eval", "--model", "olmax"),
        *("--model_args", f"ckpt={exports / 'ckpt'},max_length=256", "--tasks", "chat_plain"),
        *("--include_path", str(chat_tasks), "--limit", "2", "--output_path", str(tmp_path), "--log_samples"),
        *("--apply_chat_template", "think", "--system-instruction", "Answer briefly."),
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    [results] = list(tmp_path.rglob("results_*.json"))
    assert json.loads(results.read_text())["chat_template"] == chat.template_text("think")
    [samples] = list(tmp_path.rglob("samples_chat_plain_*.jsonl"))
    context = json.loads(samples.read_text().splitlines()[0])["arguments"]["gen_args_0"]["arg_0"]
    assert context.startswith("<|im_start|>system\nAnswer briefly.") and context.endswith("assistant\n<think>")


# lm-eval's own gsm8k and ifeval configs (lm-eval 0.4.13, lm_eval/tasks/gsm8k/gsm8k.yaml and
# lm_eval/tasks/ifeval/ifeval.yaml), included whole: only the name and the dataset (local rows in the
# hub datasets' schemas, made up here) change. `include` resolves ifeval's `!function utils...` against
# the included file's directory (lm_eval/tasks/_yaml_loader.py, load_yaml), so its utils.py scores.
# dataset_name goes too: gsm8k's `main` is a hub config, which the json builder does not have.
REAL_TASK_YAML = """include: {config}
task: {name}
dataset_path: json
dataset_name: null
dataset_kwargs: {{data_files: {files}}}
"""
# gsm8k: openai/gsm8k's `main` columns; the answer's last line is `#### N` (the task's strict filter)
GSM8K_TRAIN = [
    ("Ann has 3 pens and buys 2 more. How many pens does she have?", "3+2=<<3+2=5>>5\n#### 5"),
    ("A box holds 4 eggs. How many eggs are in 3 boxes?", "4*3=<<4*3=12>>12\n#### 12"),
    ("Tom had 10 coins and spent 4. How many are left?", "10-4=<<10-4=6>>6\n#### 6"),
    ("Six birds sit on a wire and 2 fly away. How many stay?", "6-2=<<6-2=4>>4\n#### 4"),
    ("Each bag costs $2. What do 5 bags cost?", "2*5=<<2*5=10>>10\n#### 10"),
    ("Mia reads 7 pages a day. How many pages does she read in 2 days?", "7*2=<<7*2=14>>14\n#### 14"),
]
GSM8K_TEST = [
    ("Sam has 8 apples and gives away 3. How many remain?", "8-3=<<8-3=5>>5\n#### 5"),
    ("A car has 4 wheels. How many wheels do 2 cars have?", "4*2=<<4*2=8>>8\n#### 8"),
    ("Lee saves $600 a year. How much does he save in 2 years?", "600*2=<<600*2=1200>>1200\n#### 1,200"),
]
# ifeval: google/IFEval's columns, instructions whose checks need no NLTK data (punkt_tab: see
# docs/rewards.md) and no langdetect (which draws at random unless seeded)
IFEVAL_DOCS = [
    ("Describe a rainy morning in a small town without using any commas.", ["punctuation:no_comma"], [{}]),
    (
        "Write a note to a neighbour about a lost cat. Use the words grey and collar, and end with 'Thank you.'",
        ["keywords:existence", "startend:end_checker"],
        [{"keywords": ["grey", "collar"]}, {"end_phrase": "Thank you."}],
    ),
    (
        "Give advice for a first day at a new job in at least 40 words, with 2 sections in *markdown*.",
        ["length_constraints:number_words", "detectable_format:number_highlighted_sections"],
        [{"num_words": 40, "relation": "at least"}, {"num_highlights": 2}],
    ),
    (
        "Write a poem about the sea with a title in double angular brackets. Do not use the words blue or wave.",
        ["detectable_format:title", "keywords:forbidden_words"],
        [{}, {"forbidden_words": ["blue", "wave"]}],
    ),
]


@pytest.fixture(scope="module")
def real_tasks(tmp_path_factory):
    lm_eval = pytest.importorskip("lm_eval")
    tasks = Path(lm_eval.__file__).parent / "tasks"
    tmp = tmp_path_factory.mktemp("real_tasks")
    rows = {
        "gsm8k_train": [{"question": q, "answer": a} for q, a in GSM8K_TRAIN],
        "gsm8k_test": [{"question": q, "answer": a} for q, a in GSM8K_TEST],
        "ifeval": [
            {"key": 1000 + i, "prompt": p, "instruction_id_list": ids, "kwargs": kw}
            for i, (p, ids, kw) in enumerate(IFEVAL_DOCS)
        ],
    }
    for name, docs in rows.items():
        (tmp / f"{name}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    # the splits each config names: gsm8k train (few-shot) and test, ifeval train
    gsm8k = {"train": str(tmp / "gsm8k_train.jsonl"), "test": str(tmp / "gsm8k_test.jsonl")}
    for name, config, files in (
        ("gsm8k_local", tasks / "gsm8k" / "gsm8k.yaml", gsm8k),
        ("ifeval_local", tasks / "ifeval" / "ifeval.yaml", {"train": str(tmp / "ifeval.jsonl")}),
    ):
        (tmp / f"{name}.yaml").write_text(REAL_TASK_YAML.format(config=config, name=name, files=json.dumps(files)))
    return tmp


@pytest.mark.slow  # ~23 s alone on 2 cores (12 s after its neighbour, which pays the compiles and imports)
@pytest.mark.parity
def test_lm_eval_gsm8k_and_ifeval_match_hf(exports, olmax_lm, real_tasks):
    """lm-eval's real gsm8k (5-shot, multi-turn under the chat template, its regex filters and
    exact_match) and ifeval (0-shot, its own process_results) on local rows: every logged sample
    (request, generation, filtered answer, per-sample metrics) and the task figures of the olmax model
    equal lm-eval's `hf` model's. The 5-shot contexts are longer than the model's 256 positions less the
    32 new tokens: both left-truncate them."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    tasks = TaskManager(include_path=str(real_tasks), include_defaults=False)
    # One request per batch: HFLM's stop criteria (lm_eval/models/utils_hf.py, MultiTokenEOSCriteria) end
    # a batch only once every row shows the stop string, and gsm8k's `<|im_end|>` is a special token that
    # the decoded answer skips, so a row that emitted it keeps the text its batch generated after it. Alone,
    # a request ends at it; olmax ends each row at its own stop at any batch size.
    hf = HFLM(pretrained=str(exports / "instruct"), device="cpu", dtype="float32", batch_size=1, max_length=256)
    out = {}
    for key, lm in (("ours", olmax_lm), ("hf", hf)):
        out[key] = lm_eval.simple_evaluate(
            model=lm,
            tasks=["gsm8k_local", "ifeval_local"],
            task_manager=tasks,
            apply_chat_template=True,
            # as `--gen_kwargs max_gen_toks=32`: ifeval asks for 1280 new tokens, gsm8k for HFLM's default
            # 256, at least this 256-position model's window, which HFLM refuses (no room for the context)
            gen_kwargs={"max_gen_toks": 32},
            limit=4,
            log_samples=True,
            bootstrap_iters=0,
        )
    assert out["ours"]["samples"] == out["hf"]["samples"]
    assert out["ours"]["results"] == out["hf"]["results"]
    samples, results = out["ours"]["samples"], out["ours"]["results"]
    # a sample per document and filter: gsm8k's strict-match and flexible-extract, ifeval's none
    assert [len(samples["gsm8k_local"]), len(samples["ifeval_local"])] == [6, 4]
    context = samples["gsm8k_local"][0]["arguments"][0][0]  # the first request's (context, gen_kwargs)
    assert context.count("<|im_start|>user\nQuestion: ") == 6  # five shots and the question
    assert context.endswith("Answer:<|im_end|>\n<|im_start|>assistant\n")
    assert len(olmax_lm.tok_encode(context)) > 256 - 32
    assert {"exact_match,strict-match", "exact_match,flexible-extract"} <= results["gsm8k_local"].keys()
    ifeval = {f"{level}_level_{kind}_acc,none" for level in ("prompt", "inst") for kind in ("strict", "loose")}
    assert ifeval <= results["ifeval_local"].keys()
