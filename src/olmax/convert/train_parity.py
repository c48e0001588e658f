"""Training parity with ai2-olmo-core 3.0.0: the same tiny OLMo 3 trained in both, step by step.

`compare_training(Setup(...), work_dir)` runs both and returns their per-step metrics and the figures
that compare them; tests/test_train_parity.py asserts on them and benchmarks/train_parity.py runs it
longer, with a plot. Needs the `parity` extra (torch, ai2-olmo-core), imported inside the functions.

What is compared (docs/training.md, "Training parity with OLMo-core"):
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
  olmax runs its production step, `olmax.train_step.make_train_step`, on a mesh of all devices.
- A loss spike: at `spike_step` both sides train on the same pathological batch (tokens the
  corpus never contains), which the skip-step rule must reject on both sides.
Final parameters are converted back the same way and compared tensor by tensor.

`Setup(sft=True)` is SFT as AI2 ran it (docs/post-training.md, "SFT"), with the olmax side configured
from the `olmo3_7b_instruct_sft` recipe: chat parts from `olmax tokenize --chat instruct`
(olmax.convert.train_parity_sft), OBFD-packed with their label masks and attention within each
conversation (OLMo-core: `NumpyPackedFSLDataset` with `label_mask_paths` and `generate_doc_lengths`,
the batch's `doc_lens` and `max_doc_lens` passed to the model as the train module passes them; olmax:
data.packing=obfd, doc_masking, label_masks, RoPE positions restarted per document as 3.0.0's
`RotaryEmbedding` restarts them given `cu_doc_lens`), labels from `get_labels` (-100 where the mask
is False), no z-loss, weight decay 0, `LinearWithWarmup(warmup_fraction=0.03, alpha_f=0)` against
schedule.warmup_fraction=0.03, and no spike. The horizon is the run's steps (AI2's: 2 epochs).
`Setup.sft_run(steps, ranks=D, micro_batch=m)` trains the OLMo-core side with its own train module
over D data-parallel ranks in D processes, m instances per rank per micro-batch
(olmax.convert.train_parity_sft.run_olmo_core_ranks), and olmax with trainer.loss_normalisation=per_rank
over D ranks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# Corpus: a Markov chain over the first CORPUS_TOKENS ids (so the loss falls quickly), documents
# ended by EOS; ids CORPUS_TOKENS..PAD-1 never occur and make the spike batch. The model's
# embedding has PADDED_VOCAB rows, as AI2 builds OLMo 3 with the padded vocabulary (docs/reference.md, "Model").
VOCAB, EOS, PAD = 300, 299, 298
PADDED_VOCAB = 384
CORPUS_TOKENS = 200


@dataclass(frozen=True)
class Setup:
    steps: int = 100
    spike_step: int = 80  # > skip_window / 2: the skip rule needs half of its window first
    seq_len: int = 32
    global_batch: int = 8
    d_model: int = 64
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    window: int = 8
    lr: float = 3e-3
    warmup: int = 10
    alpha_f: float = 0.1
    skip_window: int = 128  # AI2's; a short test run shrinks it on both sides so the rule can fire early
    seed: int = 34521  # data order seed
    sft: bool = False  # SFT as AI2 ran it (the module doc) instead of stage-1 pre-training
    # SFT over several data-parallel ranks: OLMo-core's train module in one process per rank, olmax
    # with trainer.loss_normalisation=per_rank over as many ranks (the module doc)
    ranks: int = 1
    micro_batch: int = 0  # instances per OLMo-core rank per forward/backward with ranks > 1; 0 = all

    def __post_init__(self):
        if self.sft and self.spike_step:
            raise ValueError("the spike batch is pre-training data: Setup(sft=True) takes spike_step=0")
        if self.ranks > 1 and not self.sft:
            raise ValueError("Setup(ranks > 1) is the SFT run (per-rank loss normalisation): it needs sft=True")

    @classmethod
    def sft_run(cls, steps: int, **kw) -> "Setup":
        """SFT's setup: instances of 128 tokens (two or three conversations), no spike, lr 1e-3.
        At 3e-3 this data trains at the edge of stability (the CE stalls near 2.2 and the gradient norm
        swings), where float32 rounding grows past 1e-4 of the CE within 40 steps: OLMo-core against
        itself from a start one ulp away as much as olmax against it (docs/post-training.md)."""
        return cls(steps=steps, spike_step=0, seq_len=128, lr=1e-3, sft=True, **kw)

    @property
    def rank_micro_batch(self) -> int:
        return self.micro_batch or self.global_batch // self.ranks

    @property
    def z_loss(self) -> float:
        return 0.0 if self.sft else 1e-5

    @property
    def weight_decay(self) -> float:
        return 0.0 if self.sft else 0.1


@dataclass
class Run:
    ce: list = field(default_factory=list)
    z: list = field(default_factory=list)
    grad_norm: list = field(default_factory=list)
    lr: list = field(default_factory=list)
    skipped: list = field(default_factory=list)  # 1-based steps the optimizer skipped
    batches: list = field(default_factory=list)  # per step {input_ids[, label_mask, doc]} (to prove the same data)
    params: dict | None = None  # final parameters, olmax layout, numpy
    seconds: float = 0.0


def write_corpus(directory: Path, n_files: int = 3, tokens_per_file: int = 40_000, seed: int = 0) -> list[str]:
    """Raw uint16 token files (OLMo-core's format: headerless, EOS after each document)."""
    rng = np.random.default_rng(seed)
    successor = rng.permutation(CORPUS_TOKENS)  # the likely next token of each token
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for f in range(n_files):
        out = []
        while len(out) < tokens_per_file:
            n = int(rng.integers(20, 200))
            doc = [int(rng.integers(CORPUS_TOKENS))]
            follow = rng.random(n) < 0.8
            noise = rng.integers(CORPUS_TOKENS, size=n)
            for i in range(n - 1):
                doc.append(int(successor[doc[-1]]) if follow[i] else int(noise[i]))
            out += doc + [EOS]
        path = directory / f"part-{f:03d}.npy"
        np.asarray(out[:tokens_per_file], np.uint16).tofile(path)
        paths.append(str(path))
    return paths


def write_data(setup: Setup, directory: Path) -> list[str]:
    """The token files the run reads: the Markov corpus over 3 files, a tenth more than the run consumes
    (remainders are dropped per file); in SFT, conversations of ~51 tokens, one per 40 tokens the run
    consumes (OBFD pads ~10% of every instance)."""
    tokens = 1.1 * setup.steps * setup.global_batch * setup.seq_len
    if setup.sft:
        from olmax.convert.train_parity_sft import write_chat_corpus

        return write_chat_corpus(directory, n=int(tokens / 40), vocab=VOCAB, eos=EOS)
    return write_corpus(directory, tokens_per_file=max(40_000, int(tokens / 3) + 3 * setup.seq_len))


def spike_batch(setup: Setup) -> np.ndarray:
    """Tokens the corpus never contains: the model has learned to push their logits down."""
    rng = np.random.default_rng(1)
    return rng.integers(CORPUS_TOKENS, PAD, size=(setup.global_batch, setup.seq_len)).astype(np.int32)


# ----------------------------------------------------------------------------------------------
# OLMo-core side


def build_olmo_core_model(setup: Setup):
    """A tiny OLMo 3 (olmo3_transformer_config) with OLMo-core's own initialisation (fp32, CPU)."""
    import torch

    from olmax.convert.olmo_core import olmo3_transformer_config

    cfg = olmo3_transformer_config(
        d_model=setup.d_model,
        vocab_size=PADDED_VOCAB,
        n_layers=setup.n_layers,
        n_heads=setup.n_heads,
        n_kv_heads=setup.n_kv_heads,
        window=setup.window,
        rope_theta=10000,
    )
    model = cfg.build(init_device="cpu")
    model.init_weights(device=torch.device("cpu"))
    if setup.sft:
        from olmax.convert.train_parity_sft import mask_within_documents_

        mask_within_documents_(model)
    return model


def olmax_model_config(model, setup: Setup):
    from olmax.config import ModelConfig

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

    from olmax.checkpoint import load_params
    from olmax.convert.olmo_core import convert_from_olmo_core

    work.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), work / "model.pt")
    convert_from_olmo_core(work / "model.pt", model_cfg, work / "olmax")
    params, _, _ = load_params(work / "olmax")
    return params


