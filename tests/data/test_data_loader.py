"""The Grain loader: one place of sharding, exact resume, epochs, fingerprint checks, demo corpus."""

from __future__ import annotations

import itertools
import shutil

import numpy as np
import pytest
from small_run import tokenized_demo

from olmax.config.data import DataConfig
from olmax.data.loader import DataStateError, RankBatches, make_loader
from olmax.data.order import num_batches, permutation

VOCAB = 5000
SEQ = 32


def make_cfg(tmp_path, lengths=(1000, 333, 2048, 777), **kw):
    rng = np.random.default_rng(0)
    paths = []
    for i, n in enumerate(lengths):
        p = tmp_path / f"{i:06d}.npy"
        rng.integers(0, VOCAB, size=n).astype(np.uint16).tofile(p)
        paths.append(str(p))
    base = dict(
        paths=tuple(paths),
        seq_len=SEQ,
        seed=11,
        vocab_size=VOCAB,
        eos_token_id=VOCAB - 1,
        pad_token_id=0,
        work_dir=str(tmp_path / "cache"),
    )
    return DataConfig(**{**base, **kw})


def take(loader, n):
    return list(itertools.islice(iter(loader), n))


def epoch_rows(cfg, global_batch, dp_size, local_ranks=1):
    """Every (batch, instance id) delivered in epoch 1 over all ranks, grouped by process."""
    delivered = []
    for first in range(0, dp_size, local_ranks):
        loader = make_loader(cfg, global_batch, dp_rank=first, dp_size=dp_size, local_ranks=local_ranks)
        for batch in take(loader, loader.batches_per_epoch):
            delivered.extend((int(batch["batch"]), int(i)) for i in batch["index"])
            for row, i in zip(batch["input_ids"], batch["index"]):
                np.testing.assert_array_equal(row, loader.source[int(i)])
        assert loader.audit()["repeats_in_epoch"] == 0
    return delivered


def assert_each_instance_once(cfg, delivered, global_batch):
    n = 4158 // SEQ  # instances: files cut separately
    ids = [i for _, i in delivered]
    assert len(ids) == len(set(ids)) == num_batches(len(permutation(n, cfg.seed, 1)), global_batch) * global_batch
    # and each batch holds exactly OLMo-core's row of the permutation
    order = permutation(n, cfg.seed, 1)
    for b in {b for b, _ in delivered}:
        assert sorted(i for bb, i in delivered if bb == b) == sorted(order[b * global_batch : (b + 1) * global_batch])


@pytest.mark.parametrize("dp_size,local_ranks", [(1, 1), (2, 1), (4, 1), (4, 2)])
def test_every_instance_exactly_once_per_epoch(tmp_path, dp_size, local_ranks):
    cfg = make_cfg(tmp_path)
    assert_each_instance_once(cfg, epoch_rows(cfg, 8, dp_size, local_ranks), 8)


def test_double_sharding_would_be_caught(tmp_path):
    """Regression test for MaxText's bug: sharding given to Grain on top of our rank columns."""
    import grain

    cfg = make_cfg(tmp_path)
    delivered = []
    for rank in range(2):
        loader = make_loader(cfg, 8, dp_rank=rank, dp_size=2)
        batches: RankBatches = loader.epoch_batches(1, 0)
        sampler = grain.samplers.IndexSampler(
            num_records=len(batches), shuffle=False, num_epochs=1, shard_options=grain.sharding.ShardOptions(rank, 2)
        )
        dl = grain.DataLoader(data_source=batches, sampler=sampler, worker_count=0)
        delivered.extend((int(b["batch"]), int(i)) for b in dl for i in b["index"])
    with pytest.raises(AssertionError):
        assert_each_instance_once(cfg, delivered, 8)


def test_workers_do_not_change_batches_or_the_resume_state(tmp_path):
    """Two Grain worker processes, started mid-epoch from a resume state, deliver rank 1 of 2's batches
    as the loader without workers does, and its state counts the batches delivered, not those prefetched
    (one loader with workers: each of its workers is a process that imports Grain)."""
    cfg = make_cfg(tmp_path)
    reference = take(make_loader(cfg, 8, dp_rank=1, dp_size=2), 9)
    first = make_loader(cfg, 8, dp_rank=1, dp_size=2)
    take(first, 4)
    resumed = make_loader(make_cfg(tmp_path, num_workers=2), 8, dp_rank=1, dp_size=2, state=first.state())
    for x, y in zip(take(resumed, 5), reference[4:], strict=True):
        np.testing.assert_array_equal(x["input_ids"], y["input_ids"])
        np.testing.assert_array_equal(x["index"], y["index"])
        assert x["input_ids"].dtype == np.int32 and x["input_ids"].shape == (4, SEQ)
    assert resumed.state()["batches_processed"] == 9 and resumed.state()["epoch"] == 1


def test_resume_continues_exactly(tmp_path):
    cfg = make_cfg(tmp_path)
    reference = take(make_loader(cfg, 8), 9)
    first = make_loader(cfg, 8)
    for _ in take(first, 4):
        pass
    state = first.state()
    assert state["batches_processed"] == 4 and state["epoch"] == 1
    resumed = take(make_loader(cfg, 8, state=state), 5)
    for x, y in zip(resumed, reference[4:], strict=True):
        np.testing.assert_array_equal(x["index"], y["index"])
        np.testing.assert_array_equal(x["input_ids"], y["input_ids"])


