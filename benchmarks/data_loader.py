"""Data loader throughput, memory and headroom: olmax (Grain) vs ai2-olmo-core's NumpyDataLoader, same shards.

    .venv/bin/python benchmarks/data_loader.py [--tokens 100000000 --files 8 --seq-len 8192
                                                --global-batch 16 --batches 400 --workers 0 --json out.json]

Writes random dolma2-sized (uint32) shards to a temp dir twice: `--tokens` tokens and a tenth of that
(`--growth`). Each loader then runs in its own fresh process (so peak RSS is its own) on each
dataset, over the same batches of one data-parallel rank of 1, in OLMo-core's order (seed 34521, so
both loaders deliver the same instances; the "same data" column checks it). Reported:

- throughput on the large dataset, after the first batch (start-up, i.e. the order file and worker
  processes, is timed apart): instances/s of wall time, and instances per CPU-second of the process
  (user + system time of all its threads), i.e. per core. Shards are in the page cache (just written).
- memory as the dataset grows: peak RSS (ru_maxrss) and the peak of anonymous RSS (RssAnon, sampled
  every batch: the heap, without the memory-mapped shard pages) after the SAME number of batches on
  both sizes, so the shard pages touched are the same too. What may grow with the dataset is the
  order: a uint32 per instance, memory-mapped (4 bytes x instances), and the epoch's audit bitmap.
- headroom: the wall rate over what one host of the 7B run consumes. OLMo 3 7B on 128 devices takes
  512 x 8192 tokens every ~3 s; a host (4 of the 128 devices, 1/32 of the hosts) takes 16 instances
  of 8192 tokens per 3 s = 5.3 instances/s. "per core" divides by the CPU the loader used instead.

With `--workers N` the batches are read in N worker processes; their CPU time and memory are not
the main process's, so the per-core columns are left out and the memory is the main process's only.

Prints a table; asserts nothing. The CPUs here are shared with other jobs: read rates as lower bounds.
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
SEED = 34521
# OLMo 3 7B stage 1 (docs/reference.md, "Recipe and schedules"): 512 instances of 8192 tokens per
# step, ~3 s per step on 128 devices; 32 hosts of 4 devices each take 1/32 of every batch.
SEQ_7B, GLOBAL_BATCH_7B, STEP_S_7B, HOSTS_7B = 8192, 512, 3.0, 32
HOST_RATE_7B = GLOBAL_BATCH_7B / HOSTS_7B / STEP_S_7B  # instances/s one host's loader must deliver


def proc_status_mib(field: str) -> float:
    """A memory field of /proc/self/status (VmRSS, RssAnon, RssFile) in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise KeyError(f"{field} not in /proc/self/status")


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_olmax(paths, args, work):
    from olmax.config.data import DataConfig
    from olmax.data.loader import make_loader

    cfg = DataConfig(paths=tuple(paths), seq_len=args.seq_len, seed=SEED, work_dir=str(work), num_workers=args.workers)
    loader = make_loader(cfg, args.global_batch)
    return iter(loader), lambda b: b["input_ids"]


def run_olmo_core(paths, args, work):
    from olmo_core.data import DataCollator, NumpyDataLoaderBase, NumpyFSLDatasetConfig, TokenizerConfig

    ds = NumpyFSLDatasetConfig(
        tokenizer=TokenizerConfig.dolma2(), paths=list(paths), sequence_length=args.seq_len, work_dir=str(work)
    ).build()
    ds.prepare()
    dl = NumpyDataLoaderBase.wrap_numpy_dataset(
        ds,
        global_batch_size=args.global_batch * args.seq_len,
        collator=DataCollator(pad_token_id=PAD),
        work_dir=str(work),
        seed=SEED,
        num_workers=args.workers,
    )
    dl.reshuffle(epoch=1)
    return iter(dl), lambda b: b["input_ids"].numpy()


