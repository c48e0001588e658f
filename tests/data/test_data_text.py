"""Text where users put it: jsonl in data.paths is tokenized on first use by `olmax tokenize`'s code, into
the folder eval.data's text goes to, and read from there as tokens; text given as token files is refused
as text; a missing data or eval file is an error the trainer counts as the user's (exit 2)."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from olmax.cli import app
from olmax.config.data import DataConfig
from olmax.data.loader import build_source
from olmax.data.sources import DataSourceError, TokenSource, looks_like_text
from olmax.data.tokenize import tokenize_files
from olmax.data.tokenizer import load_tokenizer
from olmax.rundir.exits import ExitStatus
from olmax.trainer.failures import status_of

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "corpus"
SEQ = 32


def data_cfg(tmp_path, *paths, **fields) -> DataConfig:
    return DataConfig(paths=tuple(str(p) for p in paths), seq_len=SEQ, work_dir=str(tmp_path / "cache"), **fields)


def instances(source) -> np.ndarray:
    return np.stack([source[i] for i in range(len(source))])


def text_folders(tmp_path) -> list[Path]:
    return sorted(p for p in (tmp_path / "cache" / "text").iterdir())


def test_jsonl_in_data_paths_reads_as_olmax_tokenize_wrote_it(tmp_path):
    text = tmp_path / "kjv.jsonl"
    shutil.copy(CORPUS / "kjv.jsonl", text)
    source = build_source(data_cfg(tmp_path, text))
    made = tokenize_files([text], tmp_path / "tokens", show_progress=False)
    shards = [str(tmp_path / "tokens" / s["path"]) for s in made["shards"]]
    assert np.array_equal(instances(source), instances(TokenSource(shards, SEQ, source.tokenizer)))
    # each document is its dolma2 ids and EOS, in file order
    dolma2 = load_tokenizer("dolma2")
    docs = [json.loads(line)["text"] for line in text.read_text().splitlines()]
    ids = [i for d in docs for i in [*dolma2.encode(d), dolma2.info.eos_token_id]]
    assert instances(source).ravel().tolist() == ids[: len(source) * SEQ]

    # read from the cache the next time, as eval.data's text is; a changed file is tokenized again
    (folder,) = text_folders(tmp_path)
    made_at = folder.stat().st_mtime_ns
    from olmax.evals.heldout import load_instances

    heldout = load_instances([str(text)], data_cfg(tmp_path), batch=1)
    assert np.array_equal(heldout, instances(source)) and text_folders(tmp_path) == [folder]
    assert folder.stat().st_mtime_ns == made_at
    shutil.copy(CORPUS / "devil.jsonl", text)
    changed = build_source(data_cfg(tmp_path, text))
    assert len(text_folders(tmp_path)) == 2 and not np.array_equal(changed[0], source[0])


def test_globs_take_text_and_tokens_together(tmp_path):
    folder = tmp_path / "mixed"
    folder.mkdir()
    shutil.copy(CORPUS / "devil.jsonl", folder / "a.jsonl")
    tokenize_files([CORPUS / "kjv.jsonl"], tmp_path / "tokens", show_progress=False)
    shutil.copy(tmp_path / "tokens" / "000000.npy", folder / "b.npy")
    both = build_source(data_cfg(tmp_path, folder / "*"))
    alone = [build_source(data_cfg(tmp_path, p)) for p in (folder / "a.jsonl", folder / "b.npy")]
    assert np.array_equal(instances(both), np.concatenate([instances(s) for s in alone]))


def test_text_given_as_tokens_is_refused_as_text(tmp_path):
    disguised = tmp_path / "part-0.npy"
    shutil.copy(CORPUS / "jargon.jsonl", disguised)
    with pytest.raises(DataSourceError, match=r"part-0.npy: this looks like text: '\{\"text\": \"") as e:
        build_source(data_cfg(tmp_path, disguised))
    assert status_of(e.value) is ExitStatus.USER_ERROR
    # a .txt is an OLMo-core mix file: plain text in one says where text goes
    prose = tmp_path / "notes.txt"
    prose.write_text("Once upon a time there was a corpus.\n")
    with pytest.raises(DataSourceError, match=r"a \.txt in data.paths is an OLMo-core mix file; plain text goes"):
        build_source(data_cfg(tmp_path, prose, mix_base=str(tmp_path)))
    # real tokens are not text: dolma2's ids of prose as uint32, and the ones below 2^16 as uint16
    ids = np.asarray(load_tokenizer("dolma2").encode((CORPUS / "devil.jsonl").read_text()))
    assert looks_like_text(ids.astype(np.uint32).tobytes()) is None
    assert looks_like_text(ids[ids < 2**16].astype(np.uint16).tobytes()) is None
    assert looks_like_text("Ünïcödé prose, cut mid-character: é".encode()[:-1]) == "Ünïcödé prose, cut mid-character: "


def test_missing_data_and_text_that_cannot_be_tokenized(tmp_path):
    for missing in ("missing.jsonl", "missing.npy", "none-*.jsonl"):
        with pytest.raises(DataSourceError, match=missing.replace("*", r"\*")) as e:
            build_source(data_cfg(tmp_path, tmp_path / missing))
        assert status_of(e.value) is ExitStatus.USER_ERROR
    with pytest.raises(DataSourceError, match="text is tokenized on first use from a local file only"):
        build_source(data_cfg(tmp_path, "gs://bucket/corpus.jsonl"))
    # text made with the configured tokenizer, checked against the configured ids as a tokenize folder is
    with pytest.raises(DataSourceError, match=r"kjv.jsonl \(data.tokenizer=dolma2\) was tokenized with dolma2"):
        build_source(data_cfg(tmp_path, CORPUS / "kjv.jsonl", vocab_size=50000))
    result = CliRunner().invoke(
        app, ["data", "check", "--paths", str(tmp_path / "missing.jsonl"), "--work-dir", str(tmp_path)]
    )
    assert result.exit_code == 2 and "missing.jsonl does not exist" in result.output
