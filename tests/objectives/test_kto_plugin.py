"""KTO (TRL 1.16.0's KTOTrainer, loss_type "kto") trained as an objective outside olmax, with its own
kind of data: docs/extending.md's `olmax_kto.py`, installed exactly as the page shows it, as
`olmax.objectives` and `olmax.data_kinds` entry points of a distribution on sys.path.

Parity: a tiny model with seeded weights (`fixture_params`: numpy's PCG64, so every host makes the
same) as policy, the same weights scaled by 1 + 0.05 N(0, 1) as reference; eight completions of a
word-level vocabulary with their labels (`fixture_rows`). TRL tokenizes them, pairs each with the
completion before it in its batch of four for the KL estimate, and computes its loss on each of its
two sequential batches with its KL rows under no_grad; its loss, KL estimate (one batch clamps at 0),
mean rewards, gradient norm and the rows it built are stored in tests/fixtures/kto_trl_reference.json
(`python tests/objectives/test_kto_plugin.py` writes it; the slow test checks it is still TRL's).
olmax reads the same documents from `olmax tokenize --chat`'s files (labels in their item fields),
through the plug-in's item source, olmax's loader and reference pass and the jitted step on 2 devices.
Bounds (fp32): TOL = 1e-5 per summed token, as tests/objectives/test_dpo.py (two fp32 forwards differ
by up to ~3e-6 nats a token): a row's log-ratio is allowed TOL per token it sums, the KL estimate and
a mean reward the mean of their rows' allowances (times beta for a reward), the loss its weight times
beta / 4 (the steepest slope of 1 - sigmoid(beta x)) times its log-ratio's and the KL's; the gradient
norm TOL relative to itself. The measured gaps are 25 times or more below each bound (2e-6 at most).

Then the plug-in end to end: rows with a `label` through `olmax tokenize --chat` and `olmax train`,
`olmax status` naming its loss, and `olmax compile-check` with no data at all; its KL rows cost a
forward and no backward (XLA's FLOP count); a metric an objective returns without naming it stops the
run at its first step."""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import sys
from fractions import Fraction
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from olmax.config.checkpoint import EvalConfig
from olmax.config.data import DataConfig
from olmax.config.data_kind import plugin_kind
from olmax.config.experiment import experiment_type
from olmax.config.model import ModelConfig
from olmax.config.objective import plugin
from olmax.config.optimizer import OptimizerConfig
from olmax.config.schedule import ScheduleConfig
from olmax.config.trainer import TrainerConfig
from olmax.data.item_fields import FieldWriter
from olmax.data.tokenize import FORMAT

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "kto_trl_reference.json"
VOCAB, EOS, PAD = 300, 298, 299  # a word-level vocabulary: "t0".."t297", then its EOS and padding
MODEL = ModelConfig(
    vocab_size=VOCAB,
    d_model=32,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=8,
    mlp_hidden=64,
    sliding_window=8,  # one windowed layer, one global
    compute_dtype="float32",
)
GROUP, ROWS, SEQ = 4, 8, 32  # TRL's per-device batch (kto.kl_group); completions; data.seq_len
SETTINGS = {"beta": 0.5, "desirable_weight": 1.0, "undesirable_weight": 1.33}
LABELS = [True, False, True, True, False, False, True, False]
TOL = 1e-5


# ----------------------------------------------------------------------------------------------
# The inputs, made the same on every host


def fixture_rows(seed: int = 0) -> list[dict]:
    """TRL's unpaired preference rows: a prompt, a completion (TRL appends EOS) and a label."""
    rng = np.random.default_rng(seed)
    words = lambda n: " ".join(f"t{k}" for k in rng.integers(0, EOS, n))  # noqa: E731
    lengths = [(int(rng.integers(3, 9)), int(rng.integers(2, 7))) for _ in range(ROWS)]
    return [
        {"prompt": words(p), "completion": " " + words(c), "label": label} for (p, c), label in zip(lengths, LABELS)
    ]


