"""`olmax tokenize`: dolma2 ids offline, shard layout, manifest, resume."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from olmax.data import tokenize as tokmod
from olmax.data.tokenize import TokenizeError, tokenize_files
from olmax.data.tokenizer import DOLMA2_ADDED_TOKENS, Dolma2Tokenizer, token_dtype

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent


def real_texts() -> list[tuple[str, str]]:
    """(where, text) of real text the package and this repository ship: the demo corpus's held-out
    prose (King James Bible, Devil's Dictionary, Jargon File), the corpus slice in tests/fixtures
    (those plus Python docs and standard-library code), and this repository's own Python and Markdown."""
    texts = []
    with gzip.open(ROOT / "src" / "olmax" / "data" / "demo" / "heldout.jsonl.gz", "rt") as f:
        texts += [(f"demo heldout line {k}", json.loads(line)["text"]) for k, line in enumerate(f)]
    for path in sorted((TESTS / "fixtures" / "corpus").glob("*.jsonl")):
        texts += [(f"{path.name} line {k}", json.loads(line)["text"]) for k, line in enumerate(path.open())]
    for path in sorted([*(ROOT / "src").rglob("*.py"), *(ROOT / "docs").glob("*.md"), ROOT / "README.md"]):
        texts.append((str(path.relative_to(ROOT)), path.read_text()))
    return texts


@pytest.fixture(scope="module")
def dolma2():
    return Dolma2Tokenizer()


def test_dolma2_ids_equal_hf_tokenizer_on_real_text(dolma2, dolma2_json):
    """olmax's tiktoken dolma2 against HF `tokenizers` running AI2's tokenizer file (`dolma2_json`, the
    rebuilt file that tests/convert/test_hf_export.py proves equal to it)."""
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(str(dolma2_json))
    ai2 = json.loads((TESTS / "fixtures" / "allenai_dolma2.summary.json").read_text())
    assert {t["content"]: t["id"] for t in ai2["added_tokens"]} == DOLMA2_ADDED_TOKENS
    assert hf.get_vocab_size(with_added_tokens=True) == dolma2.info.vocab_size == ai2["model"]["vocab"]["entries"]
    docs, tokens = 0, 0
    for where, text in real_texts():  # prose, dictionary entries, reST docs, Markdown, Python code
        ids = dolma2.encode(text)
        assert ids == hf.encode(text, add_special_tokens=False).ids, where
        docs, tokens = docs + 1, tokens + len(ids)
    assert docs > 300 and tokens > 50_000
    tricky = ["a<|endoftext|>b|||EMAIL_ADDRESS|||<|pad|>", "trailing  \n\n \t", "\r\n\r\n x", "\u00a0\u2003 12345"]
    for text in tricky:
        assert dolma2.encode(text) == hf.encode(text, add_special_tokens=False).ids, text


def test_dtype_follows_olmo_core():
    assert token_dtype(100278) == np.uint32
    assert token_dtype(65536) == np.uint16 and token_dtype(65537) == np.uint32
    assert token_dtype(256) == np.uint8


def write_inputs(tmp_path: Path) -> list[Path]:
    import zstandard

    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "é", "東京", "\n", "  ", "123"]
    docs = [" ".join(rng.choice(words, size=int(rng.integers(1, 60)))) for _ in range(120)]
    lines = [json.dumps({"text": d, "id": i}) for i, d in enumerate(docs)]
    plain = tmp_path / "a.jsonl"
    plain.write_text("\n".join(lines[:40]) + "\n\n")  # a blank line is not a document
    gz = tmp_path / "b.jsonl.gz"
    with gzip.open(gz, "wt") as f:
        f.write("\n".join(lines[40:80]) + "\n")
    zst = tmp_path / "c.jsonl.zst"
    zst.write_bytes(zstandard.ZstdCompressor().compress(("\n".join(lines[80:]) + "\n").encode()))
    txt = tmp_path / "d.txt"
    txt.write_text("one whole file\nis one document\n")
    return [plain, gz, zst, txt], docs + [txt.read_text()]


def test_shards_manifest_and_content(tmp_path, dolma2):
    inputs, docs = write_inputs(tmp_path)
    out = tmp_path / "out"
    manifest = tokenize_files(inputs, out, shard_tokens=500, show_progress=False)
    eos = dolma2.info.eos_token_id
    expected = np.concatenate([dolma2.encode(d) + [eos] for d in docs]).astype(np.uint32)
    shards = [np.fromfile(out / s["path"], dtype=np.uint32) for s in manifest["shards"]]
    np.testing.assert_array_equal(np.concatenate(shards), expected)
    assert manifest["dtype"] == "uint32" and manifest["total_tokens"] == len(expected)
    assert manifest["tokenizer"]["vocab_size"] == 100278
    assert manifest["tokenizer"]["eos_token_id"] == 100257 and manifest["tokenizer"]["pad_token_id"] == 100277
    for s, arr in zip(manifest["shards"], shards):
        assert s["tokens"] == len(arr)
        assert s["sha256"] == hashlib.sha256((out / s["path"]).read_bytes()).hexdigest()
        assert arr[-1] == eos  # shards end at a document boundary
    assert all(len(a) >= 500 for a in shards[:-1]) and len(shards) >= 3
    assert [s["documents"] for s in manifest["sources"]] == [40, 40, 40, 1]
    assert sum(s["documents"] for s in manifest["shards"]) == 121
    assert not list(out.glob("*.tmp")) and not (out / tokmod.PROGRESS).exists()


