"""Instances, fingerprint and order against ai2-olmo-core 3.0.0's NumpyFSLDataset + NumpyDataLoader."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from olmax.cli.common import app
from olmax.data.order import batch_ids, cached_permutation, num_batches, permutation, rank_ids
from olmax.data.sources import DataSourceError, TokenSource, resolve_paths
from olmax.data.tokenizer import TokenizerFields

DOLMA2 = TokenizerFields(vocab_size=100278, eos_token_id=100257, pad_token_id=100277)
SMALL = TokenizerFields(vocab_size=5000, eos_token_id=4999, pad_token_id=0)  # uint16 files


def write_shards(tmp_path, tok: TokenizerFields, lengths, seed=0):
    """Raw token files of the given lengths (in tokens), random ids below the vocab size."""
    rng = np.random.default_rng(seed)
    paths = []
    for i, n in enumerate(lengths):
        path = tmp_path / f"part-{i:03d}.npy"
        rng.integers(0, tok.vocab_size, size=n).astype(tok.dtype).tofile(path)
        paths.append(str(path))
    return paths


# Uneven files, so remainders are dropped per file and batches straddle files.
LENGTHS = [1000, 37, 4096 + 5, 2500, 64 * 9 + 63]


def olmo_core_loader(paths, tok, seq_len, global_batch, seed, dp_size, dp_rank, work_dir, max_target=None, epoch=1):
    from olmo_core.data import DataCollator, NumpyDataLoaderBase, NumpyFSLDatasetConfig, TokenizerConfig

    tok_cfg = TokenizerConfig(
        vocab_size=tok.vocab_size,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
    )
    ds = NumpyFSLDatasetConfig(
        tokenizer=tok_cfg,
        paths=list(paths),
        sequence_length=seq_len,
        max_target_sequence_length=max_target,
        work_dir=str(work_dir),
    ).build()
    ds.prepare()
    dl = NumpyDataLoaderBase.wrap_numpy_dataset(
        ds,
        global_batch_size=global_batch * seq_len,
        collator=DataCollator(pad_token_id=tok.pad_token_id),
        work_dir=str(work_dir),
        seed=seed,
        dp_world_size=dp_size,
        dp_rank=dp_rank,
    )
    dl.reshuffle(epoch=epoch)
    return ds, dl


@pytest.mark.parity
@pytest.mark.parametrize("tok", [DOLMA2, SMALL], ids=["uint32", "uint16"])
@pytest.mark.parametrize("max_target", [None, 64, 128])
def test_instances_and_fingerprint_match_olmo_core(tmp_path, tok, max_target):
    paths = write_shards(tmp_path, tok, LENGTHS)
    ours = TokenSource(paths, seq_len=64, tokenizer=tok, max_target_seq_len=max_target)
    ds, _ = olmo_core_loader(paths, tok, 64, 4, 1, 1, 0, tmp_path / "work", max_target)
    assert ours.fingerprint == ds.fingerprint
    assert len(ours) == len(ds)
    assert [tuple(o) for o in zip(ours.offsets[:-1], ours.offsets[1:])] == list(ds.offsets)
    for i in range(len(ds)):
        np.testing.assert_array_equal(ours[i], ds[i]["input_ids"].numpy())


@pytest.mark.parity
@pytest.mark.parametrize("dp_size", [1, 2, 4])
@pytest.mark.parametrize("seed,epoch,max_target", [(34521, 1, None), (7, 2, None), (34521, 1, 128)])
def test_rank_batches_match_olmo_core(tmp_path, dp_size, seed, epoch, max_target):
    seq_len, global_batch = 64, 8
    paths = write_shards(tmp_path, SMALL, LENGTHS)
    source = TokenSource(paths, seq_len, SMALL, max_target_seq_len=max_target)
    chunk = max_target // seq_len if max_target else 1
    order = cached_permutation(tmp_path / "order", len(source), seed, epoch, chunk)
    total = num_batches(len(order), global_batch)
    assert total >= 3
    for rank in range(dp_size):
        _, dl = olmo_core_loader(
            paths, SMALL, seq_len, global_batch, seed, dp_size, rank, tmp_path / f"work{rank}", max_target, epoch
        )
        theirs = [batch["index"].tolist() for batch in dl]
        assert len(theirs) == total == dl.total_batches
        for b, their_ids in enumerate(theirs):
            ids = rank_ids(order, b, global_batch, rank, dp_size)
            assert ids.tolist() == their_ids
        dl.reset()


def test_permutation_is_pcg64_shuffle_and_memmap_equal(tmp_path):
    n, seed, epoch = 100_003, 34521, 1
    expected = np.arange(n, dtype=np.uint32)
    np.random.Generator(np.random.PCG64(seed + epoch)).shuffle(expected)
    np.testing.assert_array_equal(permutation(n, seed, epoch), expected)
    np.testing.assert_array_equal(np.random.default_rng(seed + epoch).permutation(n), expected)
    cached = cached_permutation(tmp_path, n, seed, epoch)
    np.testing.assert_array_equal(cached, expected)
    assert isinstance(cached, np.memmap)
    again = cached_permutation(tmp_path, n, seed, epoch)  # reuses the file
    np.testing.assert_array_equal(again, expected)


def test_batches_cover_each_instance_once_per_epoch():
    order = permutation(1000, 3, 1)
    global_batch = 24
    seen = np.concatenate(
        [rank_ids(order, b, global_batch, r, 4) for b in range(num_batches(1000, global_batch)) for r in range(4)]
    )
    assert len(seen) == len(np.unique(seen)) == (1000 // 24) * 24
    # the ranks together are exactly the global batch, whatever the dp size
    np.testing.assert_array_equal(
        np.sort(np.concatenate([rank_ids(order, 5, 24, r, 3) for r in range(3)])), np.sort(batch_ids(order, 5, 24))
    )


def test_bad_files_are_named(tmp_path):
    good = write_shards(tmp_path, DOLMA2, [300])[0]
    odd = tmp_path / "odd.npy"
    odd.write_bytes(b"\x00" * 7)
    with pytest.raises(DataSourceError, match="odd.npy.*not a multiple"):
        TokenSource([good, str(odd)], 64, DOLMA2)
    header = tmp_path / "header.npy"
    np.save(header, np.arange(100, dtype=np.uint32))
    with pytest.raises(DataSourceError, match="header.npy.*header"):
        TokenSource([str(header)], 64, DOLMA2)
    empty = tmp_path / "empty.npy"
    empty.write_bytes(b"")
    with pytest.raises(DataSourceError, match="empty.npy is empty"):
        TokenSource([str(empty)], 64, DOLMA2)
    with pytest.raises(DataSourceError, match="missing.npy does not exist"):
        TokenSource([str(tmp_path / "missing.npy")], 64, DOLMA2)
    big = tmp_path / "big.npy"
    np.array([1, 2, 200000], dtype=np.uint32).tofile(big)
    with pytest.raises(DataSourceError, match="big.npy: token 200000 at position 2"):
        TokenSource([str(big)], 64, DOLMA2)
    # uint16 data read as dolma2's uint32: caught by the vocabulary sample
    small = tmp_path / "small.npy"
    np.full(64, 60000, dtype=np.uint16).tofile(small)
    with pytest.raises(DataSourceError, match="small.npy"):
        TokenSource([str(small)], 16, DOLMA2)


def test_resolve_glob_manifest_and_mix(tmp_path):
    paths = write_shards(tmp_path, SMALL, [100, 100, 100])
    assert resolve_paths([str(tmp_path / "part-*.npy")]) == sorted(paths)
    mix = tmp_path / "mix.txt"
    mix.write_text("# comment\nweb,data/{TOKENIZER}/a/000000.npy\n\ncode,data/{TOKENIZER}/b/000001.npy\n")
    assert resolve_paths([str(mix)], mix_base="http://example.org/base") == [
        "http://example.org/base/data/allenai/dolma3-tokenizer/a/000000.npy",
        "http://example.org/base/data/allenai/dolma3-tokenizer/b/000001.npy",
    ]
    bad = tmp_path / "bad.txt"
    bad.write_text("web,data/a/000000.npy\n")
    with pytest.raises(DataSourceError, match="bad.txt line 1"):
        resolve_paths([str(bad)], mix_base="/data")
    with pytest.raises(DataSourceError, match="matched no files"):
        resolve_paths([str(tmp_path / "nothing-*.npy")])


def test_remote_reads_are_ranges(tmp_path):
    """A URL source (fsspec memory://) gives the same instances as the local files."""
    import fsspec

    paths = write_shards(tmp_path, SMALL, LENGTHS)
    fs = fsspec.filesystem("memory")
    urls = []
    for p in paths:
        url = f"memory://olmax-test/{p.rsplit('/', 1)[1]}"
        fs.pipe(url, open(p, "rb").read())
        urls.append(url)
    local = TokenSource(paths, 64, SMALL)
    remote = TokenSource(resolve_paths(["memory://olmax-test/part-*.npy"]), 64, SMALL)
    assert remote.fingerprint == local.fingerprint
    for i in range(len(local)):
        np.testing.assert_array_equal(remote[i], local[i])


def test_cli_order_steps_outside_the_epoch_are_named(tmp_path):
    """174 instances against a global batch of 512 have no step at all; with 8 per batch (21 steps),
    steps before 1, past 21 or an empty range are each refused by name with exit status 2."""
    write_shards(tmp_path, SMALL, [174 * 16 + 5])
    tok = ["--vocab-size", "5000", "--eos-id", "4999", "--pad-id", "0", "--work-dir", str(tmp_path / "cache")]

    def order(batch: int, steps: str):
        args = ["data", "order", "--paths", str(tmp_path / "part-000.npy"), "--seq-len", "16", "--seed", "34521"]
        return CliRunner().invoke(app, args + tok + ["--global-batch", str(batch), "--steps", steps])

    for steps in ("1:3", "0:2", "5000:5002"):
        result = order(512, steps)
        assert result.exit_code == 2, (steps, result.output)
        assert (
            "data error: the data has 174 instances of 16 tokens, fewer than one global batch of 512: no step exists"
            in result.output
        )
    result = order(8, "0:2")
    assert result.exit_code == 2 and "steps 0:2 start before step 1: steps count from 1" in result.output
    result = order(8, "20:23")
    assert result.exit_code == 2, result.output
    assert (
        "steps 20:23 go past the last step 21 of epoch 1: 174 instances of 16 tokens make 21 global batches of 8"
        in result.output
    )
    result = order(8, "3:3")
    assert result.exit_code == 2 and "steps 3:3 is empty" in result.output
    result = order(8, "21:22")  # the last step exists
    assert result.exit_code == 0 and "step 21 (batch 20) rank 0" in result.output, result.output
    # the flag's old name said instances, where a DPO batch counts pairs: refused, naming the new one
    args = ["data", "order", "--paths", str(tmp_path / "part-000.npy"), "--global-batch-instances", "8"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "--global-batch-instances is now --global-batch" in result.output


def test_cli_order_refuses_rollouts_by_their_kind():
    """GRPO's rows are sampled by the RL loop at each step: no order of data.paths says what a step
    trains on, so `olmax data order` names the kind instead of ordering the prompts as token files."""
    from olmax.errors import ConfigError

    result = CliRunner().invoke(app, ["data", "order", "--recipe", "tiny_grpo"])
    assert isinstance(result.exception, ConfigError), result.output
    assert "trainer.objective=grpo trains on the data kind 'rollouts'" in str(result.exception)


@pytest.mark.parametrize("packing", ["none", "obfd"])
def test_cli_order_with_tokens_on_lm_data_has_no_label_mask(tmp_path, packing):
    """Data without label masks (data.label_masks=false, LM shards chunked or packed): `--with-tokens`
    prints each instance as {"id", "tokens", "doc_lens"} and the rest of the report as before, with no
    label_mask key anywhere."""
    import json

    from olmax.data.loader import read_instance
    from olmax.data.packing import PackedSource

    paths = write_shards(tmp_path, SMALL, [1000, 2500])
    rng = np.random.default_rng(1)
    for p in paths:  # an EOS every 1..199 tokens: documents for the packer to find
        tokens = np.fromfile(p, dtype=SMALL.dtype)
        ends = np.cumsum(rng.integers(1, 200, size=len(tokens)))
        tokens[ends[ends < len(tokens)]] = SMALL.eos_token_id
        tokens.tofile(p)
    out = tmp_path / "order.json"
    args = ["data", "order", *[a for p in paths for a in ("--paths", p)], "--seq-len", "64", "--seed", "3"]
    args += ["--vocab-size", "5000", "--eos-id", "4999", "--pad-id", "0", "--work-dir", str(tmp_path / "cache")]
    args += ["--global-batch", "4", "--dp-size", "2", "--steps", "1:3", "--with-tokens", "--json", str(out)]
    args += [f"data.packing={packing}", "data.doc_masking=true"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "label_mask" not in out.read_text() and "label_mask" not in result.output
    report = json.loads(out.read_text())
    common = ["batches_per_epoch", "dp_size", "epoch", "files", "fingerprint", "global_batch"]
    assert sorted(report) == common + ["instances", "packing", "seed", "seq_len", "steps"]
    where = ["bin", "documents", "group", "padding"] if packing == "obfd" else ["file", "offset"]
    if packing == "obfd":
        source = PackedSource(paths, 64, SMALL, tmp_path / "cache")
    else:
        source = TokenSource(paths, 64, SMALL)
    for step in report["steps"]:
        assert sorted(step) == ["batch", "ranks", "step"]
        for rank in step["ranks"]:
            assert sorted(rank) == sorted(["ids", "instances", "rank", *where])
            assert [inst["id"] for inst in rank["instances"]] == rank["ids"]
            for inst in rank["instances"]:
                assert sorted(inst) == ["doc_lens", "id", "tokens"]
                tokens, lens = read_instance(source, inst["id"], SMALL.eos_token_id, None)
                assert inst["tokens"] == tokens.tolist() and inst["doc_lens"] == lens.tolist()