def fixture_params(seed: int = 0, reference_seed: int = 3) -> tuple[dict, dict]:
    """(policy, reference) numpy parameters of MODEL: O(1) activations and logits spread over several
    nats; the reference is the policy scaled by 1 + 0.05 N(0, 1) per weight, drawn from its own seed (3:
    one batch's KL estimate is positive, +0.26 nats, and the other's clamps at 0 from -0.54)."""
    from olmax.model.olmo3 import abstract_params

    rng = np.random.default_rng(seed)
    shapes = abstract_params(MODEL)

    def draw(path, leaf):
        name = jax.tree_util.keystr(path)
        if len(leaf.shape) <= 2 and "norm" in name:
            return rng.uniform(0.5, 1.5, leaf.shape).astype(np.float32)
        scale = 1.0 if "embed" in name else (2.0 if "lm_head" in name else 1.0) / math.sqrt(MODEL.d_model)
        return (rng.normal(0.0, scale, leaf.shape)).astype(np.float32)

    policy = jax.tree_util.tree_map_with_path(draw, shapes)
    rng = np.random.default_rng(reference_seed)
    reference = jax.tree.map(lambda a: (a * (1 + 0.05 * rng.normal(size=a.shape))).astype(np.float32), policy)
    return policy, reference


def params_digest(params: dict) -> str:
    h = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        h.update(jax.tree_util.keystr(path).encode() + np.ascontiguousarray(leaf).tobytes())
    return h.hexdigest()


# ----------------------------------------------------------------------------------------------
# TRL's side


def trl_reference() -> dict:
    """TRL's tokenized rows and, per sequential batch of GROUP, its loss, KL estimate, mean rewards,
    gradient norm and KL rows."""
    import torch
    from datasets import Dataset
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import Olmo3Config, Olmo3ForCausalLM, PreTrainedTokenizerFast
    from trl import KTOConfig, KTOTrainer

    from olmax.convert.hf import HF_NAMES, hf_config
    from olmax.convert.tensors import torch_tensors

    words = {f"t{i}": i for i in range(EOS)} | {"<|endoftext|>": EOS, "<|pad|>": PAD}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>", pad_token="<|pad|>")
    hf = Olmo3Config(**hf_config(MODEL, dtype="float32", special_tokens={"eos_token_id": EOS, "pad_token_id": PAD}))

    def hf_model(params):
        model = Olmo3ForCausalLM(hf)
        model.load_state_dict({k: torch.tensor(v) for k, v in torch_tensors(params, MODEL, HF_NAMES, "float32")})
        return model

    policy, reference = fixture_params()
    args = KTOConfig(
        output_dir="/tmp/olmax-kto-trl",
        per_device_train_batch_size=GROUP,
        max_length=None,
        use_cpu=True,
        bf16=False,
        report_to="none",
        **SETTINGS,
    )
    trainer = KTOTrainer(
        model=hf_model(policy),
        ref_model=hf_model(reference),
        args=args,
        train_dataset=Dataset.from_list(fixture_rows()),
        processing_class=tokenizer,
    )
    data = trainer.train_dataset
    examples = [
        {k: data[i][k] for k in ("prompt_ids", "completion_ids", "KL_completion_ids", "label")} for i in range(ROWS)
    ]
    batches = []
    for batch in trainer.get_train_dataloader():
        trainer.model.zero_grad()
        loss = trainer.compute_loss(trainer.model, batch)
        loss.backward()
        logged = {k: v[-1] for k, v in trainer._metrics["train"].items()}
        norm = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in trainer.model.parameters()))
        kl_rows = [ids[mask.bool()].tolist() for ids, mask in zip(batch["KL_input_ids"], batch["KL_attention_mask"])]
        batches.append(
            {
                "loss": loss.item(),
                "kl": logged["kl"],
                "rewards/chosen": logged["rewards/chosen"],
                "rewards/rejected": logged["rewards/rejected"],
                "grad_norm": norm,
                "kl_rows": kl_rows,
            }
        )
    return {"settings": SETTINGS, "params_sha256": params_digest(policy), "examples": examples, "batches": batches}


# ----------------------------------------------------------------------------------------------
# olmax's side


