"""Rollout throughput: olmax's sampler (olmax.rollout.sampler.sample, one jitted loop) against
transformers' `generate` on the same random model, exported with `olmax convert --to-hf`.

    .venv/bin/python benchmarks/rollout.py [--models demo,small --seqs 64 --prompt 32 --new 64 --json out.json]

Both sample at temperature 1 (top-k and top-p off) from the same 64 sequences' prompts with EOS off,
so every sequence generates exactly --new tokens; tokens/s counts those new tokens. olmax runs as GRPO
does (`n` samples per prompt: --group prompts' prefills, each repeated), transformers with
`num_return_sequences` = the group size (its prefill is of the repeated prompts). Each figure is the
median of --runs calls after one warm-up call (olmax: the compile; transformers: first-call set-up).
Models, fp32 on the CPU: `demo`, the `tiny` recipe's model (4 layers, d_model 128, window 64 on
layers 0-2, the full 100k dolma2 vocabulary), and `small`, the same with a 4k vocabulary (the output
layer no longer dominates). Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import jax
import numpy as np

from olmax.checkpoint import load_params, save_params
from olmax.convert.hf import convert_to_hf
from olmax.model.olmo3 import init_params
from olmax.recipes import TINY
from olmax.rollout.sampler import Sampling, sample

MODELS = {"demo": TINY, "small": replace(TINY, vocab_size=4096)}


def bench(name: str, seqs: int, group: int, prompt_len: int, new: int, runs: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    cfg = replace(MODELS[name], max_position=max(256, prompt_len + new))
    with tempfile.TemporaryDirectory() as tmp:
        params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.key(0))
        save_params(Path(tmp) / "ckpt", params, cfg, {})
        convert_to_hf(Path(tmp) / "ckpt", Path(tmp) / "hf", tokenizer="none")
        params, cfg, _ = load_params(Path(tmp) / "ckpt")
        model = AutoModelForCausalLM.from_pretrained(Path(tmp) / "hf", local_files_only=True, dtype=torch.float32)
    model.eval()
    rng = np.random.default_rng(0)
    prompts = rng.integers(0, cfg.vocab_size, (seqs // group, prompt_len)).tolist()

    def ours():
        out = sample(params, cfg, prompts, new, n=group, sampling=Sampling(temperature=1.0, seed=1))
        out.tokens.block_until_ready()
        assert int(np.asarray(out.lengths).min()) == new

    ids = torch.tensor(prompts)

    def theirs():
        with torch.no_grad():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=new,
                min_new_tokens=new,
                num_return_sequences=group,
                eos_token_id=None,
                pad_token_id=0,
            )
        assert out.shape == (seqs, prompt_len + new)

    times = {}
    for label, fn in (("olmax", ours), ("transformers", theirs)):
        fn()  # warm-up: compile / first-call set-up
        samples = []
        for _ in range(runs):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
        times[label] = statistics.median(samples)
    rate = {k: seqs * new / v for k, v in times.items()}
    return {
        "model": name,
        "vocab": cfg.vocab_size,
        "seqs": seqs,
        "group": group,
        "prompt": prompt_len,
        "new": new,
        "olmax_tok_s": round(rate["olmax"]),
        "transformers_tok_s": round(rate["transformers"]),
        "ratio": round(rate["olmax"] / rate["transformers"], 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="demo,small")
    ap.add_argument("--seqs", type=int, default=64)
    ap.add_argument("--group", type=int, default=8, help="samples per prompt (GRPO: 8)")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch

    rows = [bench(m, args.seqs, args.group, args.prompt, args.new, args.runs) for m in args.models.split(",")]
    print(f"# {platform.machine()} {jax.devices()[0].platform}, torch threads {torch.get_num_threads()}, fp32")
    print("| model | vocab | seqs (prompts x n) | prompt | new | olmax tok/s | transformers tok/s | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['vocab']} | {r['seqs']} ({r['seqs'] // r['group']} x {r['group']}) | {r['prompt']} "
            f"| {r['new']} | {r['olmax_tok_s']} | {r['transformers_tok_s']} | {r['ratio']}x |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
