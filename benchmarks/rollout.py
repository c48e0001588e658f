"""Rollout throughput: olmax's sampler (olmax.rollout.sampler.sample, one jitted loop) and the
`olmax generate` command against transformers' `generate` on the same random model, exported with
`olmax convert --to-hf`.

    .venv/bin/python benchmarks/rollout.py [--models demo,small --seqs 64 --prompt 32 --new 64 --json out.json]
        [--command-new 128] [--draw-vocab 100278]

Both sample at temperature 1 (top-k and top-p off) from the same 64 sequences' prompts with EOS off,
so every sequence generates exactly --new tokens; tokens/s counts those new tokens. olmax runs as GRPO
does (`n` samples per prompt: --group prompts' prefills, each repeated), transformers with
`num_return_sequences` = the group size (its prefill is of the repeated prompts). Each figure is the
median of --runs calls after one warm-up call (olmax: the compile; transformers: first-call set-up).
Models, fp32 on the CPU: `demo`, the `tiny` recipe's model (4 layers, d_model 128, window 64 on
layers 0-2, the full 100k dolma2 vocabulary), and `small`, the same with a 4k vocabulary (the output
layer no longer dominates). Prints a table; asserts nothing.

The command's row: `olmax generate --prompts FILE --max-new-tokens --command-new` (greedy, its
defaults) on the demo model's checkpoint, --seqs text prompts of 8 words (8 tokens each, so
transformers needs no padding), against transformers' greedy `generate` of the same prompts' ids
(min_new_tokens = max_new_tokens, EOS off; the command stops a row at EOS, which a random model
almost never draws: the command's tokens/s counts the tokens it made).
Run as a user runs it, in a subprocess: its tokens/s after compiling (the report's
`tokens_per_second`, the generation's seconds less its tracing and compiling), its compile seconds and
the whole command's wall time (start-up, loading, compiling, generation, printing); the command runs
--runs times alternating with transformers' (after one warm-up call), medians.

Where a greedy step's time goes, in ms per step (64 rows), measured alternating with the command and
transformers' in the same run: the decoding loop without its output layer (the same checkpoint's
layers with a 128-token vocabulary, through olmax.rollout.sampler.generate), and the output layer
alone ((64, 128) x (128, vocab) and the greedy choice, the sampler's, in a jitted loop of as many
steps): the floor of any exact fp32 greedy step of this model, so transformers' ms / that floor
bounds the ratio any implementation can reach here.

The draw's row (--draw-vocab: the vocabulary, 0 for none; no transformers, so it runs where torch is
absent, as on a TPU VM): ms per call of the sampled token's draw alone over --seqs rows of random logits,
jitted, median of 20 calls alternating: olmax's tree draw (olmax.rollout.draw), the float32 inverse
CDF it replaced (one uniform against a cumulative sum: the reference, kept here) and
jax.random.categorical (a Gumbel per vocabulary entry).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from olmax.checkpoint.store import load_params, save_params
from olmax.config.recipes import TINY
from olmax.convert.hf import convert_to_hf
from olmax.model.olmo3 import init_params
from olmax.rollout.sampler import Sampling, _argmax, generate, sample

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


def bench_command(seqs: int, new: int, runs: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from olmax.data.tokenizer import load_tokenizer

    cfg = replace(TINY, max_position=max(256, 16 + new))
    words = "the cat sat on a mat and then went to sleep while it was raining outside in the old town".split()
    rng = np.random.default_rng(0)
    texts = [" ".join(["the", *rng.choice(words, 7)]) for _ in range(seqs)]  # each word one token
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        save_params(tmp / "ckpt", jax.jit(init_params, static_argnums=0)(cfg, jax.random.key(0)), cfg, {})
        convert_to_hf(tmp / "ckpt", tmp / "hf", tokenizer="none")
        model = AutoModelForCausalLM.from_pretrained(tmp / "hf", local_files_only=True, dtype=torch.float32).eval()
        (tmp / "prompts.txt").write_text("\n".join(texts) + "\n")
        olmax = Path(sys.executable).with_name("olmax")
        argv = [str(olmax), "generate", "--ckpt", str(tmp / "ckpt"), "--prompts", str(tmp / "prompts.txt")]
        argv += ["--max-new-tokens", str(new), "--json", str(tmp / "out.json")]

        def ours() -> dict:
            start = time.perf_counter()
            subprocess.run(argv, check=True, capture_output=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
            return {**json.loads((tmp / "out.json").read_text()), "wall": time.perf_counter() - start}

        ids = torch.tensor([load_tokenizer("dolma2").encode(t) for t in texts])  # equal lengths: no padding
        params, cfg, _ = load_params(tmp / "ckpt")
        small = replace(cfg, vocab_size=128)
        layers_only = {**params, "lm_head": params["lm_head"][:, :128]}
        prompts = ids.tolist()
        head = params["lm_head"][:, : cfg.vocab_size]

        @jax.jit
        def output_layer(hidden):
            def step(carry):
                t, hidden, seen = carry
                token = _argmax(hidden @ head)
                return t + 1, hidden + 1e-3 * token[:, None], seen + token  # each step depends on the last

            return jax.lax.while_loop(lambda c: c[0] < new, step, (0, hidden, jnp.zeros(seqs, jnp.int32)))[2]

        hidden = jnp.asarray(rng.standard_normal((seqs, cfg.d_model)), jnp.float32)
        parts = {
            "layers": lambda: generate(layers_only, small, prompts, new),
            "output layer": lambda: output_layer(hidden).block_until_ready(),
        }

        def theirs() -> float:
            start = time.perf_counter()
            with torch.no_grad():
                out = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    do_sample=False,
                    max_new_tokens=new,
                    min_new_tokens=new,
                    eos_token_id=None,
                    pad_token_id=0,
                )
            assert out.shape == (seqs, ids.shape[1] + new)
            return seqs * new / (time.perf_counter() - start)

        ours(), theirs(), *(f() for f in parts.values())  # warm-up: the command's is whole (it compiles every run)
        reports, rates, ms = [], [], {k: [] for k in parts}
        for _ in range(runs):
            reports.append(ours())
            rates.append(theirs())
            for k, f in parts.items():
                start = time.perf_counter()
                f()
                ms[k].append((time.perf_counter() - start) * 1000 / new)
    median = lambda key: statistics.median(r[key] for r in reports)
    return {
        "seqs": seqs,
        "new": new,
        "command_tok_s": round(median("tokens_per_second")),
        "command_compile_s": round(median("compile_seconds"), 1),
        "command_wall_s": round(median("wall"), 1),
        "command_tok_s_whole": round(median("new_tokens") / median("wall")),
        "transformers_tok_s": round(statistics.median(rates)),
        "ratio": round(median("tokens_per_second") / statistics.median(rates), 1),
        "ms_per_step": {
            "transformers": round(1000 * seqs / statistics.median(rates), 1),
            "olmax generate": round(1000 * seqs / median("tokens_per_second"), 1),
            **{k: round(statistics.median(v), 1) for k, v in ms.items()},
        },
    }


def _inverse_cdf(logits, keys):
    """The draw olmax used before olmax.rollout.draw: one float32 uniform per row against the float32
    cumulative softmax (2e-3 total variation over dolma2's vocabulary); the speed reference."""
    u = 1.0 - jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(keys)
    mass = jnp.cumsum(jax.nn.softmax(logits, axis=-1), axis=-1)
    return jnp.argmax(mass >= u[:, None] * mass[:, -1:], axis=-1).astype(jnp.int32)


def bench_draw(seqs: int, vocab: int, calls: int = 20) -> dict:
    """ms per call of each draw over (seqs, vocab) logits (module doc), alternating, medians."""
    from olmax.rollout.draw import draw

    logits = jax.random.normal(jax.random.key(0), (seqs, vocab)) * 3.0
    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(1), i))(jnp.arange(seqs))
    draws = {
        "tree": jax.jit(draw),
        "inverse CDF": jax.jit(_inverse_cdf),
        "categorical": jax.jit(lambda x, k: jax.vmap(jax.random.categorical)(k, x)),
    }
    times: dict = {name: [] for name in draws}
    for f in draws.values():
        f(logits, keys).block_until_ready()  # compiled
    for _ in range(calls):
        for name, f in draws.items():
            t0 = time.perf_counter()
            f(logits, keys).block_until_ready()
            times[name].append(1000 * (time.perf_counter() - t0))
    return {"seqs": seqs, "vocab": vocab, **{name: round(statistics.median(t), 2) for name, t in times.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="demo,small")
    ap.add_argument("--seqs", type=int, default=64)
    ap.add_argument("--group", type=int, default=8, help="samples per prompt (GRPO: 8)")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--command-new", type=int, default=128, help="new tokens of the command's row (0: no row)")
    ap.add_argument("--draw-vocab", type=int, default=100278, help="the draw's row: its vocabulary (0: no row)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    drawn = bench_draw(args.seqs, args.draw_vocab) if args.draw_vocab else None
    if drawn is not None:
        print(f"# {platform.machine()} {jax.devices()[0].platform}")
        print("| draw, ms per call | rows | vocab | tree (olmax) | inverse CDF (before) | categorical (Gumbel) |")
        print("|---|---|---|---|---|---|")
        print(
            f"| temperature 1 | {drawn['seqs']} | {drawn['vocab']} | {drawn['tree']} | {drawn['inverse CDF']} "
            f"| {drawn['categorical']} |"
        )
    models = [m for m in args.models.split(",") if m]
    if not models and not args.command_new:
        return
    import torch

    rows = [bench(m, args.seqs, args.group, args.prompt, args.new, args.runs) for m in models]
    command = bench_command(args.seqs, args.command_new, args.runs) if args.command_new else None
    print(f"# {platform.machine()} {jax.devices()[0].platform}, torch threads {torch.get_num_threads()}, fp32")
    if rows:
        print("| model | vocab | seqs (prompts x n) | prompt | new | olmax tok/s | transformers tok/s | ratio |")
        print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['vocab']} | {r['seqs']} ({r['seqs'] // r['group']} x {r['group']}) | {r['prompt']} "
            f"| {r['new']} | {r['olmax_tok_s']} | {r['transformers_tok_s']} | {r['ratio']}x |"
        )
    if command is not None:
        c = command
        print(
            "| `olmax generate` (demo, greedy) | seqs | new | tok/s after compiling | compile s | command wall s "
            "| tok/s whole command | transformers tok/s | ratio |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        print(
            f"| 8-word prompts | {c['seqs']} | {c['new']} | {c['command_tok_s']} | {c['command_compile_s']} "
            f"| {c['command_wall_s']} | {c['command_tok_s_whole']} | {c['transformers_tok_s']} | {c['ratio']}x |"
        )
        step = c["ms_per_step"]
        print("| ms/step, 64 rows | transformers | olmax generate | its layers alone | output layer alone | bound |")
        print("|---|---|---|---|---|---|")
        bound = step["transformers"] / step["output layer"]
        print(
            f"| greedy | {step['transformers']} | {step['olmax generate']} | {step['layers']} "
            f"| {step['output layer']} | {bound:.1f}x |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"sample": rows, "command": command, "draw": drawn}, indent=1))


if __name__ == "__main__":
    main()
