"""DPO step speed: olmax's jitted train step (trainer.objective=dpo) against TRL 1.16.0's `DPOTrainer` step.

    .venv/bin/python benchmarks/dpo_step.py [--d-model 256 --layers 4 --vocab 4096 --pairs 4 --seq 128
                                             --steps 8 --warmup 2 --repeats 3 --json out.json]

One random transformers `Olmo3ForCausalLM` (OLMo 3's layout: windowed attention on layers 0-2 of
every 4, the last layer global; `--window` tokens) is the policy; its reference is the same model with
every weight scaled by 1 + 0.02 N(0, 1). The policy goes to olmax through `convert_from_hf`, so both
sides start from the same weights, in fp32 on the CPU.

Both run AI2's OLMo 3 DPO loss: olmax `dpo.loss_type=dpo_norm`, TRL `loss_type=["sigmoid_norm"]`,
beta 5, with the reference log-probs computed once before training (TRL `precompute_ref_log_probs=True`,
olmax's reference cache), so a step is one policy forward and backward over the 2 x `--pairs` rows plus
AdamW (torch defaults: betas 0.9/0.999, eps 1e-8, no weight decay, constant lr 1e-6, clipping at 1.0;
olmax's optimizer set the same, skip-step off). TRL tokenizes `--pairs` preference rows of random
word-level text (responses of different lengths) and pads them to `--seq` tokens; olmax's batch is
TRL's collated batch (input ids, completion mask as the response mask, TRL's precomputed reference
log-probs) in olmax's pair layout, so both see the same tokens. Before timing, the script checks that
TRL's `compute_loss` on that batch equals the loss of olmax's first step.

Timing: olmax, the wall time of each `step(state, batch)` call until its metrics are on the host (the
batch passed as numpy, as the trainer does); TRL, the time between consecutive `on_step_end`
callbacks of `trainer.train()` (collation, forward, backward, clipping, AdamW and TRL's bookkeeping:
what a training loop pays per step). Each repeat runs a block of olmax steps, then a block of TRL
steps in a fresh trainer (blocks interleaved so that a change of load hits both); the first `--warmup`
steps of each block are dropped (olmax: the compile; TRL: first-call set-up). Reported: the median
of the kept steps of all repeats, and the load average before and after. torch runs `--threads`
threads (default 2, the cores here); XLA:CPU sizes its own pool to the machine. On shared cores torch's
threads suffer more from other jobs than XLA's (docs/performance/post-training.md, "DPO step"): `taskset -c 0 ...
--threads 1` gives both sides one core. Prints a table; asserts nothing but the loss check.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

BETA = 5.0
LR = 1e-6
SLIDING, FULL = "sliding_attention", "full_attention"


def hf_models(args):
    """(policy, reference) transformers models of the requested size."""
    import torch
    from transformers import Olmo3Config, Olmo3ForCausalLM

    rope = {"rope_type": "default", "rope_theta": 500000.0}
    layer_types = [FULL if (i + 1) % 4 == 0 or i == args.layers - 1 else SLIDING for i in range(args.layers)]
    cfg = Olmo3Config(
        vocab_size=args.vocab,
        hidden_size=args.d_model,
        intermediate_size=3 * args.d_model,
        num_hidden_layers=args.layers,
        num_attention_heads=args.d_model // 64,
        num_key_value_heads=args.d_model // 64,
        rms_norm_eps=1e-6,  # OLMo 3's (transformers' default is 1e-5)
        sliding_window=args.window,
        layer_types=layer_types,
        rope_parameters={SLIDING: dict(rope), FULL: dict(rope)},
        max_position_embeddings=max(4096, args.seq),
        eos_token_id=args.vocab - 2,
        pad_token_id=args.vocab - 1,
    )
    torch.manual_seed(0)
    policy = Olmo3ForCausalLM(cfg)
    reference = Olmo3ForCausalLM(cfg)
    reference.load_state_dict(policy.state_dict())
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in reference.parameters():
            p.mul_(1 + 0.02 * torch.randn(p.shape, generator=gen))
    return policy, reference


def preference_rows(args) -> list[dict]:
    """Word-level rows "t<i> ..." whose prompt + response + EOS fit in --seq tokens."""
    rng = np.random.default_rng(0)

    def words(n):
        return "".join(f" t{i}" for i in rng.integers(0, args.vocab - 2, n))

    rows = []
    for _ in range(args.pairs):
        prompt = int(rng.integers(args.seq // 8, args.seq // 4 + 1))
        room = args.seq - prompt - 1  # TRL appends EOS to each response
        chosen, rejected = (int(n) for n in rng.integers(room // 2, room + 1, 2))
        rows.append({"prompt": words(prompt).strip(), "chosen": words(chosen), "rejected": words(rejected)})
    return rows


def trl_trainer(args, policy, reference, out_dir: str):
    """A fresh DPOTrainer over a copy of `policy`, reference log-probs precomputed."""
    from datasets import Dataset
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import Olmo3ForCausalLM, PreTrainedTokenizerFast
    from trl import DPOConfig, DPOTrainer

    vocab = {f"t{i}": i for i in range(args.vocab - 2)} | {"<|endoftext|>": args.vocab - 2, "<|pad|>": args.vocab - 1}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|pad|>")
    model = Olmo3ForCausalLM(policy.config)
    model.load_state_dict(policy.state_dict())
    config = DPOConfig(
        output_dir=out_dir,
        beta=BETA,
        loss_type=["sigmoid_norm"],  # open-instruct's dpo_norm
        precompute_ref_log_probs=True,
        use_cpu=True,
        bf16=False,  # DPOConfig's default is bf16
        activation_checkpointing=False,  # TRL's default is on; olmax's step runs with model.remat=none
        max_length=None,
        pad_to_multiple_of=args.seq,
        per_device_train_batch_size=args.pairs,
        learning_rate=LR,
        lr_scheduler_type="constant",
        optim="adamw_torch",
        weight_decay=0.0,
        max_grad_norm=1.0,
        max_steps=args.warmup + args.steps,
        logging_steps=args.warmup + args.steps,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    dataset = Dataset.from_list(preference_rows(args))
    return DPOTrainer(model=model, ref_model=reference, args=config, train_dataset=dataset, processing_class=tok)


def olmax_batch(trainer) -> tuple[dict[str, np.ndarray], dict]:
    """(olmax's batch, TRL's): TRL's collated batch of every row ([chosen; rejected] rows) and the same
    in olmax's (pairs, 2, ...) layout."""
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(trainer.train_dataset))])
    ids, mask = batch["input_ids"].numpy(), batch["completion_mask"].numpy().astype(bool)
    pairs, seq = ids.shape[0] // 2, ids.shape[1]
    return {
        "input_ids": ids.reshape(2, pairs, seq).swapaxes(0, 1).astype(np.int32),
        "response_mask": mask.reshape(2, pairs, seq).swapaxes(0, 1),
        "reference_logps": np.stack([batch["ref_chosen_logps"].numpy(), batch["ref_rejected_logps"].numpy()], axis=1),
    }, batch


