"""OBFD-packed instances, doc_lens, fingerprint and order against ai2-olmo-core 3.0.0's NumpyPackedFSLDataset."""

from __future__ import annotations

import gzip
import json
from collections import deque

import numpy as np
import pytest
from typer.testing import CliRunner

from olmax.cli.common import app
from olmax.config.data import DataConfig
from olmax.data.loader import make_loader
from olmax.data.order import cached_permutation, num_batches, rank_ids
from olmax.data.packing import (
    PackedSource,
    cap_long_documents,
    doc_lengths,
    eos_spans,
    obfd,
    pack_spans,
    permute_paths,
)
from olmax.data.sources import DataSourceError
from olmax.data.tokenizer import TokenizerFields
from olmax.errors import ConfigError

SMALL = TokenizerFields(vocab_size=5000, eos_token_id=4999, pad_token_id=0)  # uint16 files
DOLMA2 = TokenizerFields(vocab_size=100278, eos_token_id=100257, pad_token_id=100277)
WITH_BOS = TokenizerFields(vocab_size=5000, eos_token_id=4999, pad_token_id=0, bos_token_id=4998)
SEQ = 64


def write_docs(tmp_path, tok: TokenizerFields, n_files=5, seed=0, name="part"):
    """Token files of whole documents (ids below the specials, EOS-terminated, BOS-started when the
    tokenizer has one) with lengths drawn to repeat (ties), to exceed SEQ, and a tail without EOS;
    then one file with no EOS at all."""
    rng = np.random.default_rng(seed)
    specials = {tok.eos_token_id, tok.pad_token_id, tok.bos_token_id}
    paths = []
    for i in range(n_files):
        docs = []
        for _ in range(int(rng.integers(5, 40))):
            kind = rng.random()
            if kind < 0.35:
                n = int(rng.choice([5, 16, 32]))  # many equal lengths: tie-breaking
            elif kind < 0.45:
                n = int(rng.integers(SEQ + 1, 3 * SEQ))  # longer than the sequence
            elif kind < 0.5:
                n = SEQ  # exactly one instance
            else:
                n = int(rng.integers(1, SEQ))
            body = rng.integers(1, tok.vocab_size - 2, size=n)
            body = body[~np.isin(body, list(specials))] if len(body) > 1 else np.asarray([7])
            if tok.bos_token_id is not None:
                body = np.concatenate([[tok.bos_token_id], body])
            docs.append(np.concatenate([body, [tok.eos_token_id]]))
        tail = rng.integers(1, 100, size=int(rng.integers(0, 20)))  # no EOS after it: dropped
        path = tmp_path / f"{name}-{i:03d}.npy"
        np.concatenate(docs + [tail]).astype(tok.dtype).tofile(path)
        paths.append(str(path))
    path = tmp_path / f"{name}-{n_files:03d}.npy"  # a file without any EOS: no document at all
    rng.integers(1, 100, size=24).astype(tok.dtype).tofile(path)
    return paths + [str(path)]


def olmo_core_packed(paths, tok, work_dir, strategy="truncate", group_size=1, perm_seed=None):
    from olmo_core.data import NumpyPackedFSLDatasetConfig, TokenizerConfig
    from olmo_core.data.types import LongDocStrategy

    tok_cfg = TokenizerConfig(
        vocab_size=tok.vocab_size,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
    )
    ds = NumpyPackedFSLDatasetConfig(
        tokenizer=tok_cfg,
        paths=list(paths),
        sequence_length=SEQ,
        generate_doc_lengths=True,
        long_doc_strategy=LongDocStrategy(strategy),
        source_group_size=group_size,
        source_permutation_seed=perm_seed,
        work_dir=str(work_dir),
    ).build()
    ds.prepare()
    return ds


