"""How much ai2-olmo-core 3.0.0's loss normalisation differs from olmax's on stage-3-shaped packed batches.

    .venv/bin/python benchmarks/loss_normalisation.py [--lengths demo|lognormal --median 3000 --sigma 1.2
                                                       --files 16 --tokens-per-file 20000000 --json out.json]

3.0.0 (`TransformerTrainModule.train_batch`, olmo_core/train/train_module/transformer/train_module.py)
divides each data-parallel rank's summed loss by that rank's own count of labels (`loss_div_factor =
batch_num_tokens_for_loss`; under context parallelism the CP group shares one count, `LMHead` divides
it by the CP degree and the gradient mean over dp x cp ranks undoes that), then averages the ranks:
L3 = mean_r S_r / N_r. olmax divides the global sum by the global count: Lo = sum S_r / sum N_r. Each
token of rank r thus weighs w_r = N / (R N_r) times as much in 3.0.0 as in olmax; the weights average
to 1 over the batch's tokens, so the total gradient scale is the same and the two differ only in how it
is spread over the ranks. For any per-rank mean losses m_r: L3 - Lo = sum_r (1/R - N_r/N) m_r, so
|L3 - Lo| <= D/2 * (max m_r - min m_r) with D = sum_r |1/R - N_r/N| (the same bound holds for the
gradient with the ranks' per-token mean gradients in place of m_r).

The batches are AI2's stage-3 batches in shape: documents packed by olmax's OBFD (the 3.0.0 packer)
into 65,536-token instances, `--group-size` files at a time, the loader's order (PCG64(seed + 1)
shuffle of all instances, whole batches, rank r taking columns r::R), and the two stage-3 layouts:
7B (64 instances per step on 32 data-parallel ranks: 256 GPUs / CP 8, two instances each, no instance
filter) and 32B (128 instances on 128 ranks, one each, with the n-gram instance filter, which also
rejects an instance whose padding is a run of >= 32 pad tokens: 3.0.0 runs it on the padded
input_ids; a rejected instance has no labels and counts as seq_len, as in olmax).

Document lengths: `demo` draws the shipped demo corpus's documents (real text, 136 tokens median,
3203 longest) with replacement until each file holds `--tokens-per-file` tokens; `lognormal` draws
lengths as benchmarks/packing.py does (a long tail past 65,536, truncated as 3.0.0's `truncate`). The
per-token loss: with `demo`, the loss of a unigram model fitted on the demo corpus (-log p(target),
add-one smoothed): a real, if crude, model whose per-instance mean loss varies with the documents in
the instance, which gives a concrete L3 - Lo; with `lognormal` only the count statistics and D.
Real shards are larger than these files (more bins per group, so fewer partly filled instances per
step): the figures are an upper bound for the share of steps that differ. Prints a table; asserts
nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

EOS, PAD, VOCAB = 100257, 100277, 100278
LAYOUTS = {  # name: (instances per step, data-parallel ranks, instance filter)
    "7B stage 3": (64, 32, False),
    "32B stage 3": (128, 128, True),
}
FILTER_RUN = 32  # 3.0.0's repetition_max_count: this many pad tokens in a row reject the instance


def demo_documents() -> list[np.ndarray]:
    import tempfile

    from olmax.data.demo import demo_shards

    with tempfile.TemporaryDirectory() as tmp:
        ids = np.concatenate([np.fromfile(p, dtype=np.uint32) for p in demo_shards("demo:train", Path(tmp))])
    ends = np.flatnonzero(ids == EOS) + 1
    return [d for d in np.split(ids, ends) if len(d)]


def draw_files(args, rng, docs):
    """Per file: (document lengths, per-document loss sums or None, per-document first-token loss)."""
    files = []
    if args.lengths == "demo":
        counts = np.bincount(np.concatenate(docs), minlength=VOCAB).astype(np.float64)
        nll = -np.log((counts + 1) / (counts.sum() + VOCAB))
        doc_len = np.array([len(d) for d in docs])
        doc_loss = np.array([nll[d].sum() for d in docs])
        first = np.array([nll[d[0]] for d in docs])
    for _ in range(args.files):
        if args.lengths == "demo":
            n = int(args.tokens_per_file / doc_len.mean() * 1.2)
            pick = rng.integers(0, len(docs), n)
            pick = pick[: int(np.searchsorted(np.cumsum(doc_len[pick]), args.tokens_per_file))]
            files.append((doc_len[pick], doc_loss[pick], first[pick]))
        else:
            n = args.tokens_per_file // args.median * 2
            lengths = np.maximum(1, np.round(rng.lognormal(np.log(args.median), args.sigma, n))).astype(np.int64)
            lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), args.tokens_per_file))]
            files.append((lengths, None, None))
    return files


def pack(files, seq_len: int, group: int):
    """Every instance in global order (group by group, bins in creation order): (padding, loss sum)."""
    from olmax.data.packing import obfd

    pads, losses = [], []
    for g in range(0, len(files), group):
        part = files[g : g + group]
        lengths = np.concatenate([f[0] for f in part])
        # truncate: a longer document keeps its first seq_len tokens (its loss scaled to them)
        kept = np.minimum(lengths, seq_len)
        order, bin_of = obfd(kept, seq_len)
        n_bins = int(bin_of.max()) + 1
        fill = np.bincount(bin_of, weights=kept[order], minlength=n_bins)
        pads.append(seq_len - fill.astype(np.int64))
        if part[0][1] is None:
            losses.append(np.full(n_bins, np.nan))
            continue
        loss = np.concatenate([f[1] for f in part]) * kept / lengths
        first = np.concatenate([f[2] for f in part])
        # the instance's first token is no target; within a bin documents enter in sorted order
        by_bin = np.argsort(bin_of, kind="stable")
        starts = np.searchsorted(bin_of[by_bin], np.arange(n_bins))
        s = np.bincount(bin_of, weights=loss[order], minlength=n_bins) - first[order[by_bin[starts]]]
        losses.append(s)
    return np.concatenate(pads), np.concatenate(losses)


def compare(pads, losses, seq_len: int, batch: int, ranks: int, filtered: bool, seed: int) -> dict:
    n = len(pads)
    perm = np.random.Generator(np.random.PCG64(seed + 1)).permutation(np.arange(n, dtype=np.uint32))
    steps = n // batch
    rows = perm[: steps * batch].reshape(steps, batch).astype(np.int64)
    count = (seq_len - 1 - pads).astype(np.float64)  # labels: the last position and padding targets ignored
    loss = losses.copy()
    if filtered:
        masked = pads >= FILTER_RUN
        count[masked], loss[masked] = seq_len, 0.0  # no labels, counted as seq_len (3.0.0 and olmax)
    # rank r takes columns r::ranks of each row
    per = rows.reshape(steps, batch // ranks, ranks)
    n_r = count[per].sum(axis=1)  # (steps, ranks)
    s_r = loss[per].sum(axis=1)
    total = n_r.sum(axis=1, keepdims=True)
    w = total / (ranks * n_r)
    d = np.abs(1.0 / ranks - n_r / total).sum(axis=1)
    out = {
        "instances": n,
        "steps": steps,
        "padded instances (%)": 100.0 * np.mean(pads > 0),
        "padding (% of tokens)": 100.0 * pads.sum() / (n * seq_len),
        "steps with unequal rank counts (%)": 100.0 * np.mean((n_r != n_r[:, :1]).any(axis=1)),
        "max |w_r - 1|": float(np.abs(w - 1).max()),
        "max w_r": float(w.max()),
        "D: mean / max": (float(d.mean()), float(d.max())),
    }
    if filtered:
        out["instances rejected by the filter (%)"] = 100.0 * float(np.mean(pads >= FILTER_RUN))
    if not np.isnan(loss).any():
        l3 = (s_r / n_r).mean(axis=1)
        lo = s_r.sum(axis=1) / total[:, 0]
        delta = l3 - lo
        out["loss olmax: mean"] = float(lo.mean())
        out["|L3 - Lo|: mean / max (nats)"] = (float(np.abs(delta).mean()), float(np.abs(delta).max()))
        out["max |L3 - Lo| / Lo"] = float((np.abs(delta) / lo).max())
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lengths", choices=("demo", "lognormal"), default="demo")
    p.add_argument("--median", type=int, default=3000, help="lognormal: median document length")
    p.add_argument("--sigma", type=float, default=1.2, help="lognormal: sigma of log length")
    p.add_argument("--files", type=int, default=16)
    p.add_argument("--tokens-per-file", type=int, default=20_000_000)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=65536)
    p.add_argument("--seed", type=int, default=34521, help="the loader seed (AI2's stage 3: 34521)")
    p.add_argument("--json")
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    files = draw_files(args, rng, demo_documents() if args.lengths == "demo" else None)
    pads, losses = pack(files, args.seq_len, args.group_size)
    report = {"args": vars(args)}
    for name, (batch, ranks, filtered) in LAYOUTS.items():
        report[name] = compare(pads, losses, args.seq_len, batch, ranks, filtered, args.seed)
    for name in LAYOUTS:
        print(f"{name} ({args.lengths} lengths, {args.files} files x {args.tokens_per_file:,} tokens):")
        for key, value in report[name].items():
            print(f"  {key:40s} {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