def nudge_(model) -> None:
    """Move every weight by one float32 ulp (towards +inf): a start that differs only by rounding."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.nextafter(p, torch.full_like(p, float("inf"))))


def olmo_core_dataset(paths: list[str], setup: Setup, work: Path):
    """Stage 1: `NumpyFSLDataset` over the token files. SFT: `NumpyPackedFSLDataset` configured as
    src/scripts/train/sft/Olmo-3-7B-SFT.py (OLMo-core) builds it: the token and mask globs, OBFD,
    truncate, `generate_doc_lengths`."""
    from olmo_core.data import NumpyFSLDatasetConfig, NumpyPackedFSLDatasetConfig, TokenizerConfig
    from olmo_core.data.types import LongDocStrategy

    tok = TokenizerConfig(vocab_size=VOCAB, eos_token_id=EOS, pad_token_id=PAD)
    if not setup.sft:
        return NumpyFSLDatasetConfig(
            tokenizer=tok, paths=list(paths), sequence_length=setup.seq_len, work_dir=str(work)
        )
    directory = Path(paths[0]).parent
    return NumpyPackedFSLDatasetConfig(
        tokenizer=tok,
        paths=[f"{directory}/token_ids_part_*.npy"],
        label_mask_paths=[f"{directory}/labels_mask_*.npy"],
        expand_glob=True,
        generate_doc_lengths=True,
        long_doc_strategy=LongDocStrategy.truncate,
        sequence_length=setup.seq_len,
        work_dir=str(work),
    )


def batch_record(input_ids, label_mask=None, doc_lens=None) -> dict:
    """What a step trained on, comparable across the two loaders: the tokens, and in SFT the label
    mask and each token's document (doc_lens rows are padded with zeros to different widths)."""
    out = {"input_ids": np.asarray(input_ids, np.int32)}
    if label_mask is not None:
        out["label_mask"] = np.asarray(label_mask, bool)
        out["doc"] = np.stack([np.repeat(np.arange(len(row)), row) for row in np.asarray(doc_lens)])
    return out


