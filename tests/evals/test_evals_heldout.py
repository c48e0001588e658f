"""Held-out loss: fixed batches from jsonl text or token shards, the loss as torch's cross-entropy
computes it, identical on 1 and 8 devices, and the in-loop evaluator's metric names."""

import gzip
import json

import jax
import numpy as np
import pytest
from models import byte_level_tokenizer, numpy_params, tiny_eval_model, vocab_size

from olmax.checkpoint.inference import eval_mesh
from olmax.checkpoint.store import save_params
from olmax.config.checkpoint import EvalConfig
from olmax.config.data import DataConfig
from olmax.config.experiment import ExperimentConfig
from olmax.config.trainer import TrainerConfig
from olmax.data.sources import DataSourceError
from olmax.data.tokenizer import load_tokenizer
from olmax.evals.heldout import HeldoutEvaluator, eval_loss, eval_name, load_instances
from olmax.model.olmo3 import forward
from olmax.rundir.exits import ExitStatus
from olmax.trainer.failures import status_of

# A 300-token vocabulary and a byte-level BPE tokenizer of it: on the CPU the suite's programs run
# unoptimized (tests/conftest.py), and over dolma2's 100k ids the output layer took most of the time.
CFG = tiny_eval_model(vocab_size=300)
TEXTS = [f"Document {i}: the quick brown fox jumps over {i * 7} lazy dogs, then rests." for i in range(12)]


def write_jsonl(path, texts):
    with gzip.open(path, "wt") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("heldout")
    params = numpy_params(CFG, 0)
    ckpt = save_params(tmp / "ckpt", params, CFG, {"source": "test"})
    data = write_jsonl(tmp / "val.jsonl.gz", TEXTS)
    tokenizer = byte_level_tokenizer(tmp / "tokenizer.json", TEXTS, CFG.vocab_size)
    assert vocab_size(tokenizer) == CFG.vocab_size
    info = load_tokenizer(tokenizer).info
    ids = dict(vocab_size=info.vocab_size, eos_token_id=info.eos_token_id, pad_token_id=info.pad_token_id)
    return {
        "params": params,
        "ckpt": str(ckpt),
        "data": data,
        "tokenizer": tokenizer,
        "data_cfg": DataConfig(seq_len=16, work_dir=str(tmp / "cache"), tokenizer=tokenizer, **ids),
    }


@pytest.fixture(scope="module")
def text_loss(setup):
    """`olmax eval loss` of the text file at 2 batches of 4: the figure three tests check, computed once."""
    out = eval_loss(setup["ckpt"], [setup["data"]], seq_len=16, batch=4, max_batches=2, data_cfg=setup["data_cfg"])
    return out["results"]["val"]


def test_text_is_tokenized_and_cut_like_the_training_data(setup):
    tok = load_tokenizer(setup["tokenizer"])
    stream = np.concatenate([tok.encode(t) + [tok.info.eos_token_id] for t in TEXTS])
    inst = load_instances([setup["data"]], setup["data_cfg"], batch=3)
    n = (len(stream) // 16) // 3 * 3
    assert inst.shape == (n, 16) and n > 0
    np.testing.assert_array_equal(inst.ravel(), stream[: n * 16])
    assert load_instances([setup["data"]], setup["data_cfg"], batch=3, max_batches=1).shape == (3, 16)


@pytest.mark.parity
def test_loss_equals_torch_cross_entropy(setup, text_loss):
    torch = pytest.importorskip("torch")
    r = text_loss
    inst = load_instances([setup["data"]], setup["data_cfg"], batch=4, max_batches=2)
    reference = jax.jit(forward, static_argnums=2)  # compiled: op by op is slower
    logits = torch.from_numpy(np.array(reference(setup["params"], inst, CFG))).double()
    labels = torch.from_numpy(inst[:, 1:]).long()
    ref = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels.reshape(-1))
    assert r["tokens"] == 8 * 15 and r["instances"] == 8
    assert r["CE loss"] == pytest.approx(float(ref), rel=1e-6)
    assert r["PPL"] == pytest.approx(np.exp(float(ref)), rel=1e-6)


def test_identical_on_one_and_eight_devices(setup):
    kw = dict(seq_len=16, batch=6, max_batches=2, data_cfg=setup["data_cfg"])  # 6 rows: padded on 8 devices
    one = eval_loss(setup["ckpt"], [setup["data"]], mesh=eval_mesh(jax.devices()[:1]), **kw)
    eight = eval_loss(setup["ckpt"], [setup["data"]], mesh=eval_mesh(), **kw)
    assert one["devices"] == 1 and eight["devices"] == 8
    a, b = one["results"]["val"], eight["results"]["val"]
    assert a["tokens"] == b["tokens"]
    assert a["CE loss"] == pytest.approx(b["CE loss"], rel=1e-7, abs=0), (a, b)


def test_token_shards_and_text_give_the_same_loss(setup, text_loss, tmp_path):
    inst = load_instances([setup["data"]], setup["data_cfg"], batch=4, max_batches=2)
    shard = tmp_path / "000000.npy"
    inst.astype(np.uint16).tofile(shard)  # raw, headerless, as OLMo-core stores ids below 2^16
    kw = dict(seq_len=16, batch=4, max_batches=2, data_cfg=setup["data_cfg"])
    a = text_loss
    b = eval_loss(setup["ckpt"], [str(shard)], **kw)["results"]["000000"]
    assert a["CE loss"] == b["CE loss"] and a["tokens"] == b["tokens"]


def test_in_loop_evaluator(setup, text_loss):
    exp = ExperimentConfig(
        model=CFG,
        data=setup["data_cfg"],
        trainer=TrainerConfig(global_batch=4),
        eval=EvalConfig(every=5, batches=2, data=(setup["data"],)),
    )
    evaluator = HeldoutEvaluator(exp, eval_mesh())
    assert evaluator(3, setup["params"]) == {}
    metrics = evaluator(10, evaluator.scorer.place(setup["params"]))
    offline = text_loss
    assert set(metrics) == {"eval/val/CE loss", "eval/val/PPL"}
    assert metrics["eval/val/CE loss"] == pytest.approx(offline["CE loss"], rel=1e-6)


def test_errors_and_names(setup):
    assert eval_name("demo:heldout") == "demo-heldout"
    assert eval_name("/x/c4.val.jsonl.gz") == "c4.val"
    with pytest.raises(ValueError, match="not one batch"):
        load_instances([setup["data"]], setup["data_cfg"], batch=1000)
    # a missing eval file is the user's to fix: `olmax train` exits 2 on it (trainer.failures)
    with pytest.raises(DataSourceError, match="data file /nonexistent/missing.jsonl does not exist") as missing:
        load_instances(["/nonexistent/missing.jsonl"], setup["data_cfg"], batch=1)
    assert status_of(missing.value) is ExitStatus.USER_ERROR