def fifo_obfd(lengths, seq_len):
    """The rule with explicit per-free-space FIFO queues, linear search (independent of obfd())."""
    order = np.argsort(-1 * lengths.astype(np.int64))
    queues: dict[int, deque] = {}
    bins: list[list[int]] = []
    for d in order:
        length = int(lengths[d])
        fits = sorted(s for s, q in queues.items() if q and s >= length)
        if fits:
            space = fits[0]
            b = queues[space].popleft()
        else:
            space, b = seq_len, len(bins)
            bins.append([])
        bins[b].append(int(d))
        if space - length:
            queues.setdefault(space - length, deque()).append(b)
    return bins


@pytest.mark.parametrize("seed", range(6))
def test_obfd_matches_the_rule_stated_plainly(seed):
    rng = np.random.default_rng(seed)
    lengths = np.concatenate([rng.integers(1, 65, size=300), np.full(40, 16), np.full(10, 64), np.full(7, 33)])
    rng.shuffle(lengths)
    order, bin_of = obfd(lengths, 64)
    ours = [[] for _ in range(int(bin_of.max()) + 1)]
    for k, d in enumerate(order):
        ours[bin_of[k]].append(int(d))
    assert ours == fifo_obfd(lengths, 64)
    assert all(sum(lengths[b]) <= 64 for b in ours)


def test_long_documents_truncate_and_fragment():
    spans = np.asarray([[0, 10], [10, 150], [150, 214], [214, 215]])
    np.testing.assert_array_equal(
        cap_long_documents(spans, 64, "truncate"), [[0, 10], [10, 74], [150, 214], [214, 215]]
    )
    np.testing.assert_array_equal(
        cap_long_documents(spans, 64, "fragment"),
        [[0, 10], [10, 74], [74, 138], [138, 150], [150, 214], [214, 215]],
    )


def test_eos_spans_blocks_and_bos(monkeypatch):
    import olmax.data.packing as packing

    monkeypatch.setattr(packing, "_SCAN_BLOCK", 4)  # boundaries across read blocks
    ids = np.asarray([3, 9, 5, 9, 8, 4, 4, 9, 8, 1, 9, 9, 2])
    read = lambda s, c: ids[s : s + c]  # noqa: E731
    np.testing.assert_array_equal(eos_spans(read, len(ids), 9, None), [[0, 2], [2, 4], [4, 8], [8, 11], [11, 12]])
    np.testing.assert_array_equal(eos_spans(read, len(ids), 9, 8), [[0, 4], [4, 8]])
    np.testing.assert_array_equal(eos_spans(read, 12, 9, 8), [[0, 4], [4, 8], [8, 12]])  # ends in EOS
    no_eos = np.asarray([3, 5, 8, 4, 4, 1])  # a file of one unterminated document: nothing to pack
    assert eos_spans(lambda s, c: no_eos[s : s + c], len(no_eos), 9, None).shape == (0, 2)
    assert eos_spans(lambda s, c: no_eos[s : s + c], len(no_eos), 9, 8).shape == (0, 2)


def test_doc_lengths_as_olmo_core_counts_them():
    np.testing.assert_array_equal(doc_lengths(np.asarray([1, 9, 2, 2, 9, 0, 0]), 9), [2, 3, 2])
    np.testing.assert_array_equal(doc_lengths(np.asarray([1, 9, 2, 9]), 9), [2, 2])
    np.testing.assert_array_equal(doc_lengths(np.asarray([8, 1, 9, 8, 9, 0, 0]), 9, 8), [3, 4])


def test_source_permutation_is_pythons_random():
    import random

    order = list(range(10))
    random.Random(123).shuffle(order)
    assert permute_paths([f"p{i}" for i in range(10)], 123) == [f"p{i}" for i in order]
    assert permute_paths(["a", "b"], None) == ["a", "b"]


