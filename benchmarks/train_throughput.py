"""Training throughput on this CPU: olmax vs ai2-olmo-core 3.0.0 (compiled and eager) vs MaxText,
the `bench-small` recipe, side by side in one run.

    .venv/bin/python benchmarks/train_throughput.py [--steps 10 --warmup 3 --only olmax --only matmul
                                                     --set trainer.loss_chunk=256 --json out.json]

bench-small (docs/performance/cpu.md): vocab 100352 (padded dolma2), d_model 512, 8 layers, 8 heads of 64,
MLP 1536, sequence 1024, window 512 on layers 0-2 and 4-6, full attention on 3 and 7, batch 4, fp32
parameters and compute, AdamW (lr 3e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1 except the
embedding), clipping at 1.0, z-loss 1e-5. olmax's own choices (the recipe's): two micro-batches of 2,
loss_chunk 128, remat full.

Every row runs in its own fresh subprocess, so its peak RSS (ru_maxrss of that process) is its own:
- `olmax`: the production step (olmax.step.train_step.make_train_step) on one CPU device; XLA's CPU
  client uses the cores available.
- `olmo-core-compiled` / `olmo-core-eager`: the same shape built with OLMo-core's own config classes
  (`TransformerConfig.llama_like` with the reordered-norm block, QK-norm, windows [512, 512, 512, full])
  and initialisation, `model.apply_compile()` as its train module does (or not), its AdamW
  (`olmo_core.optim.AdamWConfig`, the embedding in a no-decay group), the loss as its train module
  asks its LM head for it (summed CE + z-loss divided by the label count), `clip_grad_norm_(1.0)`;
  torch.set_num_threads(2).
- `maxtext`: MaxText 0.2.5's own trainer, which needs Python >= 3.12 and the `maxtext` package:
  `bash benchmarks/maxtext_venv.sh` makes ../maxtext-venv; found there, through $MAXTEXT_PYTHON or
  as a python3.12+ on PATH that imports maxtext, otherwise skipped with the reason.
- `matmul`: the plain XLA:CPU fp32 matmul rate (the reference for "% of matmul rate"), and torch's.
- `profile`: where olmax's step time goes (forward, backward, output layer + loss, optimizer), each
  piece over the whole batch.
Each timed row is the median of --steps steps after --warmup untimed ones (the first compiles).
Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RECIPE = "bench-small"
ROWS = ("matmul", "olmax", "olmo-core-compiled", "olmo-core-eager", "maxtext", "profile")
TORCH_THREADS = 2
# Where benchmarks/maxtext_venv.sh puts its venv by default (beside the checkout).
DEFAULT_MAXTEXT_VENV = Path(__file__).resolve().parents[2] / "maxtext-venv"
# MaxText 0.2.5's bench-small step on the 2-core CPU machine of docs/performance/cpu.md, printed for
# orientation when the maxtext row cannot run here; never mixed with this run's figures.
MAXTEXT_ORIENTATION = {"s_per_step": 18.0, "tokens_per_s": 227.0, "peak_rss_gib": 9.4}


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def batches(n: int, batch: int, seq: int, vocab: int):
    """The same random token batches for every framework (int32 numpy)."""
    import numpy as np

    rng = np.random.default_rng(0)
    return [rng.integers(0, vocab, (batch, seq), dtype=np.int32) for _ in range(n)]


def timed_steps(run_step, data, warmup: int) -> list[float]:
    """Seconds of each step after the warm-up; run_step must block until its step is done."""
    times = []
    for i, ids in enumerate(data):
        t0 = time.perf_counter()
        run_step(ids)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def experiment(overrides):
    from olmax.config.recipes import resolve

    return resolve(RECIPE, None, list(overrides))


# ----------------------------------------------------------------------------------------------
# Rows (each runs in a child process)


def row_olmax(args) -> dict:
    import jax

    from olmax.model.sharding import make_mesh
    from olmax.step.state import init_train_state
    from olmax.step.train_step import batch_sharding, make_train_step

    cfg = experiment(args.set)
    mesh = make_mesh(cfg.mesh, jax.devices()[:1])
    with jax.set_mesh(mesh):
        state = init_train_state(cfg, mesh, jax.random.key(0))
        step = make_train_step(cfg, mesh)
        holder = {"state": state}

        def run(ids):
            holder["state"], metrics = step(
                holder["state"], {"input_ids": jax.device_put(ids, batch_sharding(cfg, mesh))}
            )
            float(metrics["loss"])

        data = batches(args.warmup + args.steps, cfg.trainer.global_batch, cfg.data.seq_len, cfg.model.vocab_size)
        times = timed_steps(run, data, args.warmup)
    return {"times": times, "compiles": step._cache_size()}


def build_olmo_core(cfg, compiled: bool):
    """bench-small built with OLMo-core's config classes and initialisation, fp32 on CPU."""
    import torch

    from olmax.convert.olmo_core import olmo3_transformer_config
    from olmax.model.olmo3 import count_params

    m = cfg.model
    tcfg = olmo3_transformer_config(
        d_model=m.d_model,
        vocab_size=m.padded_vocab_size,
        n_layers=m.n_layers,
        n_heads=m.n_heads,
        n_kv_heads=m.n_kv_heads,
        window=m.sliding_window,
        rope_theta=m.rope_theta,
        norm_eps=m.norm_eps,
        global_every=m.global_every,
    )
    model = tcfg.build(init_device="cpu")
    model.init_weights(device=torch.device("cpu"))
    hidden = model.blocks["0"].feed_forward.hidden_size
    n_params = sum(p.numel() for p in model.parameters())
    if hidden != m.mlp_hidden or n_params != count_params(m):
        raise RuntimeError(
            f"OLMo-core model differs from {RECIPE}: MLP {hidden} vs {m.mlp_hidden}, "
            f"{n_params:,} vs {count_params(m):,} parameters"
        )
    if compiled:
        model.apply_compile()
    return model


