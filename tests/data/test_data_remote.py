"""Remote token shards over real HTTP (fsspec + aiohttp) from a server on 127.0.0.1 in the test
(tests/fake_remote.py), which counts the body bytes it sends: reading instances transfers byte
ranges, never whole files."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("aiohttp")  # fsspec's HTTP backend (the `remote` and `dev` extras)

from fake_remote import serving  # noqa: E402

from olmax.config.data import DataConfig  # noqa: E402
from olmax.data.loader import build_source, make_loader  # noqa: E402
from olmax.data.sources import SAMPLE_TOKENS, DataSourceError, TokenSource  # noqa: E402
from olmax.data.tokenizer import TokenizerFields  # noqa: E402

VOCAB = 5000  # uint16 files
TOK = TokenizerFields(vocab_size=VOCAB, eos_token_id=VOCAB - 1, pad_token_id=0)
SEQ = 64
TOKDIR = "allenai/dolma3-tokenizer"
LENGTHS = [1000, 37, 4096 + 5, 2500, 64 * 9 + 63]  # uneven: remainders dropped, batches straddle files


@pytest.fixture
def server(tmp_path):
    with serving(tmp_path / "served") as srv:
        yield srv


def write_mix(root: Path, lengths, seed=0) -> Path:
    """Token files under root in OLMo-core's layout and a mix file listing them (relative paths)."""
    rng = np.random.default_rng(seed)
    lines = []
    for i, n in enumerate(lengths):
        rel = f"preprocessed/src{i % 2}/{{TOKENIZER}}/part-{i:03d}.npy"
        path = root / rel.replace("{TOKENIZER}", TOKDIR)
        path.parent.mkdir(parents=True, exist_ok=True)
        rng.integers(0, VOCAB, size=n).astype(np.uint16).tofile(path)
        lines.append(f"src{i % 2},{rel}")
    mix = root / "mix.txt"
    mix.write_text("# test mix\n" + "\n".join(lines) + "\n")
    return mix


def data_cfg(tmp_path, paths, mix_base, **kw) -> DataConfig:
    return DataConfig(
        paths=tuple(paths),
        mix_base=mix_base,
        seq_len=SEQ,
        seed=7,
        vocab_size=VOCAB,
        eos_token_id=VOCAB - 1,
        pad_token_id=0,
        work_dir=str(tmp_path / "cache"),
        **kw,
    )


def test_http_mix_file_matches_local(tmp_path, server):
    """An OLMo-core mix file read over HTTP (mix file and shards) gives the local instances and order."""
    mix = write_mix(server.root, LENGTHS)
    local_cfg = data_cfg(tmp_path, [str(mix)], str(server.root))
    remote_cfg = data_cfg(tmp_path, [f"{server.base}/mix.txt"], f"{server.base}/")
    local, remote = build_source(local_cfg), build_source(remote_cfg)

    assert remote.paths[0] == f"{server.base}/preprocessed/src0/{TOKDIR}/part-000.npy"
    assert remote.sizes == local.sizes == [2 * n for n in LENGTHS]
    assert remote.fingerprint == local.fingerprint
    assert len(remote) == len(local) == sum(n // SEQ for n in LENGTHS)
    for i in range(len(local)):
        np.testing.assert_array_equal(remote[i], local[i])

    # The loader's batches (two data-parallel ranks, past the first epoch) are equal too.
    for rank in range(2):
        ref = itertools.islice(make_loader(local_cfg, 8, dp_rank=rank, dp_size=2, source=local), 16)
        got = itertools.islice(make_loader(remote_cfg, 8, dp_rank=rank, dp_size=2, source=remote), 16)
        for a, b in zip(ref, got, strict=True):
            np.testing.assert_array_equal(b["index"], a["index"])
            np.testing.assert_array_equal(b["input_ids"], a["input_ids"])
    assert all(rng is not None for method, name, rng in server.requests if method == "GET" and name.endswith(".npy"))


def test_http_reads_are_byte_ranges(tmp_path, server):
    """Opening a 4 MB remote shard and reading 3 instances transfers the check sample and 3 instances."""
    n_tokens = 2_000_000
    np.random.default_rng(1).integers(0, VOCAB, size=n_tokens).astype(np.uint16).tofile(server.root / "big.npy")
    url = f"{server.base}/big.npy"

    source = TokenSource([url], SEQ, TOK)
    opened = server.bytes_sent
    assert opened == SAMPLE_TOKENS * 2  # the vocabulary check reads the first 4096 tokens only
    local = np.memmap(server.root / "big.npy", dtype=np.uint16, mode="r")
    for i in (0, 12_345, len(source) - 1):
        np.testing.assert_array_equal(source[i], local[i * SEQ : (i + 1) * SEQ])
    assert server.bytes_sent - opened == 3 * SEQ * 2
    assert server.bytes_sent < n_tokens * 2 / 400
    gets = [r for r in server.requests if r[0] == "GET"]
    assert gets[-1] == ("GET", "big.npy", f"bytes={(len(source) - 1) * SEQ * 2}-{len(source) * SEQ * 2 - 1}")


def test_http_errors_name_the_url(tmp_path, server):
    mix = write_mix(server.root, [300, 400])
    base = f"{server.base}/"

    # A mix file listing a shard the server does not have.
    with mix.open("a") as f:
        f.write("src9,preprocessed/gone/{TOKENIZER}/part-999.npy\n")
    missing = f"{server.base}/preprocessed/gone/{TOKDIR}/part-999.npy"
    with pytest.raises(DataSourceError, match=re.escape(f"data file {missing} does not exist")):
        build_source(data_cfg(tmp_path, [f"{server.base}/mix.txt"], base))

    # A missing mix file.
    with pytest.raises(DataSourceError, match=re.escape(f"mix file {server.base}/nomix.txt does not exist")):
        build_source(data_cfg(tmp_path, [f"{server.base}/nomix.txt"], base))

    # A server error while opening, and while reading an opened source.
    shard = f"preprocessed/src1/{TOKDIR}/part-001.npy"
    server.fail.add(shard)
    with pytest.raises(DataSourceError, match=re.escape(f"data file {server.base}/{shard} cannot be read") + ".*500"):
        TokenSource([f"{server.base}/{shard}"], SEQ, TOK)
    server.fail.clear()
    source = TokenSource([f"{server.base}/{shard}"], SEQ, TOK)
    server.fail.add(shard)
    with pytest.raises(
        DataSourceError, match=re.escape(f"data file {server.base}/{shard} (bytes 128..256) cannot be read") + ".*500"
    ):
        source[1]

    # A server that ignores Range would hand back the whole file as if it were the instance.
    server.fail.clear()
    server.ignore_range = True
    with pytest.raises(
        DataSourceError, match=re.escape(f"data file {server.base}/{shard}: asked for 128 bytes at 128, got 800")
    ):
        source[1]