def test_workers_give_identical_shards(tmp_path):
    inputs, _ = write_inputs(tmp_path)
    a = tokenize_files(inputs, tmp_path / "w0", shard_tokens=700, show_progress=False)
    b = tokenize_files(inputs, tmp_path / "w2", shard_tokens=700, workers=2, show_progress=False)
    assert a["shards"] == b["shards"]


def test_resume_after_interruption_is_identical(tmp_path, monkeypatch):
    inputs, _ = write_inputs(tmp_path)
    reference = tokenize_files(inputs, tmp_path / "ref", shard_tokens=400, show_progress=False)
    assert len(reference["shards"]) >= 4

    real_flush, calls = tokmod._ShardWriter.flush, []

    def crash_on_third(self):
        calls.append(1)
        if len(calls) == 3:
            (self.out_dir / "000002.npy.tmp").write_bytes(b"half-written")
            raise KeyboardInterrupt
        real_flush(self)

    monkeypatch.setattr(tokmod._ShardWriter, "flush", crash_on_third)
    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        tokenize_files(inputs, out, shard_tokens=400, show_progress=False)
    assert sorted(p.name for p in out.glob("*.npy")) == ["000000.npy", "000001.npy"]
    assert not (out / tokmod.MANIFEST).exists()
    monkeypatch.setattr(tokmod._ShardWriter, "flush", real_flush)

    with pytest.raises(TokenizeError, match="shard_tokens changed"):
        tokenize_files(inputs, out, shard_tokens=999, show_progress=False)
    resumed = tokenize_files(inputs, out, shard_tokens=400, show_progress=False)
    assert resumed["shards"] == reference["shards"]
    assert resumed["sources"] == reference["sources"]
    assert not list(out.glob("*.tmp"))


def test_bad_input_is_named(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"txt": "no text field"}\n')
    with pytest.raises(TokenizeError, match=r"bad.jsonl line 2: no string `text` field"):
        tokenize_files([bad], tmp_path / "out", show_progress=False)
    with pytest.raises(TokenizeError, match="missing.jsonl does not exist"):
        tokenize_files([tmp_path / "missing.jsonl"], tmp_path / "out2", show_progress=False)
    with pytest.raises(TokenizeError, match="unsupported file type"):
        (tmp_path / "x.csv").write_text("a,b")
        tokenize_files([tmp_path / "x.csv"], tmp_path / "out3", show_progress=False)


def test_hf_tokenizer_json_gives_the_same_shards(tmp_path, dolma2_json):
    inputs, _ = write_inputs(tmp_path)
    a = tokenize_files(inputs, tmp_path / "tiktoken", shard_tokens=600, show_progress=False)
    b = tokenize_files(inputs, tmp_path / "hf", tokenizer=str(dolma2_json), shard_tokens=600, show_progress=False)
    assert [s["sha256"] for s in a["shards"]] == [s["sha256"] for s in b["shards"]]
    assert b["tokenizer"]["eos_token_id"] == 100257 and b["tokenizer"]["pad_token_id"] == 100277


def test_cli_tokenize_then_order(tmp_path):
    from typer.testing import CliRunner

    from olmax.cli.common import app
    from olmax.data.order import permutation, rank_ids

    inputs, _ = write_inputs(tmp_path)
    out = tmp_path / "shards"
    runner = CliRunner()
    res = runner.invoke(
        app,
        [
            "tokenize",
            *map(str, inputs),
            "--out",
            str(out),
            "--shard-tokens",
            "300",
            "--json",
            str(tmp_path / "tok.json"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "tok.json").read_text())["total_tokens"] > 1000
    res = runner.invoke(
        app,
        [
            "data",
            "order",
            "--paths",
            str(out),
            "--seq-len",
            "16",
            "--seed",
            "3",
            "--global-batch",
            "8",
            "--dp-size",
            "2",
            "--steps",
            "2:4",
            "--work-dir",
            str(tmp_path / "cache"),
            "--json",
            str(tmp_path / "order.json"),
        ],
    )
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "order.json").read_text())
    order = permutation(report["instances"], 3, 1)
    assert [s["batch"] for s in report["steps"]] == [1, 2]
    assert report["steps"][1]["ranks"][1]["ids"] == rank_ids(order, 2, 8, 1, 2).tolist()
    res = runner.invoke(app, ["data", "check", "--paths", str(tmp_path / "nope.npy"), "--seq-len", "16"])
    assert res.exit_code == 2 and "nope.npy does not exist" in res.output