def row_olmo_core(args, compiled: bool) -> dict:
    import torch
    from olmo_core.data.utils import get_labels
    from olmo_core.optim import AdamWConfig, OptimGroupOverride

    torch.set_num_threads(TORCH_THREADS)
    cfg = experiment(args.set)
    o = cfg.optimizer
    model = build_olmo_core(cfg, compiled)
    model.train()
    opt = AdamWConfig(
        lr=o.lr,
        betas=(o.b1, o.b2),
        eps=o.eps,
        weight_decay=o.weight_decay,
        group_overrides=[OptimGroupOverride(params=["embeddings.weight"], opts={"weight_decay": 0.0})],
    ).build(model)
    params = list(model.parameters())

    def run(ids):
        batch = {"input_ids": torch.from_numpy(ids).long()}
        labels = get_labels(batch)
        out = model(
            batch["input_ids"],
            labels=labels,
            loss_reduction="sum",
            z_loss_multiplier=o.z_loss,
            loss_div_factor=(labels != -100).sum(),
            return_logits=False,
        )
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, o.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        float(out.loss)

    data = batches(args.warmup + args.steps, cfg.trainer.global_batch, cfg.data.seq_len, cfg.model.vocab_size)
    return {"times": timed_steps(run, data, args.warmup)}


def row_matmul(args) -> dict:
    """fp32 matmul rates: a square 2048^3 and the LM head's (4096 x 512) @ (512 x 100352), best of 5."""
    import jax
    import jax.numpy as jnp
    import torch

    torch.set_num_threads(TORCH_THREADS)
    out = {}
    for name, (m, k, n) in {"square_2048": (2048, 2048, 2048), "lm_head": (4096, 512, 100352)}.items():
        a = jax.random.normal(jax.random.key(0), (m, k), jnp.float32)
        b = jax.random.normal(jax.random.key(1), (k, n), jnp.float32)
        f = jax.jit(jnp.matmul)
        f(a, b).block_until_ready()
        ta, tb = torch.randn(m, k), torch.randn(k, n)
        torch.matmul(ta, tb)
        best_x = best_t = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            f(a, b).block_until_ready()
            best_x = min(best_x, time.perf_counter() - t0)
            t0 = time.perf_counter()
            torch.matmul(ta, tb)
            best_t = min(best_t, time.perf_counter() - t0)
        flops = 2 * m * k * n
        out[name] = {"xla_gflops": flops / best_x / 1e9, "torch_gflops": flops / best_t / 1e9}
    return {"rates": out}