@pytest.mark.parity
@pytest.mark.parametrize(
    "tok,strategy,group_size,perm_seed",
    [
        (SMALL, "truncate", 1, None),
        (SMALL, "fragment", 1, None),
        (SMALL, "truncate", 3, 123),
        (DOLMA2, "fragment", 3, 123),
        (WITH_BOS, "truncate", 2, 7),
    ],
    ids=["truncate", "fragment", "group3-perm", "uint32-fragment-group3", "bos"],
)
def test_instances_doc_lens_and_fingerprint_match_olmo_core(tmp_path, tok, strategy, group_size, perm_seed):
    paths = write_docs(tmp_path, tok)
    ds = olmo_core_packed(paths, tok, tmp_path / "oc", strategy, group_size, perm_seed)
    ours = PackedSource(permute_paths(paths, perm_seed), SEQ, tok, tmp_path / "ox", strategy, group_size)
    assert ours.fingerprint == ds.fingerprint
    assert len(ours) == len(ds) > 20
    for i in range(len(ds)):
        theirs = ds[i]
        tokens, lens = ours.read(i)
        np.testing.assert_array_equal(tokens, theirs["input_ids"].numpy())
        np.testing.assert_array_equal(tokens != tok.pad_token_id, theirs["label_mask"].numpy())
        np.testing.assert_array_equal(lens, theirs["doc_lens"].numpy())


@pytest.mark.parity
def test_fsl_doc_lens_and_permuted_fingerprint_match_olmo_core(tmp_path):
    """packing=none: document lengths of concatenate-and-chunk instances, and the permuted path order."""
    from olmo_core.data import NumpyFSLDatasetConfig, TokenizerConfig

    paths = write_docs(tmp_path, SMALL)
    tok_cfg = TokenizerConfig(vocab_size=5000, eos_token_id=4999, pad_token_id=0)
    ds = NumpyFSLDatasetConfig(
        tokenizer=tok_cfg,
        paths=paths,
        sequence_length=SEQ,
        generate_doc_lengths=True,
        source_permutation_seed=5,
        work_dir=str(tmp_path / "oc"),
    ).build()
    ds.prepare()
    cfg = DataConfig(
        paths=tuple(paths),
        seq_len=SEQ,
        vocab_size=5000,
        eos_token_id=4999,
        pad_token_id=0,
        source_permutation_seed=5,
        doc_masking=True,
        work_dir=str(tmp_path / "ox"),
    )
    loader = make_loader(cfg, global_batch=2)
    assert loader.source.fingerprint == ds.fingerprint
    for i in range(len(ds)):
        np.testing.assert_array_equal(loader.source[i], ds[i]["input_ids"].numpy())
    batch = next(iter(loader))
    for row, idx in zip(batch["doc_lens"], batch["index"]):
        theirs = ds[int(idx)]["doc_lens"].numpy()
        np.testing.assert_array_equal(row[: len(theirs)], theirs)
        assert not row[len(theirs) :].any() and row.shape == (SEQ,)


def packed_cfg(paths, tmp_path, **kw) -> DataConfig:
    return DataConfig(
        paths=tuple(paths),
        seq_len=SEQ,
        vocab_size=5000,
        eos_token_id=4999,
        pad_token_id=0,
        packing="obfd",
        doc_masking=True,
        work_dir=str(tmp_path / "ox"),
        **kw,
    )


@pytest.mark.parity
@pytest.mark.parametrize("dp_size", [1, 2])
def test_packed_order_two_epochs_and_ranks_match_olmo_core(tmp_path, dp_size):
    from olmo_core.data import DataCollator, NumpyDataLoaderBase

    paths = write_docs(tmp_path, SMALL, n_files=6)
    global_batch, seed = 4, 17
    cfg = packed_cfg(paths, tmp_path, source_group_size=3, source_permutation_seed=123, seed=seed)
    ds = olmo_core_packed(paths, SMALL, tmp_path / "oc", "truncate", 3, 123)
    for rank in range(dp_size):
        loader = make_loader(cfg, global_batch, dp_rank=rank, dp_size=dp_size)
        assert loader.source.fingerprint == ds.fingerprint
        per_epoch = loader.batches_per_epoch
        ours = iter(loader)
        for epoch in (1, 2):
            dl = NumpyDataLoaderBase.wrap_numpy_dataset(
                ds,
                global_batch_size=global_batch * SEQ,
                collator=DataCollator(pad_token_id=0),
                work_dir=str(tmp_path / f"oc-order{rank}"),
                seed=seed,
                dp_world_size=dp_size,
                dp_rank=rank,
            )
            dl.reshuffle(epoch=epoch)
            theirs = list(dl)
            assert len(theirs) == per_epoch
            for batch in theirs:
                mine = next(ours)
                assert mine["index"].tolist() == batch["index"].tolist()
                np.testing.assert_array_equal(mine["input_ids"], batch["input_ids"].numpy())
                width = batch["doc_lens"].shape[1]
                np.testing.assert_array_equal(mine["doc_lens"][:, :width], batch["doc_lens"].numpy())
            dl.reset()