def run_olmo_core(model, paths: list[str], setup: Setup, work: Path) -> Run:
    import torch
    from olmo_core.data import DataCollator, NumpyDataLoaderBase
    from olmo_core.data.utils import get_labels
    from olmo_core.optim import CosWithWarmup, LinearWithWarmup, SkipStepAdamW

    ds = olmo_core_dataset(paths, setup, work).build()
    ds.prepare()
    loader = NumpyDataLoaderBase.wrap_numpy_dataset(
        ds,
        global_batch_size=setup.global_batch * setup.seq_len,
        collator=DataCollator(pad_token_id=PAD),
        work_dir=str(work),
        seed=setup.seed,
        dp_world_size=1,
        dp_rank=0,
    )
    loader.reshuffle(epoch=1)
    if loader.total_batches < setup.steps:
        raise ValueError(f"the corpus holds {loader.total_batches} batches, fewer than --steps {setup.steps}")

    embed = [p for n, p in model.named_parameters() if n == "embeddings.weight"]
    rest = [p for n, p in model.named_parameters() if n != "embeddings.weight"]
    opt = SkipStepAdamW(
        [{"params": rest}, {"params": embed, "weight_decay": 0.0}],
        lr=setup.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        weight_decay=setup.weight_decay,
        rolling_interval_length=setup.skip_window,
    )
    if setup.sft:
        sched = LinearWithWarmup(warmup_fraction=0.03, alpha_f=0.0)
    else:
        sched = CosWithWarmup(warmup=setup.warmup, alpha_f=setup.alpha_f)
    params = list(model.parameters())
    run = Run()
    model.train()
    start = time.perf_counter()
    # One thread: a model this small gains nothing from more, and on busy shared cores torch's
    # threads spin and slow it down many times over (docs/training.md).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for step, batch in zip(range(1, setup.steps + 1), loader):
            if step == setup.spike_step:
                batch = {"input_ids": torch.from_numpy(spike_batch(setup)).long()}
            run.batches.append(batch_record(batch["input_ids"], batch.get("label_mask"), batch.get("doc_lens")))
            # TransformerTrainModule.train_batch + _prepare_batch (3.0.0): labels from the batch (its
            # label_mask -> -100), the rest of the batch (doc_lens, max_doc_lens, ...) as model kwargs
            labels = get_labels(batch)
            kwargs = {k: v for k, v in batch.items() if k != "input_ids"}
            opt.zero_grad(set_to_none=True)
            out = model(
                batch["input_ids"],
                labels=labels,
                loss_reduction="sum",
                z_loss_multiplier=setup.z_loss or None,
                loss_div_factor=(labels != -100).sum(),
                return_logits=False,
                **kwargs,
            )
            out.loss.backward()
            norm = torch.nn.utils.get_total_norm([p.grad for p in params])
            torch.nn.utils.clip_grads_with_norm_(params, 1.0, norm)
            lr = sched.get_lr(setup.lr, step, setup.steps)
            for group in opt.param_groups:
                group["lr"] = lr
            opt.latest_loss = out.ce_loss.detach()
            opt.latest_grad_norm = norm
            opt.step()
            run.ce.append(float(out.ce_loss))
            run.z.append(0.0 if out.z_loss is None else float(out.z_loss))
            run.grad_norm.append(float(norm))
            run.lr.append(float(lr))
            if float(opt.step_skipped):
                run.skipped.append(step)
    finally:
        torch.set_num_threads(threads)
    run.seconds = time.perf_counter() - start
    loader.reset()
    return run


# ----------------------------------------------------------------------------------------------
# olmax side


def olmax_experiment(model_cfg, paths: list[str], setup: Setup, work: Path):
    from dataclasses import replace

    from olmax.config import DataConfig, ExperimentConfig, MeshConfig, OptimizerConfig, ScheduleConfig, TrainerConfig
    from olmax.recipes import get_recipe

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
    from olmax.sharding import make_mesh
    from olmax.state import init_train_state
    from olmax.train_step import batch_sharding, make_train_step

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
            # what olmax.train sends the step: the tokens, and in SFT the doc_lens and label_mask
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
        from olmax.convert.train_parity_sft import run_olmo_core_ranks

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

            from olmax.convert.train_parity_sft import run_olmo_core_ranks

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
