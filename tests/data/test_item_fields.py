"""Per-item fields (olmax.data.item_fields): a row's numbers and booleans beside its conversation, kept by
`olmax tokenize --chat` one value per document, read by an item source and given by the loader with each
batch, with errors that name the directory, the field and a row; a document split into prompt and
completion (olmax.data.pairs.ChatDocuments)."""

import json
from dataclasses import replace

import numpy as np
import pytest

from olmax.config.data import DataConfig
from olmax.data.chat_files import tokenize_chat
from olmax.data.item_fields import FIELDS_FILE
from olmax.data.pairs import ChatDocuments, PairLoader, PairSource
from olmax.errors import ConfigError


def _conversation(i: int) -> list[dict]:
    return [{"role": "user", "content": f"What is {i} plus {i}?"}, {"role": "assistant", "content": f"{2 * i}."}]


def _tokenize(tmp_path, rows: list[dict], name: str = "data"):
    src = tmp_path / f"{name}.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tokenize_chat([src], tmp_path / name, "instruct")
    return tmp_path / name


def test_tokenize_keeps_every_rows_numbers_and_booleans(tmp_path):
    rows = [
        {"messages": _conversation(i), "label": i % 3 == 0, "weight": 0.5 * i, "rank": i, "id": f"row-{i}"}
        | ({"score": 1.0} if i % 2 else {})
        for i in range(6)
    ]
    rows[2]["messages"] = [{"role": "user", "content": "no answer"}]  # skipped by tokenize: no document, no value
    directory = _tokenize(tmp_path, rows)
    manifest = json.loads((directory / "manifest.json").read_text())
    chat = manifest["chat"]
    assert chat["fields"] == {"label": "bool", "rank": "int64", "weight": "float64"}  # text (`id`) is no field
    assert chat["partial_fields"] == {"score": 3} and chat["written"] == 5
    docs = ChatDocuments(directory, DataConfig())
    assert docs.field("label", "bool").tolist() == [True, False, True, False, False]
    assert docs.field("weight", "float32").tolist() == [0.0, 0.5, 1.5, 2.0, 2.5]
    assert docs.field("rank", "int32").tolist() == [0, 1, 3, 4, 5]
    with pytest.raises(ConfigError, match=r"only 3 of its 5 rows hold `score` as a number or boolean"):
        docs.field("score", "float32")
    with pytest.raises(ConfigError, match=r"its rows have no field `labels` \(its fields: label, rank, weight\)"):
        docs.field("labels", "bool")
    with pytest.raises(ConfigError, match=r"read as bool, but document 1 holds 0.5 \(4 such documents\)"):
        docs.field("weight", "bool")


def test_a_document_splits_at_its_last_trained_run():
    class Stub(ChatDocuments):
        def __init__(self, tokens, mask):
            self.tokens, self.masks, self.docs = [np.asarray(tokens)], [np.asarray(mask, bool)], [(0, 0, len(tokens))]

    prompt, completion, trained = Stub([1, 2, 3, 4, 5, 6, 7], [0, 1, 0, 0, 1, 1, 0]).completion(0)
    assert prompt.tolist() == [1, 2, 3, 4] and completion.tolist() == [5, 6, 7] and trained.tolist() == [1, 1, 0]
    prompt, completion, _ = Stub([1, 2], [0, 0]).completion(0)
    assert prompt.tolist() == [1, 2] and completion.tolist() == []


def test_pairs_carry_their_fields_into_the_batch(tmp_path):
    rows = [
        {"chosen": _conversation(i), "rejected": _conversation(i + 1), "weight": 1.0 + i, "margin": i % 2}
        for i in range(8)
    ]
    directory = _tokenize(tmp_path, rows, "pairs")
    assert (directory / "chosen" / FIELDS_FILE).is_file() and (directory / "rejected" / FIELDS_FILE).is_file()
    cfg = DataConfig(paths=(str(directory),), seq_len=64, work_dir=str(tmp_path / "cache"))
    source = PairSource(cfg, objective="wdpo")
    batch = next(iter(PairLoader(cfg, source, None, 4, fields={"weight": "float32", "margin": "bool"})))
    assert batch["weight"].dtype == np.float32 and batch["margin"].dtype == np.bool_
    assert batch["weight"].tolist() == [1.0 + i for i in batch["index"]]  # each pair's own row's value
    assert batch["margin"].tolist() == [bool(i % 2) for i in batch["index"]]
    with pytest.raises(ConfigError, match=r"trainer.objective=wdpo: the per-item field `label` is read from"):
        PairLoader(cfg, source, None, 4, fields={"label": "bool"}, objective="wdpo")

    # the fields enter the fingerprint: a resumed run sees changed values as changed data
    rows[0]["weight"] = 100.0
    other = PairSource(replace(cfg, paths=(str(_tokenize(tmp_path, rows, "pairs2")),)))
    assert other.fingerprint != source.fingerprint


def test_items_kept_together_stay_in_one_batch(tmp_path):
    """A source whose `group` is g: each global batch is whole runs of g consecutive items."""
    directory = _tokenize(tmp_path, [{"chosen": _conversation(i), "rejected": _conversation(i + 1)} for i in range(12)])
    cfg = DataConfig(paths=(str(directory),), seq_len=64, work_dir=str(tmp_path / "cache"))
    source = PairSource(cfg)
    source.group = 3
    loader = iter(PairLoader(cfg, source, None, 6))
    batches = [sorted(next(loader)["index"].tolist()) for _ in range(4)]  # two epochs
    for ids in batches:
        runs = {i // 3 for i in ids}
        assert len(runs) == 2 and sorted(ids) == sorted(i for r in runs for i in range(3 * r, 3 * r + 3))
    assert batches[:2] != batches[2:]  # the runs are shuffled anew each epoch
    with pytest.raises(ConfigError, match="trainer.global_batch=4 is not a multiple of the 3 pairs"):
        PairLoader(cfg, source, None, 4)