def test_index_is_built_once_and_reused(tmp_path):
    paths = write_docs(tmp_path, SMALL)
    first = PackedSource(paths, SEQ, SMALL, tmp_path / "w", group_size=2)
    stamps = [f.stat().st_mtime_ns for f in first.index_files]
    assert len(first.index_files) == 3 and all(f.is_file() for f in first.index_files)
    again = PackedSource(paths, SEQ, SMALL, tmp_path / "w", group_size=2)
    assert [f.stat().st_mtime_ns for f in again.index_files] == stamps
    assert again.fingerprint == first.fingerprint
    assert not list((tmp_path / "w" / "packing").glob("*.tmp"))
    other = PackedSource(paths, SEQ, SMALL, tmp_path / "w", long_doc_strategy="fragment", group_size=2)
    assert set(other.index_files).isdisjoint(first.index_files)


def test_packed_instances_are_whole_documents(tmp_path):
    """Every kept document appears once, intact, in one instance; the tail without EOS nowhere."""
    paths = write_docs(tmp_path, SMALL, n_files=2)
    src = PackedSource(paths, SEQ, SMALL, tmp_path / "w", long_doc_strategy="fragment")
    seen = sorted((fi, s, e) for i in range(len(src)) for fi, s, e in src.documents(i))
    for fi, path in enumerate(paths):
        ids = np.fromfile(path, dtype=SMALL.dtype)
        covered = [(s, e) for f, s, e in seen if f == fi]
        if not (ids == SMALL.eos_token_id).any():  # the file without EOS holds no document
            assert covered == []
            continue
        last_eos = int(np.flatnonzero(ids == SMALL.eos_token_id)[-1]) + 1
        assert covered[0][0] == 0 and covered[-1][1] == last_eos
        assert all(a[1] == b[0] for a, b in zip(covered, covered[1:]))  # contiguous: nothing lost


def test_resume_with_packing_continues_the_order(tmp_path):
    paths = write_docs(tmp_path, SMALL, n_files=6)
    cfg = packed_cfg(paths, tmp_path, source_group_size=3)
    loader = make_loader(cfg, 4)
    it = iter(loader)
    first = [next(it) for _ in range(3)]
    state = json.loads(json.dumps(loader.state()))
    rest = [next(it)["index"].tolist() for _ in range(2)]
    resumed = iter(make_loader(cfg, 4, state=state))
    assert [next(resumed)["index"].tolist() for _ in range(2)] == rest
    assert first[0]["doc_lens"].dtype == np.int32 and first[0]["doc_lens"].shape == (4, SEQ)
    # other data: the fingerprint check names the change
    from olmax.data.loader import DataStateError

    with pytest.raises(DataStateError, match="long_doc_strategy|fingerprint|differs"):
        make_loader(packed_cfg(paths, tmp_path, source_group_size=3, long_doc_strategy="fragment"), 4, state=state)


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("packing", "bfd", "data.packing"),
        ("long_doc_strategy", "drop", "data.long_doc_strategy"),
        ("source_group_size", 0, "data.source_group_size"),
    ],
)
def test_bad_packing_config_is_refused(field, value, match):
    with pytest.raises(ConfigError, match=match):
        DataConfig(**{"packing": "obfd", field: value})


def test_packing_options_need_obfd():
    with pytest.raises(ConfigError, match="data.packing=obfd"):
        DataConfig(source_group_size=8)
    with pytest.raises(ConfigError, match="max_target_seq_len"):
        DataConfig(packing="obfd", seq_len=64, max_target_seq_len=128)


