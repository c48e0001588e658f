"""SFT loss: labels under a label mask as OLMo-core 3.0.0's `get_labels`, the train step's CE over the
masked targets only (one step, the LM objective with the mask), and the size of the difference between
olmax's global normalisation and OLMo-core's per-rank one on an SFT-shaped batch (docs/post-training.md)."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from models import STEP_MODEL
from test_sft_data import conversations, sft_cfg

from olmax.config import DataConfig, ExperimentConfig, MeshConfig, TrainerConfig
from olmax.data.chat_files import tokenize_chat
from olmax.data.loader import make_loader
from olmax.loss import IGNORE, loss_denominator, loss_sums, make_labels
from olmax.model.olmo3 import forward_hidden, init_params, lm_head
from olmax.sharding import make_mesh
from olmax.state import init_train_state
from olmax.train_step import make_train_step

PAD = 3


def _batch(b=4, t=16, vocab=250, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(4, vocab, (b, t), dtype=np.int32)
    ids[1, 11:] = PAD
    mask = rng.random((b, t)) < 0.6
    mask[1, 11:] = False  # padding is never trained
    mask[3] = False  # an instance with nothing to train on
    return ids, mask


@pytest.mark.parity
def test_labels_with_label_mask_match_olmo_core():
    import torch
    from olmo_core.data.utils import get_labels

    ids, mask = _batch()
    keep = np.array([True, True, False, True])
    ref = get_labels(
        {
            "input_ids": torch.from_numpy(ids).long(),
            "label_mask": torch.from_numpy(mask),
            "instance_mask": torch.from_numpy(keep),
        }
    )
    ours = make_labels(jnp.asarray(ids), label_mask=jnp.asarray(mask), instance_mask=jnp.asarray(keep))
    np.testing.assert_array_equal(np.asarray(ours), ref.numpy())


def test_train_step_ce_is_over_the_masked_targets_only():
    cfg = ExperimentConfig(
        name="sft-step",
        model=STEP_MODEL,
        data=DataConfig(seq_len=16, pad_token_id=PAD, packing="obfd", label_masks=True),
        trainer=TrainerConfig(global_batch=4, micro_batch_size=2, max_steps=2, loss_chunk=8),
        mesh=MeshConfig(data=1, fsdp=1, tensor=1),
    )
    ids, mask = _batch()
    params = jax.jit(init_params, static_argnums=0)(cfg.model, jax.random.key(0))
    labels = make_labels(jnp.asarray(ids), pad_token_id=PAD, label_mask=jnp.asarray(mask))
    ce, _ = loss_sums(lm_head(params, forward_hidden(params, jnp.asarray(ids), cfg.model), cfg.model), labels)
    count = float(loss_denominator(labels))
    assert count == int(mask[:, 1:].sum())  # the label at t is token t + 1, trained when its mask is
    mesh = make_mesh(cfg.mesh, jax.devices()[:1])
    with jax.set_mesh(mesh):
        state = init_train_state(cfg, mesh, jax.random.key(0), params=jax.device_get(params))
        step = make_train_step(cfg, mesh)
        _, metrics = step(state, {"input_ids": ids, "label_mask": mask})
        np.testing.assert_allclose(float(metrics["ce_loss"]), float(ce) / count, rtol=1e-6)
        state = init_train_state(cfg, mesh, jax.random.key(0), params=jax.device_get(params))
        with pytest.raises(ValueError, match="no 'label_mask'"):
            step(state, {"input_ids": ids})
    assert (np.asarray(labels)[~np.roll(mask, -1, axis=1)] == IGNORE).all()


def test_per_rank_normalisation_on_an_sft_batch(tmp_path):
    """OLMo-core divides each rank's CE sum by that rank's own count of loss tokens and averages the
    ranks; olmax divides the global sum by the global count. Token t of rank r then weighs
    N / (D n_r) times what it weighs in olmax (N: global count, n_r: rank r's, D ranks). On packed
    conversations (16 instances of 256 tokens) with one instance per rank (AI2's 7B Think layout: 32
    instances over 32 data-parallel ranks) and two (7B Instruct: 16 ranks), the weights and the share
    of the loss's weight that moves between ranks, 1/2 sum_r |n_r / N - 1 / D|."""
    src = tmp_path / "sft.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in conversations(200, seed=1)))
    tokenize_chat([src], tmp_path / "tokens", "instruct", shard_tokens=1 << 20)
    batch = next(iter(make_loader(sft_cfg(tmp_path / "tokens", tmp_path / "w"), 16)))
    labels = np.asarray(make_labels(jnp.asarray(batch["input_ids"]), label_mask=jnp.asarray(batch["label_mask"])))
    per_instance = (labels != IGNORE).sum(axis=1)
    measured = {}
    for per_rank in (1, 2):
        n = per_instance.reshape(-1, per_rank).sum(axis=1)
        d = len(n)
        weight = n.sum() / (d * n)
        moved = 0.5 * np.abs(n / n.sum() - 1 / d).sum()
        measured[per_rank] = (round(float(weight.min()), 2), round(float(weight.max()), 2), round(float(moved), 3))
    print(f"trained tokens per instance {per_instance.tolist()}; (min weight, max weight, moved): {measured}")
    assert measured == {1: (0.5, 1.46, 0.114), 2: (0.71, 1.36, 0.073)}


@pytest.mark.parametrize(
    "name,lr,global_batch",
    [
        ("olmo3_7b_think_sft", 5e-5, 32),
        ("olmo3_7b_instruct_sft", 8e-5, 32),
        ("olmo3_32b_think_sft", 1e-4, 128),
        ("olmo3_32b_instruct_sft", 8e-5, 128),
    ],
)
def test_sft_recipes(name, lr, global_batch):
    """AI2's numbers (OLMo-core src/scripts/train/sft/, open-instruct scripts/train/olmo3/*_sft.sh)."""
    from olmax.recipes import get_recipe

    cfg = get_recipe(name)
    assert (cfg.optimizer.lr, cfg.trainer.global_batch * cfg.data.seq_len) == (lr, global_batch * 32768)
    o, s, d, m = cfg.optimizer, cfg.schedule, cfg.data, cfg.model
    assert (o.b1, o.b2, o.weight_decay, o.max_grad_norm, o.z_loss, o.skip_step) == (0.9, 0.95, 0.0, 1.0, 0.0, True)
    assert (s.name, s.warmup_steps, s.warmup_fraction, s.alpha_f, s.t_max_epochs) == ("linear", 0, 0.03, 0.0, 2)
    assert (d.seed, d.packing, d.long_doc_strategy, d.doc_masking, d.label_masks) == (
        34521,
        "obfd",
        "truncate",
        True,
        True,
    )
    assert (m.rope_type, m.yarn_factor, m.yarn_original_max_position, m.yarn_layers) == ("yarn", 8.0, 8192, "global")
    assert (m.yarn_beta_fast, m.yarn_beta_slow, m.sliding_window) == (32, 1, 4096)
