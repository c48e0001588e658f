"""The lm-eval adapter against lm-eval's own HF backend (HFLM) on a tiny random model converted to
HF: the same per-request log-likelihoods (fp32 tolerance), greedy flags, rolling log-likelihoods,
greedy generations, and the same accuracy on a small local arc_easy-format task read offline."""

import jax
import numpy as np
import pytest

lm_eval = pytest.importorskip("lm_eval")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.models.huggingface import HFLM  # noqa: E402

from olmax.checkpoint import save_params  # noqa: E402
from olmax.config import ModelConfig  # noqa: E402
from olmax.convert.hf import convert_to_hf  # noqa: E402
from olmax.evals.lm_eval_adapter import OlmaxLM  # noqa: E402
from olmax.evals.tasks import evaluate_tasks  # noqa: E402
from olmax.model.olmo3 import init_params  # noqa: E402

pytestmark = pytest.mark.slow  # ~80 s on 2 CPU cores: two frameworks, a dozen compiled shapes

TEXTS = ["The sun rises in the east and sets in the west.", "Water boils at one hundred degrees.",
         "Plants need light to grow.", "A magnet attracts iron.", "Question: What is ice? Answer: frozen water"]
QUESTIONS = [("What do plants need to grow?", ["light", "sand", "noise"], "A"),
             ("Where does the sun rise?", ["north", "east", "down"], "B"),
             ("What does a magnet attract?", ["wood", "glass", "iron"], "C"),
             ("At what temperature does water boil?", ["one hundred degrees", "ten degrees"], "A")]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models as tok_models, pre_tokenizers, trainers

    tmp = tmp_path_factory.mktemp("lm_eval")
    tok = Tokenizer(tok_models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXTS * 4 + [q for q, _, _ in QUESTIONS], trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok_file = tmp / "tokenizer.json"
    tok.save(str(tok_file))
    cfg = ModelConfig(vocab_size=tok.get_vocab_size(), d_model=32, n_layers=4, n_heads=4, n_kv_heads=2,
                      head_dim=8, mlp_hidden=64, sliding_window=8, max_position=64, compute_dtype="float32")
    params = init_params(cfg, jax.random.key(0))
    params["lm_head"] = params["lm_head"] * 50  # sharper distributions: argmax and accuracy are not ties
    special = {"eos_token_id": 0, "pad_token_id": 0, "bos_token_id": None}  # the tokenizer's, not dolma2's
    save_params(tmp / "ckpt", params, cfg, {"source": "test", "special_tokens": special})
    convert_to_hf(tmp / "ckpt", tmp / "hf", dtype="float32")
    hf_model = transformers.Olmo3ForCausalLM.from_pretrained(tmp / "hf", dtype=torch.float32)
    hf_model.config._attn_implementation = "eager"
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tok_file), eos_token="<|endoftext|>")
    hf = HFLM(pretrained=hf_model, tokenizer=hf_tok, batch_size=3, max_length=64)
    ours = OlmaxLM(str(tmp / "ckpt"), tokenizer=str(tok_file), batch_size=3, max_length=64)
    return ours, hf, tmp


def requests(kind, args):
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


def test_loglikelihoods_match_hf(models):
    ours, hf, _ = models
    pairs = [(q, " " + c) for q, choices, _ in QUESTIONS for c in choices] + [("", "Plants need light"),
                                                                              ("A long " * 30, " tail")]
    a = ours.loglikelihood(requests("loglikelihood", pairs))
    b = hf.loglikelihood(requests("loglikelihood", pairs))
    np.testing.assert_allclose([x[0] for x in a], [x[0] for x in b], rtol=1e-4, atol=1e-4)
    assert [x[1] for x in a] == [x[1] for x in b]
    texts = [(t,) for t in TEXTS] + [(" ".join(TEXTS * 3),)]  # the last spans several 64-token windows
    np.testing.assert_allclose(ours.loglikelihood_rolling(requests("loglikelihood_rolling", texts)),
                               hf.loglikelihood_rolling(requests("loglikelihood_rolling", texts)), rtol=1e-4)


def test_generate_until_matches_hf(models):
    ours, hf, _ = models
    args = [("The sun rises", {"until": ["\n"], "max_gen_toks": 12, "do_sample": False}),
            ("Question: What is ice? Answer:", {"until": ["."], "max_gen_toks": 20, "do_sample": False})]
    assert ours.generate_until(requests("generate_until", args)) == hf.generate_until(requests("generate_until", args))


def test_same_accuracy_on_a_local_task(models):
    import pyarrow as pa

    ours, hf, tmp = models
    rows = [{"id": str(i), "question": q, "choices": {"text": c, "label": list("ABC"[:len(c)])}, "answerKey": k}
            for i, (q, c, k) in enumerate(QUESTIONS)]
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
