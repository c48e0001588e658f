"""Named experiment presets (`--recipe NAME`). `get_recipe(name)` returns a frozen `ExperimentConfig`;
`resolve(recipe, config_file, overrides)` is the one path every command takes from its arguments to a
config.

Numbers are from OLMo-core 3.0.0's `TransformerConfig.olmo3_7B/32B` and the official OLMo 3 scripts
(src/scripts/official/OLMo3/OLMo-3-1025-7B-{pretrain-1,pretrain-2,midtrain,long-context}.py and the
32B scripts, cited where they are used).
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Callable, Optional

from olmax.config.checkpoint import CheckpointConfig, EvalConfig
from olmax.config.data import DataConfig
from olmax.config.dpo import DPOConfig
from olmax.config.experiment import ExperimentConfig
from olmax.config.grpo import GRPOConfig
from olmax.config.mesh import MeshConfig
from olmax.config.model import ModelConfig, SplashBlocks
from olmax.config.optimizer import OptimizerConfig
from olmax.config.remat import AUTO
from olmax.config.schedule import ScheduleConfig
from olmax.config.trainer import TrainerConfig
from olmax.errors import ConfigError

OLMO3_7B = ModelConfig()  # the defaults are the 7B

OLMO3_32B = replace(OLMO3_7B, d_model=5120, n_layers=64, n_heads=40, n_kv_heads=8, mlp_hidden=27648)

# Same parameters and FLOPs as the 7B, 16 heads of 256 (the MaxText write-up's +12.4% variant).
OLMO3_7B_HD256 = replace(OLMO3_7B, n_heads=16, n_kv_heads=16, head_dim=256)

# The embedded default: the real dolma2 vocabulary, a model small enough to train on 2 CPU cores.
TINY = replace(
    OLMO3_7B,
    d_model=128,
    n_layers=4,
    n_heads=4,
    n_kv_heads=2,
    head_dim=32,
    mlp_hidden=384,
    sliding_window=64,
    max_position=256,
    compute_dtype="float32",
)

# The benchmark config of docs/performance/cpu.md: fp32 everywhere, windows on 0-2 and 4-6.
BENCH_SMALL = replace(
    OLMO3_7B,
    d_model=512,
    n_layers=8,
    n_heads=8,
    n_kv_heads=8,
    head_dim=64,
    mlp_hidden=1536,
    sliding_window=512,
    max_position=1024,
    compute_dtype="float32",
    # not part of the spec: with two micro-batches (below), recomputing the whole block in the
    # backward pass ran as fast as keeping the matmul outputs and held 0.3 GiB less (docs/performance/cpu.md)
    remat="full",
)


# AI2's stage-1 run (OLMo-3-1025-7B-pretrain-1/-2.py): the cosine to 5e12 tokens up to step 596,047;
# -pretrain-2.py resumed from that step's checkpoint with HalfCosWithWarmup(warmup 597,046) to 7e12
# tokens, on its warmup ramp until step 597,046 (docs/reference.md); stopped after step 1,413,814.
STAGE1_SCHEDULE = ScheduleConfig(
    name="stitched_cosine",
    warmup_steps=2000,
    alpha_f=0.1,
    t_max_tokens=5 * 10**12,
    switch_step=596_048,
    half_cos_warmup=597_046,
    final_t_max_tokens=7 * 10**12,
)
STAGE1_DATA = DataConfig(seq_len=8192, max_target_seq_len=8192, seed=34521)  # enters the data fingerprint
# How the 7B/32B steps fit in device memory (not part of AI2's recipe; results do not depend on it),
# tuned as the MaxText OLMo 3 run was: up to 4 instances per forward/backward (the seeds' 4 per
# device at 512 instances on 128 devices, so no accumulation there; more devices, fewer per device),
# the output layer 1024 positions at a time, attention `auto` (splash on TPU, cuDNN on GPU), and
# model.remat=auto: each block keeps the most of its activations that the compiler fits in the HBM
# of the devices the run has, in the backward pass's order that fits (olmax.fit.remat_search). The sets
# it tries are those the sweep measured on the recipes' own slices (remat.AUTO_LADDER); what it
# chose on each slice, and what the search cost: docs/performance/recipes-on-slices.md ("`model.remat=auto` on the
# recipes' slices").
FIT = dict(micro_batch_size=4, loss_chunk=1024)
STAGE1_TRAINER = TrainerConfig(global_batch=512, max_steps=1_413_814, **FIT)


def _fit(model: ModelConfig) -> ModelConfig:
    return replace(model, remat=AUTO, attention="auto")


def _stage1(name: str, model: ModelConfig) -> ExperimentConfig:
    return ExperimentConfig(
        name=name, model=_fit(model), data=STAGE1_DATA, schedule=STAGE1_SCHEDULE, trainer=STAGE1_TRAINER
    )


def _olmo3_7b_hd256() -> ExperimentConfig:
    return _stage1("olmo3_7b_hd256", OLMO3_7B_HD256)


# Stage 1 by name (`olmo3_7b` and `olmo3_32b` are the stage-1 recipes under their short names). The overrides
# `schedule.name=cosine schedule.t_max_tokens=7000000000000` turn its stitched schedule into the
# MaxText reproduction's single cosine (warmup 2000, to 0.1 x lr at ceil(7e12 / 4194304) = 1,668,931).
def _olmo3_7b_stage1(name: str = "olmo3_7b_stage1") -> ExperimentConfig:
    return _stage1(name, OLMO3_7B)


# The 32B's stage 1 (OLMo-3-1025-32B-pretrain.py, OLMo-core's src/scripts/official/OLMo3/): 8192 tokens,
# GLOBAL_BATCH_SIZE 8 * 1024 * 1024 tokens = 1024 instances, LR 6e-4, CosWithWarmup(warmup 2000, alpha_f
# 0.1) over max_duration Duration.epochs(1) of OLMo-mix-0925-official: 3.0.0's trainer takes that
# duration's max_steps, the cosine's t_max, from its loader's batches per epoch, here
# schedule.t_max_epochs=1. Loader seed 34521, max_target_sequence_length 8192 and the n-gram instance
# filter (13/1/32). The script runs to the epoch's end; AI2's stage 2 loads step 656,000
# (stego32-highlr-filter3/step656000 in both midtraining ingredients), where this recipe stops.
STAGE1_32B_LR = 6e-4


def _olmo3_32b_stage1(name: str = "olmo3_32b_stage1") -> ExperimentConfig:
    return ExperimentConfig(
        name=name,
        # 2 instances per device on v5p 8x8x8 in one forward/backward
        model=_fit(OLMO3_32B),
        data=DataConfig(seq_len=8192, max_target_seq_len=8192, seed=34521, instance_filter=True),
        optimizer=OptimizerConfig(lr=STAGE1_32B_LR),
        schedule=ScheduleConfig(name="cosine", warmup_steps=2000, alpha_f=0.1, t_max_epochs=1),
        trainer=TrainerConfig(global_batch=1024, max_steps=656_000, **FIT),
    )


# Stage 2, midtraining on Dolmino (OLMo-3-1025-7B-midtrain.py): 256 x 8192 = 2^21 tokens per step,
# 100B tokens = 47,684 steps, linear to 0 with no warmup, seed 1337, max_target_sequence_length 8192.
# AI2 started it from the stage-1 weights and Adam moments: `olmax ckpt warm-start STAGE1 DST --keep
# params,moments --reset-step`, then set checkpoint.init_from=DST and data.paths to the Dolmino mix.
# The long-context script (OLMo-3-1025-7B-long-context.py) sets the same LR.
MIDTRAIN_LR = 2.0712352850360292e-4


def _olmo3_7b_stage2() -> ExperimentConfig:
    return ExperimentConfig(
        name="olmo3_7b_stage2",
        # 2 instances per device on Ironwood 4x4x4
        model=_fit(OLMO3_7B),
        data=DataConfig(seq_len=8192, max_target_seq_len=8192, seed=1337),  # enters the data fingerprint
        optimizer=OptimizerConfig(lr=MIDTRAIN_LR),
        schedule=ScheduleConfig(name="linear", warmup_steps=0, alpha_f=0.0),
        trainer=TrainerConfig(global_batch=256, max_steps=47_684, **FIT),
    )


# Stage 3, long context (OLMo-3-1025-7B-long-context.py): 64 x 65536 = 2^22 tokens per step, YaRN
# factor 8 from the 8192 context, linear to 0 after 200 warmup steps, seed 34521, started from the
# stage-2 checkpoint (checkpoint.init_from; data.paths = the long-context mix). AI2's released
# stage-3 checkpoint is step 11,921 = ceil(50e9 / 2^22): 50B tokens. The data as AI2 packed it:
# whole documents, best-fit decreasing within groups of 8 files in a shuffled file order
# (NumpyPackedFSLDatasetConfig), attention within each document, RoPE positions absolute across the
# instance (3.0.0 does not reset them under context parallelism; docs/reference.md).
STAGE3_DATA = DataConfig(
    seq_len=65536,
    seed=34521,
    packing="obfd",
    source_group_size=8,
    source_permutation_seed=123,
    doc_masking=True,
)
# 64 instances are fewer than the 128 devices of an Ironwood 4x4x4 slice, so a context axis of 2
# splits every sequence: 32,768 tokens per device, as in stage 1 (4 x 8192), where keeping the q/k/v
# projections and more fits (docs/performance/remat.md). AI2 ran context 8 on 256 H100s (docs/training.md).
STAGE3_MESH = MeshConfig(data=1, fsdp=-1, context=2, tensor=1)


def _long_context(model: ModelConfig) -> ModelConfig:
    """A stage-3 model: YaRN factor 8 from the 8192 context (beta_fast 32, beta_slow 1: ModelConfig's
    defaults) to 65,536 positions, absolute across a packed instance."""
    return replace(
        _fit(model),
        rope_type="yarn",
        yarn_factor=8.0,
        yarn_original_max_position=8192,
        max_position=65536,
        rope_positions="absolute",
    )


def _olmo3_7b_stage3() -> ExperimentConfig:
    return ExperimentConfig(
        name="olmo3_7b_stage3",
        # 32,768 tokens per device on Ironwood 4x4x4
        model=_long_context(OLMO3_7B),
        data=STAGE3_DATA,
        optimizer=OptimizerConfig(lr=MIDTRAIN_LR),
        schedule=ScheduleConfig(name="linear", warmup_steps=200, alpha_f=0.0),
        trainer=TrainerConfig(global_batch=64, max_steps=11_921, **FIT),
        mesh=STAGE3_MESH,
    )


# The 32B after stage 1 (OLMo-core's src/scripts/official/OLMo3/, read at the repository's main branch;
# OLMo-3-1025-32B.csv lists the checkpoints each stage wrote).
#
# Stage 2 is two midtraining runs, the "ingredients" (OLMo-3-1025-32B-midtrain-ingredient-1.py and -2.py),
# whose final checkpoints AI2 averaged into one. The two scripts differ only in the data mix
# (OLMo-midtraining-mix-0925-ingredient1-100B / -ingredient2-100B), so here they are one recipe run twice
# with data.paths set to each mix. Both: 8192 tokens, GLOBAL_BATCH_SIZE 4 * 1024 * 1024 tokens = 512
# instances, MAX_TOKENS 100e9 = ceil(1e11 / 2^22) = 23,842 steps (the csv's last ingredient step),
# LR 0.0002071235285 linear to 0 with no warmup, loader seed 42069, the n-gram instance filter
# (InstanceFilterConfig 13/1/32, olmax's data.instance_filter) and max_target_sequence_length 8192; the
# stage-1 weights and optimizer state, not its trainer state (load_optim_state=True,
# load_trainer_state=False: `olmax ckpt warm-start STAGE1 DST --keep params,moments --reset-step`).
MIDTRAIN_32B_LR = 0.0002071235285  # the 32B scripts' literal, 3.6e-15 below the 7B's MIDTRAIN_LR


def _olmo3_32b_stage2() -> ExperimentConfig:
    return ExperimentConfig(
        name="olmo3_32b_stage2",
        # 1 instance per device on v5p 8x8x8
        model=_fit(OLMO3_32B),
        data=DataConfig(seq_len=8192, max_target_seq_len=8192, seed=42069, instance_filter=True),
        optimizer=OptimizerConfig(lr=MIDTRAIN_32B_LR),
        schedule=ScheduleConfig(name="linear", warmup_steps=0, alpha_f=0.0),
        trainer=TrainerConfig(global_batch=512, max_steps=23_842, **FIT),
    )


# Stage 3, long context (OLMo-3-1025-32B-long-context.py), started from the soup of the two stage-2
# ingredients (its commented load_path, stego32-midtraining-runs-merged-step23842, and the csv) with
# its optimizer state: 65,536 tokens, GLOBAL_BATCH_SIZE 8 * 1024 * 1024 tokens = 128 instances,
# MAX_TOKENS 100e9 = ceil(1e11 / 2^23) = 11,921 steps (the csv's last stage-3 step), LR 0.0002071235285
# linear to 0 after 200 warmup steps, loader seed 34521, YaRN factor 8 (beta_fast 32, beta_slow 1) from
# 8192, and the 7B stage 3's packed data (NumpyPackedFSLDatasetConfig: OBFD, generate_doc_lengths,
# source_group_size 8, source_permutation_seed 123), here WITH the instance filter (the 7B stage 3 has
# none). Positions stay absolute across a packed instance: AI2 ran it under context parallelism, where
# 3.0.0 does not restart them per document (docs/reference.md). 128 instances on a 512-device v5p 8x8x8
# slice: one instance per fsdp shard, its 65,536 tokens split over a context axis of 4 (16,384 per
# device; AI2 ran context 8 on GPUs). The saved block inputs are then a quarter of what a tensor axis
# (which does not split the sequence) leaves, so keeping activations fits where tensor=4 needed remat full.
def _olmo3_32b_stage3() -> ExperimentConfig:
    return ExperimentConfig(
        name="olmo3_32b_stage3",
        # 16,384 tokens per device on v5p 8x8x8
        model=_long_context(OLMO3_32B),
        data=replace(STAGE3_DATA, instance_filter=True),
        optimizer=OptimizerConfig(lr=MIDTRAIN_32B_LR),
        schedule=ScheduleConfig(name="linear", warmup_steps=200, alpha_f=0.0),
        trainer=TrainerConfig(global_batch=128, max_steps=11_921, **FIT),
        mesh=MeshConfig(data=1, fsdp=-1, context=4, tensor=1),
    )


# SFT (OLMo-core's src/scripts/train/sft/Olmo-3-7B-SFT.py and Olmo-3-32B-SFT.py, as open-instruct's
# scripts/train/olmo3/{7b,32b}_{think,instruct}_sft.sh override them): 32,768 tokens, OBFD-packed
# conversations with their label masks and attention within each (NumpyPackedFSLDataset, truncate,
# generate_doc_lengths, label_mask_paths), loader seed 34521, SkipStepAdamW betas (0.9, 0.95) with
# weight decay 0, clip 1.0, no z-loss, LinearWithWarmup(warmup_fraction=0.03, alpha_f=0) over 2 epochs
# (--trainer.max_duration.value=2), from the long-context checkpoint (YaRN factor 8 on the full-attention
# layers). Per step: 7B 1,048,576 tokens = 32 instances, 32B 4,194,304 = 128. Learning rates: 7B Think
# 5e-5, 7B Instruct 8e-5, 32B Think 1e-4, 32B Instruct 8e-5. The schedule's horizon and the run's end
# are 2 epochs of the data (schedule.t_max_epochs, trainer.max_steps=null): 2 x `batches_per_epoch` of
# `olmax data order` (docs/post-training/sft.md; memory on AI2's 64 H100s measured there). The loss is
# normalised as OLMo-core's train module does it, per data-parallel rank of AI2's runs (7B Think: 64
# H100s with context parallel 2 = 32 ranks of one instance; 7B Instruct: 32 H100s = 16 ranks of two);
# the 32B runs' layouts are not published with the scripts, so those keep the global count.
SFT_DATA = DataConfig(seq_len=32768, seed=34521, packing="obfd", doc_masking=True, label_masks=True)
SFT_SCHEDULE = ScheduleConfig(name="linear", warmup_steps=0, warmup_fraction=0.03, alpha_f=0.0, t_max_epochs=2)


def _sft(
    name: str, model: ModelConfig, lr: float, global_batch: int, context: int, ranks: Optional[int] = None
) -> ExperimentConfig:
    per_rank = {"loss_normalisation": "per_rank", "loss_ranks": ranks} if ranks else {}
    return ExperimentConfig(
        name=name,
        model=_long_context(model),
        data=SFT_DATA,
        optimizer=OptimizerConfig(lr=lr, weight_decay=0.0, z_loss=0.0),  # b1 0.9, b2 0.95, clip 1.0: the defaults
        schedule=SFT_SCHEDULE,
        trainer=TrainerConfig(global_batch=global_batch, max_steps=None, **FIT, **per_rank),
        mesh=MeshConfig(data=1, fsdp=-1, context=context, tensor=1),
    )


# DPO (open-instruct dpo_tune_cache.py / dpo_utils.py, the first versions of scripts/train/olmo3/
# {7b,32b}_{think,instruct}_dpo.sh): dpo_norm with beta 5, 1 epoch, a linear schedule with 10% warmup to
# 0, 128 pairs per step, torch AdamW at its defaults (betas 0.9/0.999, eps 1e-8) with weight decay 0,
# reference log-probs cached from the SFT model. 7B: sequences of 16,384 tokens, 1 pair per GPU x 4
# accumulation steps x 32 GPUs; lr 8e-8 Think, 1e-6 Instruct. 32B (scripts added in 3af17aa and
# ff4a925, run at 2fd104e): sequences of 8,192; Think 1 pair per GPU x 128 GPUs (16 nodes), lr swept
# over 7e-8, 8e-8 and 9e-8 in one script (which the release kept is not in it: the middle one here);
# Instruct 1 pair x 2 accumulation steps x 64 GPUs (8 nodes), lr 1e-6. Clipping at 1.0 is olmax's
# default (not checked against the release scripts); no skip-step (plain AdamW). Start from the SFT
# checkpoint (checkpoint.init_from); the run ends after one epoch of the pairs (trainer.max_steps=null).
DPO_SCHEDULE = ScheduleConfig(name="linear", warmup_steps=0, warmup_fraction=0.1, alpha_f=0.0, t_max_epochs=1)


def _dpo(name: str, model: ModelConfig, seq_len: int, lr: float) -> ExperimentConfig:
    return ExperimentConfig(
        name=name,
        model=_long_context(model),  # the SFT model's
        data=DataConfig(seq_len=seq_len),
        optimizer=OptimizerConfig(lr=lr, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0, z_loss=0.0, skip_step=False),
        schedule=DPO_SCHEDULE,
        # one pair (two sequences) per device and forward, as AI2 ran it
        trainer=TrainerConfig(global_batch=128, micro_batch_size=1, loss_chunk=1024, max_steps=None, objective="dpo"),
        mesh=MeshConfig(data=1, fsdp=-1, context=1, tensor=1),
        dpo=DPOConfig(loss_type="dpo_norm", beta=5.0),
    )


# GRPO, AI2's OlmoRL (open-instruct grpo_fast.py at 42aa63c / 9ade62d, run by
# scripts/train/olmo3/7b_{think,instruct}_rl.sh as committed in 3af17aa; docs/post-training/rl-recipes.md, "GRPO"):
# from the DPO model (the long-context architecture), lr 1e-6 constant with no warmup
# (--lr_scheduler_type constant), torch AdamW as grpo_fast.py builds it (`torch.optim.AdamW(params,
# lr)`: betas 0.9/0.999, eps 1e-8; Args.weight_decay 0.0 on both parameter groups), DeepSpeed's
# gradient clipping at 1.0 (utils.get_train_ds_config's max_norm default; grpo_fast.py passes none), no
# skip-step, no z-loss. A packed row is --pack_length tokens (data.seq_len): prompt + response sequences
# with attention within each and positions restarting at 0 in each (rl_utils.pack_sequences'
# attention_masks and reset_position_ids), hence doc_masking and rope_positions=document.
# Rows per optimizer step (trainer.global_batch) are the most a rollout can make: every prompt +
# response fits a row (pack_length >= prompt + response), so at most one row per response, 64 x 8 = 512
# per rollout, split over grpo.mini_batches optimizer steps; the RL loop fills the rest with empty rows.
# One row per device and forward (--per_device_train_batch_size 1). trainer.max_steps: the scripts'
# --total_episodes / 512 rollouts x mini-batches (7B Think 10,000,000, 7B Instruct 1,024,000,
# the 32B's 10,000,000 episodes).
# The rows are 35,840, 19,456 or 11,264 tokens, multiples of 1024 but not 2048: splash tiles of 1024.
RL_SPLASH = SplashBlocks(q=1024, kv=1024, kv_compute=1024)


def _rl(
    name: str, model: ModelConfig, seq_len: int, rl: GRPOConfig, episodes: int, lr: float = 1e-6
) -> ExperimentConfig:
    rollout = rl.prompts_per_step * rl.samples_per_prompt
    # AI2's lag: the four scripts run `--async_steps 8 --inflight_updates true`, the learner taking the
    # groups its vLLM engines finish, in the order they finish (open-instruct grpo_fast.py at 42aa63c):
    # tokens up to 8 rollouts old, corrected by TIS where the run caps it
    rl = replace(rl, rollout_engine="continuous", max_staleness=8, read_order="completion")
    return ExperimentConfig(
        name=name,
        model=replace(_long_context(model), rope_positions="document", splash_blocks=RL_SPLASH),
        data=DataConfig(seq_len=seq_len, doc_masking=True),
        optimizer=OptimizerConfig(lr=lr, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0, z_loss=0.0, skip_step=False),
        schedule=ScheduleConfig(name="constant", warmup_steps=0),
        trainer=TrainerConfig(
            global_batch=rollout // rl.mini_batches,
            micro_batch_size=1,
            loss_chunk=1024,
            max_steps=episodes // rollout * rl.mini_batches,
            objective="grpo",
        ),
        mesh=MeshConfig(data=1, fsdp=-1, context=1, tensor=1),
        grpo=rl,
    )


# The sampler holds the KV cache of every row it samples at once: a step's 64 x 8 rows at AI2's shapes
# need 368 GiB (Instruct) and 1,156 GiB (Think) per H100 of a node, while on an Ironwood 4x4x4 slice
# both whole steps fit one program. So grpo.sample_prompts is left `auto` (the default): the run
# compiles its rollout on its own devices and samples the most prompts at a time that fit (one node of
# H100s: 7B Instruct 8, 7B Think 2; Ironwood 4x4x4: all 64; docs/post-training/rl-recipes.md, "Recipes").
# Think: 32,768-token responses in 35,840-token rows, TIS capped at 2, one optimizer step per rollout
# (old log-probs = the step's own), no active sampling; prompts rendered with open-instruct's
# olmo_thinker (--chat_template_name in 7b_think_rl.sh and 32b_think_rl.sh at e6c3044): think_dpo_rl.
THINK_RL = GRPOConfig(
    max_prompt_len=2048, max_response_len=32_768, tis_cap=2.0, mini_batches=1, template="think_dpo_rl"
)
# Instruct: 8,192-token responses in 11,264-token rows, no TIS, 4 optimizer steps per rollout, active
# sampling with prompts solved at >= 7 of 8 not sampled again, responses also stopped at "</answer>".
INSTRUCT_RL = GRPOConfig(
    max_prompt_len=2048,
    max_response_len=8192,
    mini_batches=4,
    active_sampling=True,
    no_resampling_pass_rate=0.875,
    stop=("</answer>",),
)
# The 32B (scripts/train/olmo3/32b_think_rl.sh as committed in 3af17aa, run at 42aa63c;
# 32b_instruct_rl.sh as committed in ff4a925, run at 8d8232c, whose open_instruct/ is 9ade62d's): the 7B's
# loss and optimizer at lr 2e-6, both with TIS capped at 2, active sampling without a solve-rate cut,
# one optimizer step per rollout, 10,000,000 episodes. Think: 32,768-token responses in 35,840-token
# rows; Instruct: 16,384 in 19,456 (19 x 1024), no stop string. AI2's learners: 96 GPUs (Think) and 32
# (Instruct); 512 rows do not divide 96 devices, so there trainer.global_batch=576 (empty rows fill it).
THINK_32B_RL = replace(THINK_RL, active_sampling=True)
INSTRUCT_32B_RL = GRPOConfig(
    max_prompt_len=2048, max_response_len=16_384, tis_cap=2.0, mini_batches=1, active_sampling=True
)


def _tiny() -> ExperimentConfig:
    # A high learning rate and a short warmup so the loss falls by several nats in 30 steps on CPU;
    # global batch 8 divides by 8 devices, so resume and resize show on the demo itself. The output
    # layer over 100k tokens dominates the step on CPU: loss_chunk=16 keeps its logits in cache-size blocks.
    return ExperimentConfig(
        name="tiny",
        model=TINY,
        data=DataConfig(paths=("demo",), seq_len=256, seed=34521),
        optimizer=OptimizerConfig(lr=3e-3),
        schedule=ScheduleConfig(warmup_steps=5),
        trainer=TrainerConfig(global_batch=8, max_steps=40, loss_chunk=16),
        checkpoint=CheckpointConfig(every=10, keep=2),
        eval=EvalConfig(every=10, batches=4, data=("demo:heldout",)),
        mesh=MeshConfig(data=1, fsdp=-1, tensor=1),
    )


def _tiny_sft() -> ExperimentConfig:
    # `olmax demo chat`'s SFT stage: the SFT recipes' data handling and optimizer (OBFD packing, document
    # masks, label masks, weight decay 0, no z-loss, linear schedule with 3% warmup to 0) on the tiny model,
    # from the tiny demo's checkpoint. A fixed step count instead of epochs: about 9 epochs of the shipped
    # chat corpus (olmax.data.chat_corpus, 64,544 tokens in about 32 batches), which the demo tokenizes
    # into data.paths. The tiny demo's learning rate: at 1e-3 and 100 steps the model had not learnt to
    # copy the operands.
    return replace(
        _tiny(),
        name="tiny_sft",
        data=DataConfig(seq_len=256, seed=34521, packing="obfd", doc_masking=True, label_masks=True),
        optimizer=OptimizerConfig(lr=3e-3, weight_decay=0.0, z_loss=0.0),
        schedule=ScheduleConfig(name="linear", warmup_steps=0, warmup_fraction=0.03, alpha_f=0.0),
        trainer=TrainerConfig(global_batch=8, max_steps=300, loss_chunk=16),
        checkpoint=CheckpointConfig(every=100, keep=1),
        eval=EvalConfig(every=0),
    )


def _tiny_dpo() -> ExperimentConfig:
    # `olmax demo chat`'s DPO stage: the DPO recipes' loss (dpo_norm, beta 5), optimizer (torch AdamW
    # defaults, weight decay 0, no skip-step) and schedule (linear, 10% warmup, to 0) on the tiny model, from
    # the SFT stage's checkpoint; 8 pairs per step. The learning rate is the tiny model's, not AI2's: on the
    # held-out pairs 2e-5 reached a preference accuracy of 0.54, 5e-5 0.58, 1e-4 0.70 (docs/post-training/demo-chat.md).
    return replace(
        _tiny(),
        name="tiny_dpo",
        data=DataConfig(seq_len=128, seed=34521),
        optimizer=OptimizerConfig(lr=1e-4, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0, z_loss=0.0, skip_step=False),
        schedule=ScheduleConfig(name="linear", warmup_steps=0, warmup_fraction=0.1, alpha_f=0.0),
        trainer=TrainerConfig(global_batch=8, max_steps=60, loss_chunk=16, objective="dpo"),
        checkpoint=CheckpointConfig(every=30, keep=1),
        eval=EvalConfig(every=0),
        dpo=DPOConfig(loss_type="dpo_norm", beta=5.0),
    )


def _tiny_grpo() -> ExperimentConfig:
    # The CPU demo's RL stage: the RL recipes' optimizer (torch AdamW defaults, weight decay 0, clip 1.0, no
    # skip-step), constant schedule and GRPO loss (clip 0.2 / 0.272, centred advantages) on the tiny model,
    # from the DPO stage's checkpoint. 8 prompts x 8 samples, each prompt + response in a packed row of
    # 256: the demo's samples (a 45-token prompt, a 17-token answer) pack four to a row, so 16 rows per
    # step hold them (longer answers leave rows out, counted as rollout/rows_dropped); every row costs a
    # full forward and backward, padding or not. The learning rate is the tiny model's, not AI2's: after 40
    # steps at 3e-5 the policy boxed 53 of 79 held-out answers, at 1e-4 all 79 (docs/post-training/demo-chat.md).
    rl = GRPOConfig(prompts_per_step=8, samples_per_prompt=8, max_prompt_len=64, max_response_len=128)
    return replace(
        _tiny(),
        name="tiny_grpo",
        model=replace(TINY, rope_positions="document"),
        data=DataConfig(seq_len=256, seed=34521, doc_masking=True),
        optimizer=OptimizerConfig(lr=1e-4, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0, z_loss=0.0, skip_step=False),
        schedule=ScheduleConfig(name="constant", warmup_steps=0),
        trainer=TrainerConfig(global_batch=16, max_steps=40, loss_chunk=16, objective="grpo"),
        checkpoint=CheckpointConfig(every=20, keep=1),
        eval=EvalConfig(every=0),
        grpo=rl,
    )


def _bench_small() -> ExperimentConfig:
    # The benchmark spec (docs/performance/cpu.md): plain AdamW (no skip-step; the defaults' decay mask,
    # clipping and z-loss), global batch 4 x 1024. Two micro-batches of 2 and loss_chunk 128: faster
    # and smaller on CPU than one batch of 4 (docs/performance/cpu.md). The loss sums are divided by the
    # whole batch's token count, so the gradient is that of one batch of 4.
    return ExperimentConfig(
        name="bench-small",
        model=BENCH_SMALL,
        data=DataConfig(seq_len=1024),
        optimizer=OptimizerConfig(skip_step=False),
        schedule=ScheduleConfig(name="constant", warmup_steps=0),
        trainer=TrainerConfig(global_batch=4, micro_batch_size=2, max_steps=13, loss_chunk=128),
    )


RECIPES: dict[str, Callable[[], ExperimentConfig]] = {
    "olmo3_7b": functools.partial(_olmo3_7b_stage1, "olmo3_7b"),
    "olmo3_32b": functools.partial(_olmo3_32b_stage1, "olmo3_32b"),
    "olmo3_7b_hd256": _olmo3_7b_hd256,
    "olmo3_7b_stage1": _olmo3_7b_stage1,
    "olmo3_7b_stage2": _olmo3_7b_stage2,
    "olmo3_7b_stage3": _olmo3_7b_stage3,
    "olmo3_32b_stage1": _olmo3_32b_stage1,
    "tiny": _tiny,
    "tiny_sft": _tiny_sft,
    "tiny_dpo": _tiny_dpo,
    "tiny_grpo": _tiny_grpo,
    "bench-small": _bench_small,
    "olmo3_32b_stage2": _olmo3_32b_stage2,
    "olmo3_32b_stage3": _olmo3_32b_stage3,
    "olmo3_7b_think_sft": functools.partial(_sft, "olmo3_7b_think_sft", OLMO3_7B, 5e-5, 32, 4, 32),
    "olmo3_7b_instruct_sft": functools.partial(_sft, "olmo3_7b_instruct_sft", OLMO3_7B, 8e-5, 32, 4, 16),
    "olmo3_32b_think_sft": functools.partial(_sft, "olmo3_32b_think_sft", OLMO3_32B, 1e-4, 128, 4),
    "olmo3_32b_instruct_sft": functools.partial(_sft, "olmo3_32b_instruct_sft", OLMO3_32B, 8e-5, 128, 4),
    "olmo3_7b_think_dpo": functools.partial(_dpo, "olmo3_7b_think_dpo", OLMO3_7B, 16384, 8e-8),
    "olmo3_7b_instruct_dpo": functools.partial(_dpo, "olmo3_7b_instruct_dpo", OLMO3_7B, 16384, 1e-6),
    "olmo3_32b_think_dpo": functools.partial(_dpo, "olmo3_32b_think_dpo", OLMO3_32B, 8192, 8e-8),
    "olmo3_32b_instruct_dpo": functools.partial(_dpo, "olmo3_32b_instruct_dpo", OLMO3_32B, 8192, 1e-6),
    "olmo3_7b_think_rl": functools.partial(_rl, "olmo3_7b_think_rl", OLMO3_7B, 35_840, THINK_RL, 10_000_000),
    "olmo3_7b_instruct_rl": functools.partial(_rl, "olmo3_7b_instruct_rl", OLMO3_7B, 11_264, INSTRUCT_RL, 1_024_000),
    "olmo3_32b_think_rl": functools.partial(
        _rl, "olmo3_32b_think_rl", OLMO3_32B, 35_840, THINK_32B_RL, 10_000_000, 2e-6
    ),
    "olmo3_32b_instruct_rl": functools.partial(
        _rl, "olmo3_32b_instruct_rl", OLMO3_32B, 19_456, INSTRUCT_32B_RL, 10_000_000, 2e-6
    ),
}


def get_recipe(name: str) -> ExperimentConfig:
    if name not in RECIPES:
        raise ConfigError(f"unknown recipe {name!r}; known: {', '.join(RECIPES)}")
    return RECIPES[name]()


def resolve(
    recipe: str | None, config_file: str | None, overrides: list[str] | tuple[str, ...] = ()
) -> ExperimentConfig:
    """The experiment config a command runs: a recipe or a YAML file, then dotted overrides."""
    from olmax.config.io import apply_overrides, load_yaml

    if (recipe is None) == (config_file is None):
        raise ConfigError("give exactly one of --recipe NAME or --config FILE")
    cfg = get_recipe(recipe) if recipe is not None else load_yaml(config_file)
    return apply_overrides(cfg, overrides)