def test_resume_on_other_dp_size_continues_the_global_order(tmp_path):
    cfg = make_cfg(tmp_path)
    reference = take(make_loader(cfg, 8), 6)
    first = make_loader(cfg, 8)
    take(first, 3)
    state = first.state()
    halves = [take(make_loader(cfg, 8, dp_rank=r, dp_size=2, state=state), 3) for r in range(2)]
    for k in range(3):
        ref = reference[3 + k]["index"]
        np.testing.assert_array_equal(halves[0][k]["index"], ref[0::2])
        np.testing.assert_array_equal(halves[1][k]["index"], ref[1::2])


def test_epochs_roll_over_with_a_new_permutation(tmp_path):
    cfg = make_cfg(tmp_path)
    loader = make_loader(cfg, 16)
    per_epoch = loader.batches_per_epoch
    batches = take(loader, per_epoch + 2)
    assert loader.state()["epoch"] == 2 and loader.state()["batches_processed"] == 2
    n = len(loader.source)
    np.testing.assert_array_equal(batches[per_epoch]["index"], permutation(n, cfg.seed, 2)[:16])
    assert loader.audit() == {"instances_delivered": (per_epoch + 2) * 16, "repeats_in_epoch": 0}


def test_fingerprint_mismatch_names_the_change(tmp_path):
    cfg = make_cfg(tmp_path)
    loader = make_loader(cfg, 8)
    take(loader, 2)
    state = loader.state()
    with open(cfg.paths[2], "ab") as f:
        f.write(np.zeros(SEQ, dtype=np.uint16).tobytes())
    with pytest.raises(DataStateError, match="000002.npy: 4096 -> 4160 bytes"):
        make_loader(cfg, 8, state=state)
    resumed = make_loader(cfg, 8, state=state, allow_fingerprint_mismatch=True)
    assert resumed.state()["batches_processed"] == 2


def test_instance_filter_marks_repetitive_rows(tmp_path):
    cfg = make_cfg(tmp_path, instance_filter=True)
    loader = make_loader(cfg, 8)
    batch = take(loader, 1)[0]
    assert batch["instance_mask"].dtype == bool and batch["instance_mask"].all()  # random ids never repeat 32x


@pytest.mark.parity
def test_batches_equal_olmo_core_loader(tmp_path):
    from olmo_core.data import DataCollator, NumpyDataLoaderBase, NumpyFSLDatasetConfig, TokenizerConfig

    cfg = make_cfg(tmp_path)
    tok = TokenizerConfig(vocab_size=VOCAB, eos_token_id=VOCAB - 1, pad_token_id=0)
    ds = NumpyFSLDatasetConfig(
        tokenizer=tok, paths=list(cfg.paths), sequence_length=SEQ, work_dir=str(tmp_path / "olmo")
    ).build()
    ds.prepare()
    for rank in range(2):
        dl = NumpyDataLoaderBase.wrap_numpy_dataset(
            ds,
            global_batch_size=8 * SEQ,
            collator=DataCollator(pad_token_id=0),
            work_dir=str(tmp_path / "olmo"),
            seed=cfg.seed,
            dp_world_size=2,
            dp_rank=rank,
        )
        dl.reshuffle(epoch=1)
        ours = make_loader(cfg, 8, dp_rank=rank, dp_size=2)
        assert ours.source.fingerprint == ds.fingerprint
        for theirs, mine in zip(dl, take(ours, ours.batches_per_epoch)):
            np.testing.assert_array_equal(mine["input_ids"], theirs["input_ids"].numpy())
        dl.reset()


def test_demo_corpus_trains_and_evaluates(tmp_path):
    from olmax.data.loader import eval_batches

    # the demo corpus as its first use tokenized it (once per test process: small_run)
    shutil.copytree(tokenized_demo(), tmp_path / "demo")
    cfg = DataConfig(paths=("demo",), seq_len=256, work_dir=str(tmp_path))
    loader = make_loader(cfg, 16)
    assert loader.batches_per_epoch > 300  # > 1.3M tokens
    batch = take(loader, 1)[0]
    assert batch["input_ids"].shape == (16, 256) and batch["input_ids"].max() < 100278
    held = list(eval_batches(cfg, ["demo:heldout"], 16))
    assert len(held) >= 10
    train_rows = {r.tobytes() for r in (loader.source[i] for i in range(len(loader.source)))}
    assert not any(r.tobytes() in train_rows for r in held[0])


def test_manifest_tokenizer_must_match_config(tmp_path):
    from olmax.data.sources import DataSourceError
    from olmax.data.tokenize import tokenize_files

    text = tmp_path / "doc.txt"
    text.write_text("some words to tokenize " * 50)
    tokenize_files([text], tmp_path / "shards", show_progress=False)
    cfg = DataConfig(paths=(str(tmp_path / "shards"),), seq_len=16, work_dir=str(tmp_path / "cache"))
    assert make_loader(cfg, 2).source.dtype == np.uint32
    wrong = DataConfig(
        paths=cfg.paths, seq_len=16, vocab_size=50280, eos_token_id=50279, pad_token_id=1, work_dir=cfg.work_dir
    )
    with pytest.raises(DataSourceError, match="tokenized with dolma2 \\(vocab_size=100278\\)"):
        make_loader(wrong, 2)
