"""Data loader throughput and memory: olmax (Grain) vs ai2-olmo-core's NumpyDataLoader, same shards.

    .venv/bin/python benchmarks/data_loader.py [--files 8 --tokens-per-file 4194304 --seq-len 2048
                                                --global-batch 32 --batches 200 --workers 0]

Writes random dolma2-sized (uint32) shards to a temp dir, then runs each loader in its own fresh
process (so peak RSS is its own) over the same batches of one data-parallel rank of 1, and prints
instances/s, peak RSS and RSS growth from the first to the last batch. Prints a table; asserts nothing.
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

VOCAB, EOS, PAD = 100278, 100257, 100277


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def run_olmax(paths, args, work):
    from olmax.config import DataConfig
    from olmax.data.loader import make_loader

    cfg = DataConfig(paths=tuple(paths), seq_len=args.seq_len, seed=34521, work_dir=str(work),
                     num_workers=args.workers)
    loader = make_loader(cfg, args.global_batch)
    return iter(loader), lambda b: b["input_ids"]


def run_olmo_core(paths, args, work):
    from olmo_core.data import DataCollator, NumpyDataLoaderBase, NumpyFSLDatasetConfig, TokenizerConfig

    ds = NumpyFSLDatasetConfig(tokenizer=TokenizerConfig.dolma2(), paths=list(paths), sequence_length=args.seq_len,
                               work_dir=str(work)).build()
    ds.prepare()
    dl = NumpyDataLoaderBase.wrap_numpy_dataset(ds, global_batch_size=args.global_batch * args.seq_len,
                                                collator=DataCollator(pad_token_id=PAD), work_dir=str(work),
                                                seed=34521, num_workers=args.workers)
    dl.reshuffle(epoch=1)
    return iter(dl), lambda b: b["input_ids"].numpy()


def measure(which: str, args) -> dict:
    paths = sorted(str(p) for p in Path(args.data).glob("*.npy"))
    work = Path(args.data) / f"work-{which}"
    start_rss = rss_mib()
    it, ids_of = (run_olmax if which == "olmax" else run_olmo_core)(paths, args, work)
    first = ids_of(next(it))  # startup (workers, order file) is not timed
    after_first = rss_mib()
    t0 = time.perf_counter()
    checksum = int(first[:, :8].sum())
    for _ in range(args.batches - 1):
        checksum += int(ids_of(next(it))[:, :8].sum())
    elapsed = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    peak_children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"loader": which, "instances_per_s": (args.batches - 1) * args.global_batch / elapsed,
            "peak_rss_mib": peak, "peak_worker_rss_mib": peak_children, "start_rss_mib": start_rss,
            "rss_growth_mib": rss_mib() - after_first, "checksum": checksum}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--tokens-per-file", type=int, default=1 << 22)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--which", choices=["olmax", "olmo-core"], help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.which:  # child process: one loader
        print(json.dumps(measure(args.which, args)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        rng = np.random.default_rng(0)
        for i in range(args.files):
            rng.integers(0, VOCAB, size=args.tokens_per_file, dtype=np.uint32).tofile(Path(tmp) / f"{i:06d}.npy")
        rows = []
        for which in ("olmax", "olmo-core"):
            cmd = [sys.executable, __file__, "--which", which, "--data", tmp] + sys.argv[1:]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
    print(f"seq_len {args.seq_len}, global batch {args.global_batch}, {args.batches} batches, "
          f"workers {args.workers}, {args.files} files x {args.tokens_per_file} tokens")
    print(f"{'loader':10} {'inst/s':>9} {'peak RSS MiB':>13} {'worker peak':>12} {'RSS growth':>11}  same data")
    for r in rows:
        print(f"{r['loader']:10} {r['instances_per_s']:9.0f} {r['peak_rss_mib']:13.0f} {r['peak_worker_rss_mib']:12.0f} "
              f"{r['rss_growth_mib']:11.1f}  {r['checksum'] == rows[0]['checksum']}")


if __name__ == "__main__":
    main()