def olmax_step(args, policy, tmp: Path):
    """(state, the jitted DPO step, mesh) of olmax over the policy's weights."""
    import jax

    from olmax.checkpoint.store import load_params
    from olmax.config.data import DataConfig
    from olmax.config.dpo import DPOConfig
    from olmax.config.experiment import ExperimentConfig
    from olmax.config.optimizer import OptimizerConfig
    from olmax.config.schedule import ScheduleConfig
    from olmax.config.trainer import TrainerConfig
    from olmax.convert.hf import convert_from_hf
    from olmax.model.sharding import make_mesh
    from olmax.step.state import init_train_state
    from olmax.step.train_step import make_train_step

    policy.save_pretrained(tmp / "hf")
    convert_from_hf(str(tmp / "hf"), tmp / "olmax")
    params, model, _ = load_params(tmp / "olmax")
    cfg = ExperimentConfig(
        name="dpo-step-bench",
        model=dataclasses.replace(model, compute_dtype="float32", param_dtype="float32"),
        data=DataConfig(seq_len=args.seq),
        optimizer=OptimizerConfig(lr=LR, b2=0.999, weight_decay=0.0, z_loss=0.0, skip_step=False, max_grad_norm=1.0),
        schedule=ScheduleConfig(name="constant", warmup_steps=0),
        trainer=TrainerConfig(global_batch=args.pairs, max_steps=10**6, objective="dpo", loss_chunk=args.loss_chunk),
        dpo=DPOConfig(loss_type="dpo_norm", beta=BETA),
    )
    mesh = make_mesh(cfg.mesh, jax.devices()[:1])
    with jax.set_mesh(mesh):
        state = init_train_state(cfg, mesh, jax.random.key(0), params=params)
        step = make_train_step(cfg, mesh)
    return state, step, mesh