@pytest.fixture
def kto(tmp_path, monkeypatch):
    """docs/extending.md's KTO module and a dist-info declaring its objective and data kind, on sys.path."""
    from test_extending import plugin_module

    (tmp_path / "olmax_kto.py").write_text(plugin_module("olmax_kto.py"))
    dist = tmp_path / "olmax_kto-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: olmax-kto\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[olmax.objectives]\nkto = olmax_kto:KTO\n\n[olmax.data_kinds]\nkto_completions = olmax_kto:KTOCompletions\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    plugin.cache_clear(), plugin_kind.cache_clear(), experiment_type.cache_clear()
    yield tmp_path
    plugin.cache_clear(), plugin_kind.cache_clear(), experiment_type.cache_clear()
    sys.modules.pop("olmax_kto", None)


def write_chat_dir(directory: Path, docs: list[tuple[list[int], list[bool]]], rows: list[dict]) -> Path:
    """`olmax tokenize --chat`'s files for documents given as (token ids, label mask), with the rows'
    item fields (the word-level vocabulary is not a tokenizer olmax loads, so the parts are written here)."""
    directory.mkdir(parents=True)
    ids = np.concatenate([np.asarray(d, np.uint16) for d, _ in docs])
    mask = np.concatenate([np.asarray(m, bool) for _, m in docs])
    ends = np.cumsum([len(d) for d, _ in docs])
    (directory / "token_ids_part_0000.npy").write_bytes(ids.tobytes())
    (directory / "labels_mask_part_0000.npy").write_bytes(mask.tobytes())
    offsets = "".join(f"{e - len(d)},{e}\n" for (d, _), e in zip(docs, ends.tolist()))
    (directory / "token_ids_part_0000.csv.gz").write_bytes(gzip.compress(offsets.encode()))
    fields = FieldWriter()
    for row in rows:
        fields.add(row)
    tokenizer = {"name": "word-level", "identity": "test", "vocab_size": VOCAB, "eos_token_id": EOS}
    manifest = {
        "format": FORMAT,
        "tokenizer": {**tokenizer, "pad_token_id": PAD, "bos_token_id": None, "dtype": "uint16"},
        "dtype": "uint16",
        "shards": [
            {
                "path": "token_ids_part_0000.npy",
                "label_mask": "labels_mask_part_0000.npy",
                "tokens": len(ids),
                "documents": len(docs),
                "sha256": hashlib.sha256(ids.tobytes()).hexdigest(),
                "label_mask_sha256": hashlib.sha256(mask.tobytes()).hexdigest(),
            }
        ],
        "chat": {"written": len(docs), **fields.write(directory)},
    }
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory


def olmax_config(directory: Path, work_dir: Path, **trainer):
    section = plugin("kto").config
    return experiment_type("kto")(
        name="kto-parity",
        model=MODEL,
        data=DataConfig(
            paths=(str(directory),),
            seq_len=SEQ,
            vocab_size=VOCAB,
            eos_token_id=EOS,
            pad_token_id=PAD,
            work_dir=str(work_dir),
        ),
        optimizer=OptimizerConfig(z_loss=0.0, skip_step=False),
        schedule=ScheduleConfig(name="constant", warmup_steps=0),
        trainer=TrainerConfig(global_batch=GROUP, max_steps=2, objective="kto", loss_chunk=8, **trainer),
        eval=EvalConfig(every=0),
        kto=section(kl_group=GROUP, **SETTINGS),
    )