def test_obfd_needs_a_power_of_2_seq_len(tmp_path):
    """OLMo-core 3.0.0's packer asserts a power-of-2 length (its SegmentTree); olmax refuses the rest."""
    import subprocess
    import sys

    for seq in (300, 96, 65535):
        with pytest.raises(ConfigError, match=f"data.seq_len={seq} with data.packing=obfd must be a power of 2"):
            DataConfig(packing="obfd", seq_len=seq)
    assert DataConfig(seq_len=300).seq_len == 300  # chunked instances take any length
    assert DataConfig(packing="obfd", seq_len=1).seq_len == 1
    with pytest.raises(DataSourceError, match="power-of-2"):
        PackedSource(write_docs(tmp_path, SMALL, n_files=1), 48, SMALL, tmp_path / "w")
    olmax = [sys.executable, "-m", "olmax.cli", "config", "--recipe", "tiny", "data.packing=obfd", "data.seq_len=300"]
    r = subprocess.run(olmax, capture_output=True, text=True)
    one_line = "config error: data.seq_len=300 with data.packing=obfd must be a power of 2 (OLMo-core 3.0.0's "
    assert (r.returncode, r.stderr.count("\n"), r.stdout) == (2, 1, ""), r.stderr
    assert r.stderr.startswith(one_line) and "OBFD packer" in r.stderr


def test_data_order_with_tokens(tmp_path):
    paths = write_docs(tmp_path, SMALL, n_files=3)
    out = tmp_path / "order.json"
    args = ["data", "order", *[a for p in paths for a in ("--paths", p)], "--seq-len", str(SEQ)]
    args += ["--vocab-size", "5000", "--eos-id", "4999", "--pad-id", "0", "--work-dir", str(tmp_path / "w")]
    args += ["--global-batch", "4", "--dp-size", "2", "--with-tokens", "--json", str(out)]
    args += ["data.packing=obfd", "data.doc_masking=true"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "docs" in result.output and "pad" in result.output
    report = json.loads(out.read_text())
    src = PackedSource(paths, SEQ, SMALL, tmp_path / "w")
    for rank in report["steps"][0]["ranks"]:
        assert [x["id"] for x in rank["instances"]] == rank["ids"]
        for inst in rank["instances"]:
            tokens, lens = src.read(inst["id"])
            assert inst["tokens"] == tokens.tolist() and inst["doc_lens"] == lens.tolist()


def test_order_of_packed_instances_is_the_fsl_order(tmp_path):
    paths = write_docs(tmp_path, SMALL, n_files=4)
    loader = make_loader(packed_cfg(paths, tmp_path), 4, dp_rank=1, dp_size=2)
    order = cached_permutation(tmp_path / "o", len(loader.source), loader.seed, 1)
    batch = next(iter(loader))
    assert batch["index"].tolist() == rank_ids(order, 0, 4, 1, 2).tolist()
    assert loader.batches_per_epoch == num_batches(len(order), 4)


def test_packed_obfd_pack_spans_layout():
    spans = np.asarray([[0, 40], [40, 70], [70, 94], [94, 100]])
    offsets, packed = pack_spans(spans, 64)
    # 40 opens bin 0 (24 left); 30 opens bin 1 (34 left); 24 fills bin 0; 6 goes to bin 1 (34 >= 6)
    np.testing.assert_array_equal(offsets, [0, 2, 4])
    np.testing.assert_array_equal(packed, [[0, 40], [70, 94], [40, 70], [94, 100]])


def write_metadata(paths, tok, seed=0):
    """`<name>.csv.gz` per file (OLMo-core's `start,end` layout) whose boundaries are NOT all at EOS:
    some documents are cut mid-text, as a producer that truncates documents writes them."""
    rng = np.random.default_rng(seed)
    for path in paths:
        ids = np.fromfile(path, dtype=tok.dtype)
        ends = list(np.flatnonzero(ids == tok.eos_token_id) + 1)
        cuts = [int(e) - int(rng.integers(1, 4)) for e in ends[::3] if e > 5]  # extra boundaries mid-document
        bounds = sorted(set(ends) | set(c for c in cuts if c > 0))
        starts = [0] + bounds[:-1]
        with gzip.open(path.replace(".npy", ".csv.gz"), "wt") as f:
            f.writelines(f"{s},{e},meta\n" for s, e in zip(starts, bounds) if e > s)


@pytest.mark.parity
def test_remote_files_pack_by_their_metadata_as_olmo_core(tmp_path):
    """A URL source takes document boundaries from its .csv.gz (3.0.0 reads the metadata for every URL);
    served over HTTP to olmax and to OLMo-core: same fingerprint, instances and doc_lens."""
    pytest.importorskip("aiohttp")
    import threading

    from fake_remote import RangeServer

    root = tmp_path / "served"
    root.mkdir()
    paths = write_docs(root, SMALL, n_files=3)
    write_metadata(paths, SMALL)
    srv = RangeServer(root)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        urls = [srv.base + "/" + p.rsplit("/", 1)[-1] for p in paths]
        ds = olmo_core_packed(urls, SMALL, tmp_path / "oc", "truncate", 2)
        ours = PackedSource(urls, SEQ, SMALL, tmp_path / "ox", group_size=2)
        assert ours.fingerprint == ds.fingerprint
        assert len(ours) == len(ds) > 10
        for i in range(len(ds)):
            theirs = ds[i]
            tokens, lens = ours.read(i)
            np.testing.assert_array_equal(tokens, theirs["input_ids"].numpy())
            np.testing.assert_array_equal(lens, theirs["doc_lens"].numpy())
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=5)


