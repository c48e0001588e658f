"""Per-domain perplexity: grouping by field or file, every token scored exactly once, the loss as
torch's cross-entropy computes it on each document, and bits per byte from the UTF-8 text."""

import gzip
import json
import math
from pathlib import Path

import jax
import numpy as np
import pytest
from models import byte_level_tokenizer, numpy_params, tiny_eval_model, vocab_size

from olmax.checkpoint.inference import eval_mesh
from olmax.data.tokenizer import load_tokenizer
from olmax.evals.domains import document_windows, read_domains, score_domains
from olmax.evals.scoring import TokenScorer
from olmax.model.olmo3 import forward

# A 300-token vocabulary and a byte-level BPE tokenizer of it: on the CPU the suite's programs run
# unoptimized (tests/conftest.py), and over dolma2's 100k ids the output layer took most of the time.
CFG = tiny_eval_model(vocab_size=300)
# A slice of a real held-out corpus, one file per source, each document with its `domain` (tests/fixtures/README.md).
REAL = Path(__file__).resolve().parents[1] / "fixtures" / "corpus"


def write(path, records):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("domains")
    write(
        d / "a.jsonl.gz",
        [
            {"text": "In the beginning was the word.", "domain": "lit"},
            {"text": "def f(x):\n    return x * 2  # café", "domain": "code"},
            {"text": "And the word was with God, and the word was God.", "domain": "lit"},
        ],
    )
    write(d / "news.jsonl", [{"text": "Stocks rose on Tuesday after a quiet week."}, {"text": ""}])
    return d


@pytest.fixture(scope="module")
def model():
    return numpy_params(CFG, 1), TokenScorer(CFG, eval_mesh(), real_vocab=True)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A byte-level BPE tokenizer.json of CFG.vocab_size ids learnt on the real corpus (any text encodes)."""
    texts = [t for texts in read_domains(REAL, by="file").values() for t in texts]
    path = byte_level_tokenizer(tmp_path_factory.mktemp("tokenizer") / "tokenizer.json", texts, CFG.vocab_size)
    assert vocab_size(path) == CFG.vocab_size
    return path


def test_grouping(corpus):
    auto = read_domains(corpus)
    assert list(auto) == ["code", "lit", "news"] and len(auto["lit"]) == 2 and len(auto["news"]) == 1
    assert list(read_domains(corpus, by="file")) == ["a", "news"]
    assert len(read_domains(corpus, max_docs=1)["lit"]) == 1
    with pytest.raises(ValueError, match="news.jsonl line 1: no string `domain`"):
        read_domains(corpus, by="field")


def test_windows_score_every_token_once():
    ids = list(range(100, 123))
    for seq_len in (2, 5, 8, 24, 64):
        windows = document_windows(ids, 7, seq_len)
        assert all(2 <= len(w) <= seq_len for w in windows)
        assert [t for w in windows for t in w[1:]] == ids  # every id is a target exactly once
        assert all(a[-1] == b[0] for a, b in zip(windows, windows[1:]))


@pytest.mark.parity
def test_figures_match_torch_per_document(corpus, model, tokenizer):
    torch = pytest.importorskip("torch")
    params, scorer = model
    domains = read_domains(corpus)
    report = score_domains(scorer, params, domains, seq_len=64, batch=3, tokenizer=tokenizer)
    tok = load_tokenizer(tokenizer)
    reference_forward = jax.jit(forward, static_argnums=2)  # each document alone, unpadded; op by op is slower
    for name, texts in domains.items():
        nll, count = 0.0, 0
        for text in texts:
            seq = np.asarray([[tok.info.eos_token_id] + tok.encode(text)], np.int32)
            logits = torch.from_numpy(np.array(reference_forward(params, seq, CFG)))[0, :-1, : CFG.vocab_size].double()
            nll += float(
                torch.nn.functional.cross_entropy(logits, torch.from_numpy(seq[0, 1:]).long(), reduction="sum")
            )
            count += seq.shape[1] - 1
        r = report["domains"][name]
        n_bytes = sum(len(t.encode("utf-8")) for t in texts)
        assert r["tokens"] == count and r["bytes"] == n_bytes
        assert r["loss"] == pytest.approx(nll / count, rel=1e-5)
        assert r["bpb"] == pytest.approx(nll / (math.log(2) * n_bytes), rel=1e-5)
        assert r["ppl"] == pytest.approx(math.exp(nll / count), rel=1e-5)
    d = report["domains"]
    assert report["macro"]["loss"] == pytest.approx(np.mean([r["loss"] for r in d.values()]))
    nll_total = sum(r["loss"] * r["tokens"] for r in d.values())
    assert report["micro"]["loss"] == pytest.approx(nll_total / sum(r["tokens"] for r in d.values()))


def test_batching_and_windows_do_not_change_figures(corpus, model, tokenizer):
    params, scorer = model
    domains = read_domains(corpus)
    a = score_domains(scorer, params, domains, seq_len=64, batch=1, tokenizer=tokenizer)
    b = score_domains(scorer, params, domains, seq_len=64, batch=4, tokenizer=tokenizer)
    c = score_domains(scorer, params, domains, seq_len=6, batch=4, tokenizer=tokenizer)  # long docs in windows
    for name in domains:
        assert a["domains"][name]["loss"] == pytest.approx(b["domains"][name]["loss"], rel=1e-6)
        assert c["domains"][name]["tokens"] == a["domains"][name]["tokens"]


def test_real_corpus_domains(model, tokenizer):
    params, scorer = model
    assert list(read_domains(REAL, by="file")) == ["devil", "jargon", "kjv", "pydocs", "pystdlib"]
    domains = read_domains(REAL, by="field", max_docs=2)
    assert list(domains) == ["code", "encyclopedic", "literature", "tech-docs"]
    assert all(len(texts) == 2 for texts in domains.values())
    report = score_domains(scorer, params, domains, seq_len=32, batch=8, tokenizer=tokenizer)
    assert set(report["domains"]) == set(domains)
    # A random model spreads its mass over the whole vocabulary: loss near ln(vocab), far above a trained model's.
    assert abs(report["micro"]["loss"] - math.log(CFG.vocab_size)) < 1.0
