"""Training parity with ai2-olmo-core 3.0.0: the same tiny OLMo 3 trained in both, step by step.

`compare_training(Setup(...), work_dir)` runs both and returns their per-step metrics and the figures
that compare them; tests/parity/test_train_parity.py asserts on them and benchmarks/train_parity.py runs it
longer, with a plot. Needs the `parity` extra (torch, ai2-olmo-core), imported inside the functions.

What is compared (docs/training-parity.md):
- Model: a tiny OLMo 3 built and initialised by OLMo-core (`TransformerConfig.llama_like` with the
  reordered-norm block, QK-norm, windows [W, W, W, full], `init_weights`), its state dict converted
  with `olmax.convert.olmo_core.convert_from_olmo_core`, so both start from the same weights.
- Data: the same token files. OLMo-core reads them with its `NumpyFSLDataset` + `NumpyDataLoader`,
  olmax with `olmax.data.loader.make_loader`; every batch is checked to be the same tokens.
- Step: OLMo-core's plain torch model in a hand-written loop that does what its
  `TransformerTrainModule` does per step: `model(input_ids, labels=get_labels(batch),
  loss_reduction="sum", z_loss_multiplier=1e-5, loss_div_factor=<labels in the global batch>)`,
  backward of CE + z-loss, `get_total_norm` + `clip_grads_with_norm_` at 1.0, lr from
  `CosWithWarmup.get_lr(lr, step, t_max)` (1-based step), `latest_loss` = CE and `latest_grad_norm`
  = the pre-clip norm, then `SkipStepAdamW.step()` (weight decay 0.1 except `embeddings.weight`).
  olmax runs its production step, `olmax.step.train_step.make_train_step`, on a mesh of all devices.
- A loss spike: at `spike_step` both sides train on the same pathological batch (tokens the
  corpus never contains), which the skip-step rule must reject on both sides.
Final parameters are converted back the same way and compared tensor by tensor.

`Setup(sft=True)` is SFT as AI2 ran it (docs/post-training/sft-parity.md, "SFT"), with the olmax side configured
from the `olmo3_7b_instruct_sft` recipe: chat parts from `olmax tokenize --chat instruct`
(olmax.parity.sft), OBFD-packed with their label masks and attention within each
conversation (OLMo-core: `NumpyPackedFSLDataset` with `label_mask_paths` and `generate_doc_lengths`,
the batch's `doc_lens` and `max_doc_lens` passed to the model as the train module passes them; olmax:
data.packing=obfd, doc_masking, label_masks, RoPE positions restarted per document as 3.0.0's
`RotaryEmbedding` restarts them given `cu_doc_lens`), labels from `get_labels` (-100 where the mask
is False), no z-loss, weight decay 0, `LinearWithWarmup(warmup_fraction=0.03, alpha_f=0)` against
schedule.warmup_fraction=0.03, and no spike. The horizon is the run's steps (AI2's: 2 epochs).
`Setup.sft_run(steps, ranks=D, micro_batch=m)` trains the OLMo-core side with its own train module
over D data-parallel ranks in D processes, m instances per rank per micro-batch
(olmax.parity.olmo_core.run_olmo_core_ranks), and olmax with trainer.loss_normalisation=per_rank
over D ranks.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from olmax.parity.harness import EOS, PAD, VOCAB, Run, Setup, batch_record, spike_batch, write_data
from olmax.parity.olmo_core import build_olmo_core_model, nudge_, run_olmo_core

# ----------------------------------------------------------------------------------------------
# OLMo-core side


def olmax_model_config(model, setup: Setup):
    from olmax.config.model import ModelConfig

    attn = model.blocks["0"].attention
    return ModelConfig(
        vocab_size=VOCAB,
        d_model=setup.d_model,
        n_layers=setup.n_layers,
        n_heads=attn.n_heads,
        n_kv_heads=attn.n_kv_heads,
        head_dim=attn.head_dim,
        mlp_hidden=model.blocks["0"].feed_forward.hidden_size,
        sliding_window=setup.window,
        rope_theta=10000.0,
        norm_eps=1e-6,
        max_position=setup.seq_len,
        compute_dtype="float32",
    )


def olmo_core_to_olmax(model, model_cfg, work: Path) -> dict:
    """The model's state dict through olmax's OLMo-core converter (the path a user takes)."""
    import torch

    from olmax.checkpoint.store import load_params
    from olmax.convert.olmo_core import convert_from_olmo_core

    work.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), work / "model.pt")
    convert_from_olmo_core(work / "model.pt", model_cfg, work / "olmax")
    params, _, _ = load_params(work / "olmax")
    return params


# ----------------------------------------------------------------------------------------------
# olmax side


def olmax_experiment(model_cfg, paths: list[str], setup: Setup, work: Path):
    from dataclasses import replace

    from olmax.config.data import DataConfig
    from olmax.config.experiment import ExperimentConfig
    from olmax.config.mesh import MeshConfig
    from olmax.config.optimizer import OptimizerConfig
    from olmax.config.recipes import get_recipe
    from olmax.config.schedule import ScheduleConfig
    from olmax.config.trainer import TrainerConfig

    data = DataConfig(
        paths=tuple(paths),
        seq_len=setup.seq_len,
        seed=setup.seed,
        vocab_size=VOCAB,
        eos_token_id=EOS,
        pad_token_id=PAD,
        work_dir=str(work),
    )
    if setup.sft:
        # the recipe's optimizer (wd 0, no z-loss), schedule (linear, 3% warmup, to 0) and data settings;
        # the horizon is trainer.max_steps instead of the recipe's 2 epochs
        recipe = get_recipe("olmo3_7b_instruct_sft")
        optimizer = replace(recipe.optimizer, lr=setup.lr, skip_window=setup.skip_window)
        schedule = replace(recipe.schedule, t_max_epochs=None)
        packing = {k: getattr(recipe.data, k) for k in ("packing", "long_doc_strategy", "doc_masking", "label_masks")}
        data = replace(data, **packing)
        model_cfg = replace(model_cfg, rope_positions="document")
    else:
        # the defaults are AI2's: clip 1.0, wd 0.1 except the embedding, z-loss 1e-5, skip 128 / 6 sigma
        optimizer = OptimizerConfig(lr=setup.lr, skip_window=setup.skip_window)
        schedule = ScheduleConfig(name="cosine", warmup_steps=setup.warmup, alpha_f=setup.alpha_f)
    return ExperimentConfig(
        name="train-parity",
        model=model_cfg,
        data=data,
        optimizer=optimizer,
        schedule=schedule,
        trainer=TrainerConfig(
            global_batch=setup.global_batch,
            max_steps=setup.steps,
            loss_normalisation="per_rank" if setup.ranks > 1 else "global",
            loss_ranks=setup.ranks if setup.ranks > 1 else None,
        ),
        mesh=MeshConfig(data=1, fsdp=-1, tensor=1),
    )


def run_olmax(cfg, params: dict, setup: Setup) -> Run:
    import jax

    from olmax.data.loader import make_loader
    from olmax.model.sharding import make_mesh
    from olmax.step.state import init_train_state
    from olmax.step.train_step import batch_sharding, make_train_step

    mesh = make_mesh(cfg.mesh)
    run = Run()
    with jax.set_mesh(mesh):
        state = init_train_state(cfg, mesh, jax.random.key(0), params)
        step_fn = make_train_step(cfg, mesh)
        to_global = batch_sharding(cfg, mesh)
        batches = iter(make_loader(cfg.data, cfg.trainer.global_batch))
        start = time.perf_counter()
        for step in range(1, setup.steps + 1):
            batch = next(batches)
            if step == setup.spike_step:
                batch = {"input_ids": spike_batch(setup)}
            # what olmax.trainer.run sends the step: the tokens, and in SFT the doc_lens and label_mask
            batch = {k: batch[k] for k in ("input_ids", "doc_lens", "label_mask") if k in batch}
            run.batches.append(batch_record(batch["input_ids"], batch.get("label_mask"), batch.get("doc_lens")))
            state, m = step_fn(state, {k: jax.device_put(v, to_global) for k, v in batch.items()})
            m = jax.device_get(m)
            run.ce.append(float(m["ce_loss"]))
            run.z.append(float(m["z_loss"]))
            run.grad_norm.append(float(m["grad_norm"]))
            run.lr.append(float(m["lr"]))
            if m["skipped"] > 0:
                run.skipped.append(step)
        run.params = jax.tree.map(np.asarray, jax.device_get(state.params))
        run.seconds = time.perf_counter() - start
    return run


# ----------------------------------------------------------------------------------------------
# Both, and the figures


def compare_training(setup: Setup, work: Path, noise_floor: bool = False) -> tuple[Run, Run, dict]:
    """Train both sides from the same start; returns (olmo_core run, olmax run, figures).
    noise_floor: also train OLMo-core a second time from its start moved by one ulp (`nudge_`);
    how far the two OLMo-core runs drift apart is what float32 rounding alone does to this run."""
    import jax

    paths = write_data(setup, work / "data")
    model = build_olmo_core_model(setup)
    model_cfg = olmax_model_config(model, setup)
    params0 = olmo_core_to_olmax(model, model_cfg, work / "init")
    if setup.ranks > 1:
        from olmax.parity.olmo_core import run_olmo_core_ranks

        ref, final = run_olmo_core_ranks(work / "init" / "model.pt", paths, setup, work / "olmo_core")
        model.load_state_dict(final)
    else:
        ref = run_olmo_core(model, paths, setup, work / "olmo_core")
    ref.params = olmo_core_to_olmax(model, model_cfg, work / "final")
    ours = run_olmax(olmax_experiment(model_cfg, paths, setup, work / "olmax"), params0, setup)
    floor = None
    if noise_floor:
        twin = build_olmo_core_model(setup)
        nudge_(twin)
        if setup.ranks > 1:
            import torch

            from olmax.parity.olmo_core import run_olmo_core_ranks

            torch.save(twin.state_dict(), work / "init" / "twin.pt")
            floor, _ = run_olmo_core_ranks(work / "init" / "twin.pt", paths, setup, work / "olmo_core_twin")
        else:
            floor = run_olmo_core(twin, paths, setup, work / "olmo_core_twin")

    same_data = all(
        a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a) for a, b in zip(ref.batches, ours.batches)
    )
    ce_gap = np.abs(np.asarray(ref.ce) - np.asarray(ours.ce))
    rel_ce_gap = ce_gap / np.asarray(ref.ce)
    # per tensor: largest entry difference relative to the tensor's largest entry
    rel = {
        jax.tree_util.keystr(path): float(np.abs(a - b).max() / np.abs(b).max())
        for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(ours.params), jax.tree.leaves(ref.params))
    }
    worst = max(rel, key=rel.get)
    flat = lambda tree: np.concatenate([np.ravel(x) for x in jax.tree.leaves(tree)])
    ours_flat, ref_flat = flat(ours.params), flat(ref.params)
    figures = {
        "steps": setup.steps,
        "spike_step": setup.spike_step,
        "same_batches": same_data,
        "max_abs_ce_delta": float(ce_gap.max()),
        "max_abs_ce_delta_step": int(ce_gap.argmax()) + 1,
        "max_rel_ce_delta": float(rel_ce_gap.max()),
        "max_rel_ce_delta_step": int(rel_ce_gap.argmax()) + 1,
        "max_abs_z_delta": float(np.abs(np.asarray(ref.z) - np.asarray(ours.z)).max()),
        "max_rel_grad_norm_delta": float(
            np.max(np.abs(np.asarray(ref.grad_norm) - np.asarray(ours.grad_norm)) / np.asarray(ref.grad_norm))
        ),
        "max_abs_lr_delta": float(np.abs(np.asarray(ref.lr) - np.asarray(ours.lr)).max()),
        "skips_olmo_core": ref.skipped,
        "skips_olmax": ours.skipped,
        "skips_match": ref.skipped == ours.skipped,
        "final_max_rel_param_diff": rel[worst],
        "worst_param": worst,
        "final_rel_l2_param_diff": float(np.linalg.norm(ours_flat - ref_flat) / np.linalg.norm(ref_flat)),
        "first_ce": ref.ce[0],
        "last_ce": ref.ce[-1],
        "seconds_olmo_core": round(ref.seconds, 1),
        "seconds_olmax": round(ours.seconds, 1),
    }
    if floor is not None:
        twin_gap = np.abs(np.asarray(ref.ce) - np.asarray(floor.ce))
        figures["noise_floor_ce"] = twin_gap.tolist()
        figures["noise_floor_max_abs_ce_delta"] = float(twin_gap.max())
        figures["noise_floor_skips"] = floor.skipped
    return ref, ours, figures
