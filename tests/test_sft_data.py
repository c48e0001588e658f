"""SFT data: files written by `olmax tokenize --chat`, packed with their label masks (data.label_masks),
against ai2-olmo-core 3.0.0's NumpyPackedFSLDataset with `label_mask_paths`; the batch's `label_mask`
and `olmax data order --with-tokens`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from olmax.cli import app
from olmax.config import ConfigError, DataConfig
from olmax.data.chat_files import tokenize_chat
from olmax.data.loader import build_source, make_loader, tokenizer_fields
from olmax.data.packing import PackedSource
from olmax.data.sources import DataSourceError, label_mask_paths

SEQ = 256
WORDS = "the cat sat on a mat while seven quiet dogs read old maps near bright rivers".split()


def conversations(n: int, seed: int = 0) -> list[dict]:
    """Chat rows of varied length: one to three user/assistant exchanges, some with a system prompt,
    a few too long for SEQ (truncated by packing) and a few ending with the user (no final EOS)."""
    rng = np.random.default_rng(seed)

    def text(lo, hi):
        return " ".join(rng.choice(WORDS, size=int(rng.integers(lo, hi))))

    rows = []
    for i in range(n):
        messages = [{"role": "system", "content": text(1, 6)}] if i % 3 == 0 else []
        for _ in range(int(rng.integers(1, 4))):
            messages += [{"role": "user", "content": text(1, 30)}, {"role": "assistant", "content": text(1, 60)}]
        if i % 7 == 0:
            messages.append({"role": "user", "content": text(1, 5)})
        if i % 11 == 0:
            messages[-1]["content"] = text(200, 300)
        rows.append({"messages": messages})
    return rows


@pytest.fixture(scope="module")
def sft_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft")
    src = root / "sft.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in conversations(60)))
    manifest = tokenize_chat([src], root / "tokens", "instruct", shard_tokens=2000)[""]
    assert len(manifest["shards"]) >= 4
    return root / "tokens"


def sft_cfg(sft_dir, work_dir, **kw) -> DataConfig:
    return DataConfig(
        paths=(str(sft_dir),),
        seq_len=SEQ,
        packing="obfd",
        doc_masking=True,
        label_masks=True,
        work_dir=str(work_dir),
        **kw,
    )


@pytest.mark.parity
@pytest.mark.parametrize("group_size,perm_seed", [(1, None), (2, 123)], ids=["plain", "group2-perm"])
def test_packed_sft_instances_match_olmo_core(sft_dir, tmp_path, group_size, perm_seed):
    """Every instance's tokens, label mask and doc_lens, and the fingerprint, as OLMo-core's SFT dataset
    (configured as src/scripts/train/sft/Olmo-3-7B-SFT.py builds it: the two globs, OBFD, truncate,
    generate_doc_lengths) gives them."""
    from olmo_core.data import NumpyPackedFSLDatasetConfig, TokenizerConfig
    from olmo_core.data.types import LongDocStrategy

    ds = NumpyPackedFSLDatasetConfig(
        tokenizer=TokenizerConfig.dolma2(),
        paths=[f"{sft_dir}/token_ids_part_*.npy"],
        label_mask_paths=[f"{sft_dir}/labels_mask_*.npy"],
        expand_glob=True,
        generate_doc_lengths=True,
        long_doc_strategy=LongDocStrategy.truncate,
        sequence_length=SEQ,
        source_group_size=group_size,
        source_permutation_seed=perm_seed,
        work_dir=str(tmp_path / "oc"),
    ).build()
    ds.prepare()
    ours = build_source(
        sft_cfg(sft_dir, tmp_path / "ox", source_group_size=group_size, source_permutation_seed=perm_seed)
    )
    assert ours.fingerprint == ds.fingerprint
    assert len(ours) == len(ds) > 10
    trained = 0
    for i in range(len(ds)):
        theirs = ds[i]
        tokens, lens = ours.read(i)
        mask = ours.label_mask(i)
        np.testing.assert_array_equal(tokens, theirs["input_ids"].numpy())
        np.testing.assert_array_equal(mask, theirs["label_mask"].numpy())
        np.testing.assert_array_equal(lens, theirs["doc_lens"].numpy())
        trained += int(mask.sum())
    assert 0 < trained < sum(ours.tokens)  # prompts are masked, answers trained


def test_batch_and_order_carry_the_label_mask(sft_dir, tmp_path):
    cfg = sft_cfg(sft_dir, tmp_path / "w")
    loader = make_loader(cfg, 4, dp_rank=1, dp_size=2)
    batch = next(iter(loader))
    source = loader.source
    assert batch["label_mask"].shape == batch["input_ids"].shape and batch["label_mask"].dtype == np.bool_
    for row, i in enumerate(batch["index"]):
        np.testing.assert_array_equal(batch["label_mask"][row], source.label_mask(int(i)))
        assert not batch["label_mask"][row][batch["input_ids"][row] == cfg.pad_token_id].any()

    out = tmp_path / "order.json"
    args = ["data", "order", "--paths", str(sft_dir), "--seq-len", str(SEQ), "--work-dir", str(tmp_path / "w")]
    args += ["--global-batch-instances", "4", "--dp-size", "2", "--with-tokens", "--json", str(out)]
    args += ["data.packing=obfd", "data.doc_masking=true", "data.label_masks=true"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    for rank in json.loads(out.read_text())["steps"][0]["ranks"]:
        for inst in rank["instances"]:
            assert inst["label_mask"] == source.label_mask(inst["id"]).tolist()


def test_label_mask_paths_and_bad_masks(sft_dir, tmp_path):
    assert label_mask_paths(["gs://b/d/token_ids_part_0007.npy"]) == ["gs://b/d/labels_mask_part_0007.npy"]
    with pytest.raises(DataSourceError, match="is not named token_ids_part_N.npy"):
        label_mask_paths(["/d/part-0.npy"])
    with pytest.raises(ConfigError, match="data.label_masks applies to packed documents only"):
        DataConfig(label_masks=True)
    paths = sorted(str(p) for p in sft_dir.glob("token_ids_part_*.npy"))
    short = tmp_path / "short.npy"
    np.zeros(3, np.bool_).tofile(short)
    masks, tok = label_mask_paths(paths), tokenizer_fields(sft_cfg(sft_dir, tmp_path))
    with pytest.raises(DataSourceError, match="short.npy has 3 entries for the"):
        PackedSource(paths, SEQ, tok, tmp_path, label_mask_paths=[str(short)] + masks[1:])
    with pytest.raises(DataSourceError, match="has no label masks"):
        PackedSource(paths, SEQ, tok, tmp_path).label_mask(0)