@pytest.fixture
def served(tmp_path):
    """(root, base URL): files under root served over HTTP with Range support (test_data_remote's server)."""
    pytest.importorskip("aiohttp")
    from fake_remote import serving

    with serving(tmp_path / "served") as srv:
        yield srv.root, srv.base


def metadata_of(path):
    with gzip.open(path.replace(".npy", ".csv.gz"), "rt") as f:
        return [tuple(int(x) for x in line.split(",")[:2]) for line in f if line.strip()]


def test_changed_metadata_of_a_remote_file_rebuilds_its_index(tmp_path, served):
    """Two URLs with one basename in two directories: changing the first one's .csv.gz (the token file
    unchanged) gives a new index for its group with the new boundaries, as 3.0.0 keys its caches by
    full path; before, the digest was looked up by basename and the stale index was read back."""
    root, base = served
    (root / "a").mkdir()
    (root / "b").mkdir()
    a = write_docs(root / "a", SMALL, n_files=1, seed=1)[0]
    b = write_docs(root / "b", SMALL, n_files=1, seed=2)[0]
    write_metadata([a, b], SMALL, seed=0)  # boundaries cut mid-document, not only at EOS
    urls = [f"{base}/a/part-000.npy", f"{base}/b/part-000.npy"]
    work = tmp_path / "w"
    before = PackedSource(urls, SEQ, SMALL, work)
    ids = np.fromfile(a, dtype=SMALL.dtype)  # now the EOS boundaries only: other documents, same token file
    ends = np.flatnonzero(ids == SMALL.eos_token_id) + 1
    with gzip.open(a.replace(".npy", ".csv.gz"), "wt") as f:
        f.writelines(f"{s},{e}\n" for s, e in zip(np.concatenate([[0], ends[:-1]]), ends))
    after = PackedSource(urls, SEQ, SMALL, work)
    assert after.fingerprint != before.fingerprint
    assert after.index_files[0] != before.index_files[0] and after.index_files[1] == before.index_files[1]

    def docs_of(src, fi):
        return sorted((s, e) for i in range(len(src)) for f, s, e in src.documents(i) if f == fi)

    expected = sorted((s, min(e, s + SEQ)) for s, e in metadata_of(a))  # truncate
    assert docs_of(after, 0) == expected != docs_of(before, 0)
    assert docs_of(after, 1) == docs_of(before, 1)
    for i in range(len(after)):
        if after.locate(i)[0] == 0:
            tokens, lens = after.read(i)
            docs = after.documents(i)
            assert lens[: len(docs)].tolist() == [e - s for _, s, e in docs]