def olmax_side(stored: dict, tmp_path: Path) -> list[tuple[dict, dict, np.ndarray, np.ndarray]]:
    """(the step's metrics, the batch, each item's summed tokens, its rows' tokens) of each global batch
    of one epoch: the plug-in's source over TRL's tokenized rows written as tokenize's files, olmax's
    reference pass and loader, the jitted step on 2 devices (micro-batch = the batch: TRL's KL estimate
    is its batch's)."""
    from olmax.data.pairs import PairLoader
    from olmax.model.sharding import make_mesh
    from olmax.step.state import init_train_state
    from olmax.step.train_step import make_train_step
    from olmax.trainer.reference import open_pairs, params_fingerprint, reference_logps_cache

    docs, rows = [], []
    for ex in stored["examples"]:
        docs.append(
            (
                ex["prompt_ids"] + ex["completion_ids"],
                [False] * len(ex["prompt_ids"]) + [True] * len(ex["completion_ids"]),
            )
        )
        rows.append({"messages": [], "label": ex["label"]})
    directory = write_chat_dir(tmp_path / "completions", docs, rows)
    cfg = olmax_config(directory, tmp_path / "cache")
    mesh = make_mesh(cfg.mesh, jax.devices()[:2])
    policy, reference = (jax.tree.map(jnp.asarray, p) for p in fixture_params())
    source = open_pairs(cfg, mesh)
    logps = reference_logps_cache(
        cfg, mesh, source, lambda: reference, params_fingerprint(reference), log=lambda _: None
    )
    objective = plugin("kto")()
    loader = iter(PairLoader(cfg.data, source, logps, GROUP, fields=objective.data_fields, objective="kto"))
    step = make_train_step(cfg, mesh)
    out = []
    with jax.set_mesh(mesh):
        for _ in range(ROWS // GROUP):
            batch = next(loader)
            state = init_train_state(cfg, mesh, jax.random.key(0), params=policy)
            _, metrics = step(state, {k: jnp.asarray(v) for k, v in batch.items() if k != "index"})
            out.append(({k: float(v) for k, v in metrics.items()}, batch))
    return out


def allowances(batch: dict, beta: float) -> dict[str, float]:
    """The module doc's bounds for one batch, from its own masks: TOL per token a row sums."""
    tokens = batch["response_mask"][:, :, 1:].sum(axis=2)  # (items, 2): the tokens each row sums
    own, other = TOL * tokens[:, 0], TOL * tokens[:, 1]  # a completion's log-ratio, its KL row's
    kl = float(np.mean(other))
    weight = max(SETTINGS["desirable_weight"], SETTINGS["undesirable_weight"])
    chosen = batch["label"]
    return {
        "loss": weight * beta / 4 * (float(np.mean(own)) + kl),  # 1 - sigmoid(beta x): slope <= beta / 4
        "kl": kl,
        "rewards/chosen": beta * float(np.mean(own[chosen])),
        "rewards/rejected": beta * float(np.mean(own[~chosen])),
    }


def check_against(stored: dict, results) -> None:
    beta = SETTINGS["beta"]
    seen = set()
    for metrics, batch in results:
        group = int(batch["index"][0]) // GROUP
        assert sorted(batch["index"].tolist()) == list(range(GROUP * group, GROUP * (group + 1)))  # a whole run
        seen.add(group)
        theirs = stored["batches"][group]
        order = np.argsort(batch["index"])
        for row, trl_row in zip(batch["input_ids"][order], theirs["kl_rows"]):  # the same mismatched rows
            assert row[1][: len(trl_row)].tolist() == trl_row and np.all(row[1][len(trl_row) :] == PAD)
        labels = [ex["label"] for ex in stored["examples"][GROUP * group : GROUP * (group + 1)]]
        assert batch["label"][order].tolist() == labels  # the labels came from the files, with their items
        bound = allowances(batch, beta)
        for key, allowed in bound.items():
            assert abs(metrics[key] - theirs[key]) <= allowed, (key, metrics[key], theirs[key], allowed)
        assert abs(metrics["grad_norm"] - theirs["grad_norm"]) <= TOL * theirs["grad_norm"]
    assert seen == {0, 1}


def test_matches_stored_trl_values(kto, tmp_path):
    stored = json.loads(FIXTURE.read_text())
    assert stored["settings"] == SETTINGS and stored["params_sha256"] == params_digest(fixture_params()[0])
    kls = [b["kl"] for b in stored["batches"]]
    assert min(kls) == 0.0 and max(kls) > 0.01  # one batch's estimate clamps, the other enters the loss
    assert all(0.05 < b["loss"] < 1.0 for b in stored["batches"])  # neither saturated nor degenerate
    check_against(stored, olmax_side(stored, tmp_path))


@pytest.mark.slow  # TRL + torch imports (~8 s) and two HF models; the default test holds the claim
@pytest.mark.parity
def test_matches_trl_kto_loss(kto, tmp_path):
    pytest.importorskip("trl")
    fresh, stored = trl_reference(), json.loads(FIXTURE.read_text())
    assert fresh["examples"] == stored["examples"] and fresh["params_sha256"] == stored["params_sha256"]
    for ours, theirs in zip(stored["batches"], fresh["batches"]):  # the fixture is TRL's
        assert ours["kl_rows"] == theirs["kl_rows"]
        for key in ("loss", "kl", "rewards/chosen", "rewards/rejected", "grad_norm"):
            assert ours[key] == pytest.approx(theirs[key], rel=1e-6, abs=1e-7), key
    check_against(fresh, olmax_side(fresh, tmp_path))


# ----------------------------------------------------------------------------------------------
# The plug-in in use


@pytest.fixture(scope="module")
def labelled_rows(tmp_path_factory) -> Path:
    """16 conversations through `olmax tokenize --chat`, each row with its `label`: in every run of four
    (kto.kl_group) one desirable completion and three undesirable ones. Tokenized once for the module's
    tests (tokenize writes item fields of any name: no plug-in needed)."""
    from olmax.data.chat_files import tokenize_chat

    tmp_path = tmp_path_factory.mktemp("kto_rows")

    rows = []
    for i in range(16):
        answer = f"{2 * i}." if i % 4 == 0 else f"{i + 1}, I think so."
        messages = [{"role": "user", "content": f"What is {i} plus {i}?"}, {"role": "assistant", "content": answer}]
        rows.append({"messages": messages, "label": i % 4 == 0})
    src = tmp_path / "kto.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tokenize_chat([src], tmp_path / "completions", "instruct")
    return tmp_path / "completions"


KTO_RUN = [
    "trainer.objective=kto",
    "kto.kl_group=4",
    "kto.undesirable_weight=2.0",
    "trainer.global_batch=8",
    "optimizer.z_loss=0",
    "eval.every=0",
]


def test_kto_trains_from_labelled_rows_and_compiles_without_data(kto, labelled_rows):
    """At the first step the policy is its reference: every log-ratio and the KL estimate are 0, so each
    item's loss is its weight / 2, and the step's loss, (1 + 3 x 2) / 4 / 2, says the labels reached it
    from the rows (all desirable would give 0.5, all undesirable 1.0). compile-check compiles the same
    step with no data at all."""
    from small_run import SMALL
    from typer.testing import CliRunner

    from olmax.cli import app
    from olmax.config.io import apply_overrides, to_yaml
    from olmax.config.recipes import get_recipe
    from olmax.rundir.report import MetricsReader, run_status
    from olmax.trainer.run import train

    run = SMALL + KTO_RUN + ["trainer.max_steps=2"]
    r = CliRunner().invoke(app, ["compile-check", "--recipe", "tiny", "--devices", "8", *run, "data.paths=[/no/data]"])
    assert r.exit_code == 0, r.output

    data = labelled_rows
    cfg = apply_overrides(get_recipe("tiny"), run + [f"data.paths=[{data}]", f"data.work_dir={kto / 'cache'}"])
    assert cfg.rows_per_step == 16 and cfg.kto.undesirable_weight == 2.0  # two rows an item
    run_dir = kto / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    rows = train(cfg, run_dir, devices=jax.devices(), progress=False)  # compile-check's devices: its step, cached
    first = rows[0]
    assert first["train/KTO loss"] == pytest.approx(7 / 8, abs=1e-5) and first["train/kl"] == pytest.approx(0, abs=1e-5)
    assert rows[1]["train/KTO loss"] < first["train/KTO loss"]  # it learns
    status = run_status(str(run_dir), MetricsReader(str(run_dir), window=4))
    assert status["loss_name"] == "KTO loss" and status["loss"] == rows[-1]["train/KTO loss"]
    reference = data / "reference_logps" / "logps.npy"
    assert np.load(reference).shape == (16, 2)  # both rows' reference log-probs, cached beside the data


def test_data_order_reports_the_items_of_the_plugins_data_kind(kto, labelled_rows):
    """`olmax data order` asks the objective's data kind for its items: with trainer.objective=kto, the
    plug-in source's completions, each rank's ids at each step the loader's batch `index` (whole runs of
    kto.kl_group in a batch) and, with tokens, each row the loader gives."""
    from small_run import SMALL
    from typer.testing import CliRunner

    from olmax.cli import app
    from olmax.config.io import apply_overrides
    from olmax.config.recipes import get_recipe
    from olmax.data.pairs import PairLoader, item_source

    run = SMALL + KTO_RUN + [f"data.paths=[{labelled_rows}]", f"data.work_dir={kto / 'cache'}"]
    out = kto / "order.json"
    args = ["data", "order", "--recipe", "tiny", *run, "--steps", "1:3", "--dp-size", "2", "--with-tokens"]
    r = CliRunner().invoke(app, [*args, "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "completions 16  batches/epoch 2" in r.output
    report = json.loads(out.read_text())
    assert (report["kind"], report["instances"], report["global_batch"]) == ("completions", 16, 8)
    cfg = apply_overrides(get_recipe("tiny"), run)
    source = item_source(cfg)
    assert report["fingerprint"] == source.fingerprint
    for rank in (0, 1):
        for step, batch in zip(report["steps"], PairLoader(cfg.data, source, None, 8, dp_rank=rank, dp_size=2)):
            row = step["ranks"][rank]
            assert row["ids"] == batch["index"].tolist()
            assert [[r["tokens"] for r in item["rows"]] for item in row["instances"]] == batch["input_ids"].tolist()
            assert [[r["label_mask"] for r in item["rows"]] for item in row["instances"]] == (
                batch["response_mask"].tolist()
            )
    for step in report["steps"]:
        ids = sorted(i for row in step["ranks"] for i in row["ids"])
        assert ids == sorted(4 * g + k for g in {i // 4 for i in ids} for k in range(4))  # whole runs


def test_statistic_rows_run_forward_only():
    """The FLOPs XLA's cost analysis counts in the program JAX lowers for the gradient of a loss over 4
    trained rows, alone and scaled by a statistic of 4 more rows (statistic_logps, as KTO's KL estimate
    enters its loss): those rows add about one forward, a third of the trained rows' forward and backward
    (0.33 measured; 0.34 in the compiled program, whose optimisations only remove work), not a backward
    too (1.26 without the stop_gradient). The lowered program is counted: compiling the two would cost
    some 5 s of CPU; test_the_flops_count_a_statistic_row_as_a_forward counts compiled steps."""
    from olmax.model.olmo3 import abstract_params
    from olmax.objectives.logps import response_logps, statistic_logps

    model = ModelConfig(vocab_size=64, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, mlp_hidden=32)
    params = abstract_params(model)  # XLA counts FLOPs from shapes: no weights to make
    ids = np.random.default_rng(1).integers(0, 64, (8, 16), dtype=np.int32)
    mask = np.ones((8, 16), bool)
    trained = lambda p: jnp.sum(response_logps(p, ids[:4], mask[:4], model, chunk=0).total)  # noqa: E731
    statistic = lambda p: jnp.mean(statistic_logps(p, ids[4:], mask[4:], model, chunk=0).total)  # noqa: E731
    losses = {"trained": trained, "scaled by the statistic": lambda p: trained(p) * statistic(p)}
    flops = {k: jax.jit(jax.grad(f)).lower(params).cost_analysis()["flops"] for k, f in losses.items()}
    added = flops["scaled by the statistic"] - flops["trained"]
    assert 0.2 * flops["trained"] < added < 0.5 * flops["trained"], flops


def test_the_flops_count_a_statistic_row_as_a_forward(kto, tmp_path, monkeypatch):
    """kto's section declares one of an item's two rows a statistic row. compile-check, `olmax flops` and
    the trainer's MFU count it as a forward, so a KTO step is 4/6 of the DPO step of the same items (2N
    of a trained row's 6N a token), not the DPO step's count. XLA agrees: in the matmuls of the two
    compiled steps (their HLO's dots, no loop left) a statistic row costs a quarter to a third of a
    trained row (one forward, against a trained row's forward and backward, 3x, plus the output layer
    it recomputes, at most 4x); through the backward pass it would cost as much."""
    from hlo_dots import hlo_dot_flops
    from small_run import SMALL
    from typer.testing import CliRunner

    import olmax.fit.compile_check
    from olmax.cli import app
    from olmax.config.io import apply_overrides
    from olmax.config.recipes import get_recipe
    from olmax.fit.compile_check import compile_report
    from olmax.fit.compiler import compile_step
    from olmax.fit.flops import exact_step_flops
    from olmax.trainer.metrics import MetricsLog

    run = SMALL + ["model.vocab_size=512", "trainer.global_batch=4", "optimizer.z_loss=0", "data.paths=[/no/data]"]
    run += ["optimizer.skip_step=false", "eval.every=0", "model.n_layers=1"]  # a smaller program to compile
    kto_cfg = apply_overrides(get_recipe("tiny"), run + ["trainer.objective=kto", "kto.kl_group=4"])
    dpo_cfg = apply_overrides(get_recipe("tiny"), run + ["trainer.objective=dpo"])
    assert (kto_cfg.rows_per_step, kto_cfg.statistic_rows_per_step, dpo_cfg.statistic_rows_per_step) == (8, 4, 0)
    hlo = {}

    def keeping_the_program(cfg, *args):
        result = compile_step(cfg, *args)
        hlo[cfg.trainer.objective] = result.compiled.as_text()
        return result

    monkeypatch.setattr(olmax.fit.compile_check, "compile_step", keeping_the_program)
    one = jax.devices()[:1]
    model = {c.trainer.objective: compile_report(c, one)["model_flops_per_device"] for c in (kto_cfg, dpo_cfg)}
    assert not any(" while(" in text for text in hlo.values())  # every dot counted once
    trained = Fraction(hlo_dot_flops(hlo["dpo"]), 8)  # a row of DPO's 4 pairs
    statistic = (hlo_dot_flops(hlo["kto"]) - 4 * trained) / 4  # KTO's 4 trained rows and 4 statistic rows
    assert Fraction(1, 4) <= statistic / trained <= Fraction(1, 3), float(statistic / trained)

    counted = exact_step_flops(kto_cfg.model, kto_cfg.data.seq_len, 4, forward_only=4).total
    assert model["kto"] == pytest.approx(counted, rel=1e-12)
    assert model["kto"] == pytest.approx(model["dpo"] * 4 / 6, rel=1e-12)
    out = tmp_path / "flops.json"
    args = ["flops", "--recipe", "tiny", *run, "trainer.objective=kto", "--total-devices", "4", "--json", str(out)]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["tflops_per_device_step_exact"] * 1e12 == pytest.approx(counted / 4, rel=1e-12)
    r = CliRunner().invoke(app, [*args[:-4], "--total-devices", "8"])  # a row a device: half an item
    assert r.exit_code == 2 and "of 1 sequences splits the items of trainer.objective=kto (2 rows each" in r.output
    log = MetricsLog(tmp_path, kto_cfg, n_devices=4, write=False)
    named = {"loss": 0.5, "kl": 0.0, "rewards/chosen": 0.1, "rewards/rejected": 0.2, "lr": 1e-3, "grad_norm": 1.0}
    row = log.record(1, named, total_tokens=1, step_time=1.0, repeats=0, extra={})
    assert row["throughput/device/TFLOPs"] * 1e12 == pytest.approx(counted / 4, rel=1e-12)


def test_a_metric_returned_without_a_name_stops_the_first_step(kto, tmp_path):
    from olmax.errors import ConfigError
    from olmax.trainer.metrics import MetricsLog

    cfg = olmax_config(tmp_path, tmp_path / "cache")
    log = MetricsLog(tmp_path, cfg, n_devices=1, write=False)
    named = {"loss": 0.5, "kl": 0.0, "rewards/chosen": 0.1, "rewards/rejected": 0.2, "lr": 1e-3, "grad_norm": 1.0}
    named |= {"skipped": 0.0, "tokens": 256.0, "rollout/reward_mean": 0.5}
    row = log.record(1, named, total_tokens=256, step_time=1.0, repeats=0, extra={})
    assert row["train/KTO loss"] == 0.5 and row["train/kl"] == 0.0 and "tokens" not in row
    with pytest.raises(ConfigError, match=r"trainer.objective=kto returns the metric\(s\) 'chosen' at step 1"):
        log.record(1, {**named, "chosen": 2.0}, total_tokens=256, step_time=1.0, repeats=0, extra={})


if __name__ == "__main__":
    # Writes the fixture from TRL (needs the parity extra): python tests/objectives/test_kto_plugin.py
    FIXTURE.write_text(json.dumps(trl_reference()) + "\n")
    print(f"wrote {FIXTURE}")