def row_profile(args) -> dict:
    """olmax's step taken apart, each piece jitted on its own, median of --steps runs after one."""
    import jax
    import jax.numpy as jnp

    from olmax.model.olmo3 import forward_hidden, init_params, param_specs
    from olmax.objectives.cross_entropy import make_labels, output_loss
    from olmax.step.optim import Optimizer

    cfg = experiment(args.set)
    m, t = cfg.model, cfg.trainer
    params = jax.jit(init_params, static_argnums=0)(m, jax.random.key(0))
    ids = jnp.asarray(batches(1, t.global_batch, cfg.data.seq_len, m.vocab_size)[0])
    labels = make_labels(ids)
    hidden = jax.jit(forward_hidden, static_argnums=2)(params, ids, m)
    opt = Optimizer(cfg.optimizer, param_specs(m))
    opt_state = jax.jit(opt.init)(params)

    def body_fwd(p):
        return forward_hidden(p, ids, m)

    def body_fwd_bwd(p):
        out, vjp = jax.vjp(body_fwd, p)
        return vjp(jnp.ones_like(out))

    def head(p, h):
        return output_loss(p, h, labels, m, chunk=t.loss_chunk, z_loss=cfg.optimizer.z_loss)[0]

    pieces = {
        "layers forward": (body_fwd, (params,)),
        "layers forward+backward": (body_fwd_bwd, (params,)),
        "output layer + loss, forward only": (head, (params, hidden)),
        "output layer + loss, forward+backward": (jax.grad(head, argnums=(0, 1)), (params, hidden)),
        "optimizer step (clip + AdamW)": (
            lambda g, s, p: opt.step(g, s, p, lr=3e-4, loss=1.0),
            (params, opt_state, params),
        ),
    }
    out = {}
    for name, (fn, fargs) in pieces.items():
        f = jax.jit(fn)
        jax.block_until_ready(f(*fargs))
        times = []
        for _ in range(args.profile_reps):
            t0 = time.perf_counter()
            jax.block_until_ready(f(*fargs))
            times.append(time.perf_counter() - t0)
        out[name] = statistics.median(times)
    return {"pieces": out}


# ----------------------------------------------------------------------------------------------
# MaxText


def maxtext_python() -> tuple[str | None, str]:
    """(interpreter, reason): a Python >= 3.12 that imports maxtext, or None and why not."""
    candidates = [os.environ["MAXTEXT_PYTHON"]] if os.environ.get("MAXTEXT_PYTHON") else []
    candidates += [p for p in [str(DEFAULT_MAXTEXT_VENV / "bin" / "python")] if os.path.exists(p)]
    candidates += [p for p in (shutil.which(f"python3.{minor}") for minor in range(12, 16)) if p]
    if not candidates:
        return None, "no Python >= 3.12 (MaxText 0.2.5 needs it): set MAXTEXT_PYTHON to one with maxtext installed"
    for exe in candidates:
        probe = subprocess.run(
            [exe, "-c", "import sys, maxtext; print(sys.version_info >= (3, 12))"], capture_output=True, text=True
        )
        if probe.returncode == 0 and probe.stdout.strip() == "True":
            return exe, ""
    return None, f"no interpreter among {', '.join(candidates)} is Python >= 3.12 with maxtext importable"