def measure(which: str, args) -> dict:
    """One loader on one dataset: `args.batches` batches (the first is start-up, not timed); memory
    figures are also taken after `args.mem_batches`, the count every dataset size runs."""
    paths = sorted(str(p) for p in Path(args.data).glob("*.npy"))
    work = Path(args.data) / f"work-{which}"
    start_rss = proc_status_mib("VmRSS")
    t_start = time.perf_counter()
    it, ids_of = (run_olmax if which == "olmax" else run_olmo_core)(paths, args, work)
    first = ids_of(next(it))
    startup = time.perf_counter() - t_start
    checksum = int(first[:, :8].sum())
    peak_anon, at_mem = proc_status_mib("RssAnon"), None
    t0, cpu0 = time.perf_counter(), cpu_seconds()
    for done in range(2, args.batches + 1):
        checksum += int(ids_of(next(it))[:, :8].sum())
        peak_anon = max(peak_anon, proc_status_mib("RssAnon"))
        if done == args.mem_batches:
            at_mem = {
                "peak_rss_mib": peak_rss_mib(),
                "peak_anon_mib": peak_anon,
                "file_rss_mib": proc_status_mib("RssFile"),
            }
    elapsed, cpu = time.perf_counter() - t0, cpu_seconds() - cpu0
    instances = (args.batches - 1) * args.global_batch
    # worker processes' CPU time is not in RUSAGE_SELF (nor in RUSAGE_CHILDREN while they run)
    per_cpu = instances / cpu if args.workers == 0 else None
    return {
        "loader": which,
        "startup_s": startup,
        "instances_per_s": instances / elapsed,
        "instances_per_cpu_s": per_cpu,
        "cores_busy": cpu / elapsed if per_cpu else None,
        "start_rss_mib": start_rss,
        "peak_rss_mib": peak_rss_mib(),
        "peak_anon_mib": peak_anon,
        "at_mem_batches": at_mem,
        "checksum": checksum,
    }