class RecordingPool:
    """Stands in for the ProcessPoolExecutor: pickles each task as the real pool would send it to a
    worker, keeps the bytes, and runs the unpickled task here."""

    sent: list[bytes] = []

    def __init__(self, workers, mp_context=None):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def map(self, fn, items):
        import pickle

        for item in items:
            blob = pickle.dumps((fn, item))
            RecordingPool.sent.append(blob)
            fn, item = pickle.loads(blob)
            yield fn(item)


def test_each_packing_task_carries_only_its_groups_files(tmp_path, served, monkeypatch):
    """A worker is sent its own group's paths, sizes and metadata, not the whole source: the pickled
    task of a group is the same size with 2 groups as with 8, and names no other group's file."""
    from olmax.data import packing

    monkeypatch.setattr(packing, "ProcessPoolExecutor", RecordingPool)
    monkeypatch.setattr(packing, "_POOL_MIN_TOKENS", 0)  # use the pool even for these small files
    monkeypatch.setattr(packing.os, "cpu_count", lambda: 8)
    root, base = served
    paths = write_docs(root, SMALL, n_files=8, seed=3)[:8]
    write_metadata(paths, SMALL)
    urls = [f"{base}/{p.rsplit('/', 1)[-1]}" for p in paths]
    sizes = {}
    for n in (2, 8):
        RecordingPool.sent = []
        src = PackedSource(urls[:n], SEQ, SMALL, tmp_path / f"w{n}", group_size=1)
        assert len(RecordingPool.sent) == n and all(f.is_file() for f in src.index_files)
        for g, blob in enumerate(RecordingPool.sent):
            own = gzip_bytes(paths[g])
            assert urls[g].encode() in blob and own in blob
            assert not any(u.encode() in blob for u in urls[:n] if u != urls[g])
            assert len(blob) < len(own) + 2048
        sizes[n] = [len(blob) for blob in RecordingPool.sent]
    assert sizes[8][:2] == sizes[2]  # more groups elsewhere in the mix: the same task bytes


def gzip_bytes(path):
    with open(path.replace(".npy", ".csv.gz"), "rb") as f:
        return f.read()


def test_missing_metadata_of_a_remote_file_is_named(tmp_path, served):
    """The metadata is fetched for all files at once; a missing one still names itself and its file."""
    root, base = served
    paths = write_docs(root, SMALL, n_files=3)[:3]
    write_metadata(paths, SMALL)
    (root / "part-001.csv.gz").unlink()
    urls = [f"{base}/{p.rsplit('/', 1)[-1]}" for p in paths]
    meta = f"{base}/part-001.csv.gz"
    with pytest.raises(DataSourceError, match=f"document metadata {meta} .*remote file {urls[1]}.* does not exist"):
        PackedSource(urls, SEQ, SMALL, tmp_path / "w")


@pytest.mark.parity
def test_remote_fingerprint_with_shared_basenames_and_a_repeated_file(tmp_path, served):
    """3.0.0's metadata hashes are a dict by full path: one entry per distinct path (a file listed twice
    counts once), each named by its basename in the fingerprint. Same fingerprint and instances as 3.0.0."""
    root, base = served
    for d, seed in (("a", 1), ("b", 2)):
        (root / d).mkdir()
        write_metadata(write_docs(root / d, SMALL, n_files=1, seed=seed)[:1], SMALL)
    urls = [f"{base}/a/part-000.npy", f"{base}/b/part-000.npy", f"{base}/a/part-000.npy"]
    ds = olmo_core_packed(urls, SMALL, tmp_path / "oc")
    ours = PackedSource(urls, SEQ, SMALL, tmp_path / "ox")
    assert ours.fingerprint == ds.fingerprint and len(ours) == len(ds)
    for i in range(len(ds)):
        np.testing.assert_array_equal(ours[i], ds[i]["input_ids"].numpy())