def row_maxtext(args) -> dict:
    """MaxText's own trainer on CPU (docs/performance/cpu.md), bench-small's shape. Per-step times are the
    gaps between the timestamps of its `completed step: N` log lines: the `seconds:` it prints is
    the time to dispatch a step (JAX is asynchronous), which reads 0.08 s for a 35 s step early on."""
    import re

    exe, reason = maxtext_python()
    if exe is None:
        return {"skipped": reason}
    cfg = experiment(args.set)
    m = cfg.model
    pkg = subprocess.run(
        [exe, "-c", "import maxtext, os; print(os.path.dirname(maxtext.__file__))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    steps = args.warmup + args.steps + 1  # n logged steps give n - 1 gaps
    cmd = [
        exe,
        "-m",
        "maxtext.trainers.pre_train.train",
        f"{pkg}/configs/base.yml",
        "hardware=cpu",
        "skip_jax_distributed_system=True",
        "attention=dot_product",
        "model_name=olmo3-7b-pt",
        "override_model_config=True",
        "run_name=bench-small",
        "dataset_type=synthetic",
        "enable_checkpointing=False",
        f"steps={steps}",
        f"per_device_batch_size={cfg.trainer.global_batch}",
        f"max_target_length={cfg.data.seq_len}",
        f"base_emb_dim={m.d_model}",
        f"base_num_decoder_layers={m.n_layers}",
        f"base_num_query_heads={m.n_heads}",
        f"base_num_kv_heads={m.n_kv_heads}",
        f"head_dim={m.head_dim}",
        f"base_mlp_dim={m.mlp_hidden}",
        f"vocab_size={m.padded_vocab_size}",
        f"sliding_window_size={m.sliding_window}",
        "dtype=float32",
        "weight_dtype=float32",
        f"learning_rate={cfg.optimizer.lr}",
        f"z_loss_multiplier={cfg.optimizer.z_loss}",
        f"adam_weight_decay={cfg.optimizer.weight_decay}",
        "remat_policy=full",
        f"base_output_directory={tempfile.mkdtemp(prefix='maxtext-bench-')}",
    ]
    env = dict(os.environ, DECOUPLE_GCLOUD="TRUE", JAX_PLATFORMS="cpu")
    wrapper = (
        "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
        "print('PEAK_RSS_KIB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(r.returncode)"
    )
    proc = subprocess.run([exe, "-c", wrapper, *cmd], capture_output=True, text=True, env=env)
    log = proc.stdout + proc.stderr
    stamps = re.findall(r"^I\d{4} (\d\d):(\d\d):([0-9.]+) .*completed step: \d+", log, flags=re.M)
    if proc.returncode or len(stamps) < steps:
        return {"skipped": f"MaxText exited {proc.returncode} after {len(stamps)} steps: {log[-400:]}"}
    seconds = [int(h) * 3600 + int(m) * 60 + float(s) for h, m, s in stamps]
    times = [(b - a) % 86400 for a, b in zip(seconds, seconds[1:])]  # % 86400: a run across midnight
    peak = re.search(r"PEAK_RSS_KIB (\d+)", log)
    return {"times": times[args.warmup :], "peak_rss_gib": int(peak.group(1)) / 2**20}


# ----------------------------------------------------------------------------------------------
# Parent: run the rows, print the table


def run_child(row: str, argv: list[str]) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", row, *argv], capture_output=True, text=True)
    if proc.returncode:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summarise(result: dict, tokens: int) -> dict:
    if "times" in result:
        s = statistics.median(result["times"])
        result.update(s_per_step=s, tokens_per_s=tokens / s)
    return result


def print_table(results: dict, cfg, args) -> None:
    from olmax.fit.flops import exact_step_flops, maxtext_step_flops

    m, tokens = cfg.model, cfg.trainer.global_batch * cfg.data.seq_len
    exact = exact_step_flops(m, cfg.data.seq_len, cfg.trainer.global_batch).total
    maxtext = maxtext_step_flops(m, cfg.data.seq_len, cfg.trainer.global_batch).total
    print(
        f"{RECIPE}: {tokens} tokens/step, {exact / 1e12:.3f} TFLOP/step exact "
        f"({maxtext / 1e12:.3f} by MaxText's convention); median of {args.steps} steps after {args.warmup}"
        + (f"; overrides {' '.join(args.set)}" if args.set else "")
    )
    mm = results.get("matmul", {})
    rate = mm.get("rates", {}).get("lm_head", {}).get("xla_gflops")
    if rate:
        for name, r in mm["rates"].items():
            print(f"matmul {name:12s} XLA:CPU {r['xla_gflops']:6.0f} GFLOP/s   torch {r['torch_gflops']:6.0f} GFLOP/s")
    print(f"{'framework':20s} {'s/step':>8s} {'tokens/s':>9s} {'peak RSS GiB':>13s} {'GFLOP/s':>8s} {'% matmul':>9s}")
    for row in ("olmax", "olmo-core-compiled", "olmo-core-eager", "maxtext"):
        r = results.get(row)
        if r is None:
            continue
        if "s_per_step" not in r:
            print(f"{row:20s} skipped: {r.get('skipped') or r.get('error')}")
            continue
        gflops = exact / r["s_per_step"] / 1e9
        pct = f"{100 * gflops / rate:8.0f}%" if rate else f"{'-':>9s}"
        print(
            f"{row:20s} {r['s_per_step']:8.2f} {r['tokens_per_s']:9.0f} {r['peak_rss_gib']:13.2f} {gflops:8.0f} {pct}"
        )
    if "maxtext" in results and "s_per_step" not in results["maxtext"]:
        o = MAXTEXT_ORIENTATION
        print(
            f"{'maxtext (NOT this run)':20s} {o['s_per_step']:8.2f} {o['tokens_per_s']:9.0f} {o['peak_rss_gib']:13.2f}"
            "   <- an earlier figure (docs/performance/cpu.md), not measured here"
        )
    ours = results.get("olmax", {})
    for ref in ("olmo-core-compiled", "olmo-core-eager", "maxtext"):
        r = results.get(ref, {})
        if "tokens_per_s" in ours and "tokens_per_s" in r:
            print(
                f"olmax / {ref}: {ours['tokens_per_s'] / r['tokens_per_s']:.2f}x tokens/s, "
                f"{ours['peak_rss_gib'] / r['peak_rss_gib']:.2f}x peak RSS"
            )
    if "olmax" in results and "compiles" in ours:
        print(f"olmax step compilations over {args.warmup + args.steps} steps: {ours['compiles']}")
    prof = results.get("profile")
    if prof and "pieces" in prof:
        print("olmax profile (each piece jitted alone, median s):")
        for name, s in prof["pieces"].items():
            print(f"  {name:40s} {s:7.2f}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--only", action="append", choices=ROWS, help="run only these rows (repeatable)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override of the bench-small recipe (olmax, OLMo-core and MaxText rows alike)",
    )
    p.add_argument("--profile-reps", type=int, default=3)
    p.add_argument("--json", help="write the results here")
    p.add_argument("--child", choices=ROWS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        fn = {
            "olmax": row_olmax,
            "olmo-core-compiled": lambda a: row_olmo_core(a, True),
            "olmo-core-eager": lambda a: row_olmo_core(a, False),
            "matmul": row_matmul,
            "maxtext": row_maxtext,
            "profile": row_profile,
        }[args.child]
        result = fn(args)
        result.setdefault("peak_rss_gib", peak_rss_gib())
        print(json.dumps(result))
        return
    cfg = experiment(args.set)
    tokens = cfg.trainer.global_batch * cfg.data.seq_len
    child_argv = [f"--steps={args.steps}", f"--warmup={args.warmup}", f"--profile-reps={args.profile_reps}"]
    child_argv += [f"--set={s}" for s in args.set]
    results = {}
    for row in args.only or ROWS:
        print(f"running {row} ...", file=sys.stderr, flush=True)
        results[row] = summarise(run_child(row, child_argv), tokens)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "recipe": RECIPE,
                    "overrides": args.set,
                    "steps": args.steps,
                    "warmup": args.warmup,
                    "date": time.strftime("%Y-%m-%d"),
                    "results": results,
                },
                f,
                indent=2,
            )
    print_table(results, cfg, args)


if __name__ == "__main__":
    main()