def time_olmax(state, step, mesh, batch, n: int):
    import jax

    times, losses = [], []
    with jax.set_mesh(mesh):
        for _ in range(n):
            start = time.perf_counter()
            state, metrics = step(state, batch)
            losses.append(float(metrics["loss"]))  # waits for the step
            times.append(time.perf_counter() - start)
    return state, times, losses


def time_trl(trainer) -> list[float]:
    from transformers import PrinterCallback, TrainerCallback

    ends = []

    class StepEnds(TrainerCallback):
        def on_train_begin(self, *_, **__):
            ends.append(time.perf_counter())

        def on_step_end(self, *_, **__):
            ends.append(time.perf_counter())

    trainer.remove_callback(PrinterCallback)  # the end-of-run log line
    trainer.add_callback(StepEnds())
    trainer.train()
    return list(np.diff(ends))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d-model", type=int, default=256, help="heads of 64")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--loss-chunk", type=int, default=0, help="olmax trainer.loss_chunk (0: one chunk)")
    ap.add_argument("--steps", type=int, default=8, help="timed steps per block")
    ap.add_argument("--warmup", type=int, default=2, help="steps dropped per block (>= 1: TRL's first has its set-up)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="torch threads (XLA:CPU sizes its own pool)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    os.environ.setdefault("TQDM_DISABLE", "1")  # TRL's reference pass reads it
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the comparison is on the CPU; no probing for plugins
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers 5's renamed-argument notices

    import jax
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    policy, reference = hf_models(args)
    ours, theirs, loss_check = [], [], None
    with tempfile.TemporaryDirectory() as tmp:
        state, step, mesh = olmax_step(args, policy, Path(tmp))
        for r in range(args.repeats):
            trainer = trl_trainer(args, policy, reference, str(Path(tmp) / f"trl-{r}"))
            batch, trl_batch = olmax_batch(trainer)
            if loss_check is None:
                with torch.no_grad():
                    trl_loss = trainer.compute_loss(trainer.model, trl_batch).item()
                # the first step's loss is that of the starting weights, as TRL's here
                state, times, losses = time_olmax(state, step, mesh, batch, args.warmup + args.steps)
                loss_check = {"olmax": losses[0], "trl": trl_loss}
                if abs(losses[0] - trl_loss) > 1e-4:
                    raise SystemExit(f"not the same loss: olmax {losses[0]:.6f}, TRL {trl_loss:.6f}")
            else:
                state, times, _ = time_olmax(state, step, mesh, batch, args.warmup + args.steps)
            ours += times[args.warmup :]
            theirs += time_trl(trainer)[args.warmup :]
    load_after = os.getloadavg()
    olmax_s, trl_s = statistics.median(ours), statistics.median(theirs)
    n_params = sum(p.numel() for p in policy.parameters())
    tokens = 2 * args.pairs * args.seq
    print(
        f"# {platform.machine()} {jax.devices()[0].platform}, fp32, torch threads {torch.get_num_threads()}, "
        f"load average {load_before[0]:.1f} before / {load_after[0]:.1f} after"
    )
    print(
        f"# model: d_model {args.d_model}, {args.layers} layers, vocab {args.vocab}, window {args.window}, "
        f"{n_params / 1e6:.1f}M params, HF attention {policy.config._attn_implementation}; "
        f"batch {args.pairs} pairs x 2 x {args.seq} tokens; dpo_norm, beta {BETA:g}"
    )
    print(
        f"# first-step loss: olmax {loss_check['olmax']:.6f}, TRL {loss_check['trl']:.6f}; "
        f"median of {len(ours)} steps each ({args.repeats} blocks of {args.steps} after {args.warmup})"
    )
    print("| | s/step | tokens/s | min s | max s |")
    print("|---|---|---|---|---|")
    for name, t, m in (("olmax", ours, olmax_s), ("TRL 1.16.0", theirs, trl_s)):
        print(f"| {name} | {m:.3f} | {tokens / m:,.0f} | {min(t):.3f} | {max(t):.3f} |")
    print(f"ratio (TRL s/step / olmax s/step): {trl_s / olmax_s:.2f}x")
    if args.json:
        report = {
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "load_average": {"before": load_before, "after": load_after},
            "params": n_params,
            "first_step_loss": loss_check,
            "olmax_step_s": ours,
            "trl_step_s": theirs,
            "olmax_median_s": olmax_s,
            "trl_median_s": trl_s,
            "ratio": trl_s / olmax_s,
        }
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
