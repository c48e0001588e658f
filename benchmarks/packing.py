"""Packing rate: olmax's OBFD index build vs ai2-olmo-core 3.0.0's `NumpyPackedFSLDataset.prepare()`, same shards.

    .venv/bin/python benchmarks/packing.py [--files 8 --tokens-per-file 8000000 --seq-len 65536
                                            --group-size 8 --mean-doc 3000 --json out.json]

Writes uint32 shards of EOS-terminated documents whose lengths are log-normal with median `--mean-doc`
(a long tail past the sequence length, many equal short lengths), then packs them with each
implementation in its own fresh process and work directory (so the peak RSS is its own). Both use
every core they want (OLMo-core: a process per group; olmax: a spawned process per group). Reported:
wall seconds, documents and tokens per second, peak RSS, instances, padding share, and whether the
two give the same instances (a checksum over the tokens of a sample of instance ids).

The projection multiplies the measured per-document and per-token times out to a mix of
`--project-tokens` tokens (default 5e10, the 50B tokens of AI2's 7B stage 3) with the same document
lengths: scanning is linear in tokens and packing n log n in documents, so this is an upper bound
per core. Prints a table; asserts nothing. The CPUs here are shared with other jobs.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

EOS, PAD, VOCAB = 100257, 100277, 100278


def write_shards(out: Path, files: int, tokens_per_file: int, mean_doc: int, seed: int = 0) -> tuple[list[str], int]:
    rng = np.random.default_rng(seed)
    paths, docs = [], 0
    for i in range(files):
        lengths = np.maximum(1, rng.lognormal(np.log(mean_doc), 1.2, size=tokens_per_file // mean_doc * 2))
        lengths = np.round(lengths).astype(np.int64)
        lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), tokens_per_file))]
        ids = rng.integers(0, 100000, size=int(lengths.sum()), dtype=np.uint32)
        ids[np.cumsum(lengths) - 1] = EOS
        path = out / f"part-{i:03d}.npy"
        ids.tofile(path)
        paths.append(str(path))
        docs += len(lengths)
    return paths, docs


def run_olmax(paths, seq_len, group, work):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from olmax.data.packing import PackedSource
    from olmax.data.tokenizer import TokenizerFields

    tok = TokenizerFields(vocab_size=VOCAB, eos_token_id=EOS, pad_token_id=PAD)
    t0 = time.perf_counter()
    src = PackedSource(paths, seq_len, tok, work, group_size=group)
    wall = time.perf_counter() - t0
    return wall, len(src), lambda i: src[i]


def run_olmo_core(paths, seq_len, group, work):
    from olmo_core.data import NumpyPackedFSLDatasetConfig, TokenizerConfig

    tok = TokenizerConfig(vocab_size=VOCAB, eos_token_id=EOS, pad_token_id=PAD)
    ds = NumpyPackedFSLDatasetConfig(
        tokenizer=tok, paths=paths, sequence_length=seq_len, source_group_size=group, work_dir=work
    ).build()
    t0 = time.perf_counter()
    ds.prepare()
    wall = time.perf_counter() - t0
    return wall, len(ds), lambda i: ds[i]["input_ids"].numpy()


def child(which: str, paths: list[str], seq_len: int, group: int, work: str) -> dict:
    wall, n, get = (run_olmax if which == "olmax" else run_olmo_core)(paths, seq_len, group, work)
    sample = np.random.default_rng(1).choice(n, size=min(n, 64), replace=False)
    tokens = np.concatenate([get(int(i)) for i in sample]).astype(np.int64)
    pad = sum(int((get(int(i)) == PAD).sum()) for i in range(min(n, 256)))
    return {
        "wall_s": wall,
        "instances": n,
        "pad_share_first_256": pad / (min(n, 256) * seq_len),
        "checksum": int((tokens * np.arange(1, len(tokens) + 1)).sum() % (1 << 61)),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--tokens-per-file", type=int, default=8_000_000)
    ap.add_argument("--seq-len", type=int, default=65536)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--mean-doc", type=int, default=3000)
    ap.add_argument("--project-tokens", type=float, default=5e10)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)  # which, paths json, work dir
    args = ap.parse_args()
    if args.child:
        which, paths, work = args.child
        print(json.dumps(child(which, json.loads(paths), args.seq_len, args.group_size, work)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        paths, docs = write_shards(Path(tmp), args.files, args.tokens_per_file, args.mean_doc)
        tokens = sum(Path(p).stat().st_size // 4 for p in paths)
        rows = {}
        for which in ("olmax", "olmo-core"):
            cmd = [sys.executable, __file__, "--seq-len", str(args.seq_len), "--group-size", str(args.group_size)]
            cmd += ["--child", which, json.dumps(paths), str(Path(tmp) / f"work-{which}")]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            rows[which] = json.loads(out.strip().splitlines()[-1])
    same = rows["olmax"]["checksum"] == rows["olmo-core"]["checksum"]
    print(
        f"{args.files} files, {tokens:,} tokens, {docs:,} documents (median {args.mean_doc}), "
        f"seq_len {args.seq_len}, group {args.group_size}; same instances: {same}"
    )
    print(f"{'':10} {'wall s':>8} {'docs/s':>12} {'tokens/s':>14} {'peak MiB':>9} {'instances':>9} {'pad %':>6}")
    for which, r in rows.items():
        print(
            f"{which:10} {r['wall_s']:8.2f} {docs / r['wall_s']:12,.0f} {tokens / r['wall_s']:14,.0f} "
            f"{r['peak_rss_mib']:9.0f} {r['instances']:9,} {100 * r['pad_share_first_256']:6.2f}"
        )
    scale = args.project_tokens / tokens
    for which, r in rows.items():
        print(
            f"projected for {args.project_tokens:.0e} tokens ({docs * scale:,.0f} documents): {which} "
            f"{r['wall_s'] * scale / 3600:.2f} h at this parallelism"
        )
    if args.json:
        args.json.write_text(json.dumps({"tokens": tokens, "documents": docs, "rows": rows, "same": same}, indent=1))


if __name__ == "__main__":
    main()