def write_shards(directory: Path, files: int, tokens: int, rng) -> None:
    directory.mkdir()
    for i in range(files):
        rng.integers(0, VOCAB, size=tokens // files, dtype=np.uint32).tofile(directory / f"{i:06d}.npy")


def run_child(which: str, data: Path, batches: int, mem_batches: int, argv: list[str]) -> dict:
    cmd = [
        sys.executable,
        __file__,
        *argv,
        "--which",
        which,
        "--data",
        str(data),
        "--batches",
        str(batches),
        "--mem-batches",
        str(mem_batches),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        lines = proc.stderr.strip().splitlines()
        return {"loader": which, "error": lines[-1] if lines else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def parent_argv(args) -> list[str]:
    """The options a child needs, as given to the parent (without --json and the child's own)."""
    return ["--seq-len", str(args.seq_len), "--global-batch", str(args.global_batch), "--workers", str(args.workers)]


def print_tables(sizes: dict, rows: dict, args, mem_batches: int) -> None:
    big, small = max(sizes), min(sizes)
    print(
        f"seq_len {args.seq_len}, {args.global_batch} instances per batch (one 7B host's share of a step), "
        f"workers {args.workers}, {args.files} uint32 files per dataset"
    )
    print(f"\nthroughput, {big:,} tokens ({sizes[big]:,} instances), {rows[big]['batches']} batches after the first:")
    print(
        f"{'loader':10s} {'start-up s':>10s} {'inst/s':>8s} {'inst/CPU-s':>10s} {'cores busy':>10s} "
        f"{'headroom':>9s} {'per core':>9s}  same data"
    )
    ref = None
    for r in rows[big]["results"]:
        if "error" in r:
            print(f"{r['loader']:10s} failed: {r['error']}")
            continue
        ref = r["checksum"] if ref is None else ref
        per_cpu = r["instances_per_cpu_s"]
        cpu_cols = f"{per_cpu:10.0f} {r['cores_busy']:10.2f}" if per_cpu else f"{'-':>10s} {'-':>10s}"
        core_headroom = f"{per_cpu / HOST_RATE_7B:8.0f}x" if per_cpu else f"{'-':>9s}"
        print(
            f"{r['loader']:10s} {r['startup_s']:10.2f} {r['instances_per_s']:8.0f} {cpu_cols} "
            f"{r['instances_per_s'] / HOST_RATE_7B:8.0f}x {core_headroom}  {r['checksum'] == ref}"
        )
    if args.workers:
        print(
            "with --workers the CPU columns are left out (the workers' CPU time is not counted) and the "
            "memory figures are the main process's only"
        )
    print(
        f"headroom: over one 7B host's {HOST_RATE_7B:.2f} instances/s ({GLOBAL_BATCH_7B} x {SEQ_7B} tokens per "
        f"{STEP_S_7B:.0f} s over {HOSTS_7B} hosts); goal >= 10x"
    )
    print(
        f"\nmemory as the dataset grows {big // small}x, after the same {mem_batches} batches "
        f"(MiB; order memmap = 4 bytes x instances):"
    )
    print(
        f"{'loader':10s} {'tokens':>12s} {'instances':>9s} {'order MiB':>9s} {'peak RSS':>9s} {'peak anon':>9s} "
        f"{'file RSS':>9s} {'run peak RSS':>12s}"
    )
    for size in sorted(sizes):
        for r in rows[size]["results"]:
            if "error" in r:
                continue
            m = r["at_mem_batches"]
            print(
                f"{r['loader']:10s} {size:12,d} {sizes[size]:9,d} {4 * sizes[size] / 2**20:9.2f} "
                f"{m['peak_rss_mib']:9.0f} {m['peak_anon_mib']:9.0f} {m['file_rss_mib']:9.0f} "
                f"{r['peak_rss_mib']:12.0f}"
            )
    for name in ("olmax", "olmo-core"):
        by_size = {
            s: next((r for r in rows[s]["results"] if r["loader"] == name and "error" not in r), None) for s in sizes
        }
        if all(by_size.values()):
            d_peak = by_size[big]["at_mem_batches"]["peak_rss_mib"] - by_size[small]["at_mem_batches"]["peak_rss_mib"]
            d_anon = by_size[big]["at_mem_batches"]["peak_anon_mib"] - by_size[small]["at_mem_batches"]["peak_anon_mib"]
            order = 4 * (sizes[big] - sizes[small]) / 2**20
            print(
                f"{name}: {big // small}x the data -> peak RSS {d_peak:+.1f} MiB, peak anon {d_anon:+.1f} MiB "
                f"(the order memmap grows {order:.2f} MiB)"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=100_000_000, help="tokens in the large dataset")
    p.add_argument("--growth", type=int, default=10, help="the small dataset has tokens / growth tokens")
    p.add_argument("--files", type=int, default=8, help="token files per dataset")
    p.add_argument("--seq-len", type=int, default=SEQ_7B)
    p.add_argument("--global-batch", type=int, default=GLOBAL_BATCH_7B // HOSTS_7B, help="instances per batch")
    p.add_argument("--batches", type=int, default=400, help="at most this many batches on the large dataset")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--loaders", nargs="+", choices=["olmax", "olmo-core"], default=["olmax", "olmo-core"])
    p.add_argument("--json", help="also write the results to this file")
    p.add_argument("--which", choices=["olmax", "olmo-core"], help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--mem-batches", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.which:  # child process: one loader on one dataset
        print(json.dumps(measure(args.which, args)))
        return
    if args.batches < 2 or args.growth < 2:
        p.error(f"--batches ({args.batches}) and --growth ({args.growth}) must be at least 2")
    small_tokens = args.tokens // args.growth
    # instances per dataset: each file's tokens cut into whole sequences
    sizes = {t: args.files * ((t // args.files) // args.seq_len) for t in (small_tokens, args.tokens)}
    if sizes[small_tokens] // args.global_batch < 2:
        p.error(
            f"--tokens {args.tokens} / --growth {args.growth} = {small_tokens} tokens make "
            f"{sizes[small_tokens]} instances of {args.seq_len}, fewer than two batches of {args.global_batch}; "
            "raise --tokens"
        )
    rows = {}
    with tempfile.TemporaryDirectory(prefix="olmax-loader-bench-") as tmp:
        rng = np.random.default_rng(0)
        for tokens in sizes:
            write_shards(Path(tmp) / f"t{tokens}", args.files, tokens, rng)
        # the same batch count on both sizes for the memory columns: all the small epoch allows
        mem_batches = min(args.batches, sizes[small_tokens] // args.global_batch)
        for tokens in sizes:
            batches = mem_batches if tokens == small_tokens else min(args.batches, sizes[tokens] // args.global_batch)
            rows[tokens] = {
                "batches": batches - 1,
                "results": [
                    run_child(which, Path(tmp) / f"t{tokens}", batches, mem_batches, parent_argv(args))
                    for which in args.loaders
                ],
            }
    print_tables(sizes, rows, args, mem_batches)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "args": vars(args),
                    "host_rate_7b_instances_per_s": HOST_RATE_7B,
                    "mem_batches": mem_batches,
                    "datasets": {str(t): {"instances": n, **rows[t]} for t, n in sizes.items()},
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
