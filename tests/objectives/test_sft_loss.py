"""SFT loss: labels under a label mask as OLMo-core 3.0.0's `get_labels`, the train step's CE over the
masked targets only (one step, the LM objective with the mask), the size of the difference between
olmax's global normalisation and OLMo-core's per-rank one on an SFT-shaped batch, and
trainer.loss_normalisation=per_rank: the mean of per-rank means on any mesh (docs/post-training/sft.md)."""

from __future__ import annotations

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from models import STEP_MODEL
from sft_rows import conversations, sft_cfg

from olmax.config.data import DataConfig
from olmax.config.experiment import ExperimentConfig
from olmax.config.mesh import MeshConfig
from olmax.config.trainer import TrainerConfig
from olmax.data.chat_files import tokenize_chat
from olmax.data.loader import make_loader
from olmax.data.order import batch_ids, rank_ids
from olmax.errors import ConfigError
from olmax.model.olmo3 import forward_hidden, init_params, lm_head
from olmax.model.sharding import make_mesh
from olmax.objectives.cross_entropy import IGNORE, loss_denominator, loss_sums, make_labels
from olmax.objectives.lm import loss_rank_of_rows
from olmax.step.state import init_train_state
from olmax.step.train_step import make_train_step

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
    # the global normalisation's step of test_per_rank_equals_global_when_the_ranks_count_the_same: one
    # program, compiled once for both
    cfg = _per_rank_cfg("global", micro=2)
    ids, mask = _batch(b=8)
    params = jax.jit(init_params, static_argnums=0)(cfg.model, jax.random.key(0))
    labels = make_labels(jnp.asarray(ids), pad_token_id=PAD, label_mask=jnp.asarray(mask))
    # jitted: run eagerly, each operation of the forward would be a compile of its own
    full_logits = jax.jit(lambda p: lm_head(p, forward_hidden(p, jnp.asarray(ids), cfg.model), cfg.model))
    ce, _ = loss_sums(full_logits(params), labels)
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


def _per_rank_cfg(normalisation="per_rank", ranks=4, micro=None, mesh=MeshConfig(data=1, fsdp=1, tensor=1)):
    return ExperimentConfig(
        name="sft-per-rank",
        model=STEP_MODEL,
        data=DataConfig(seq_len=16, pad_token_id=PAD, packing="obfd", label_masks=True),
        trainer=TrainerConfig(
            global_batch=8,
            micro_batch_size=micro,
            max_steps=2,
            loss_chunk=8,
            loss_normalisation=normalisation,
            loss_ranks=ranks if normalisation == "per_rank" else None,
        ),
        mesh=mesh,
    )


def _step_metrics(cfg, params, batch, devices):
    mesh = make_mesh(cfg.mesh, jax.devices()[:devices])
    with jax.set_mesh(mesh):
        state = init_train_state(cfg, mesh, jax.random.key(0), params=params)
        return jax.device_get(make_train_step(cfg, mesh)(state, batch)[1])


def _uneven_batch():
    """8 SFT rows of 16 tokens with 1 to 15 trained targets each: the 4 ranks' counts differ."""
    rng = np.random.default_rng(3)
    ids = rng.integers(4, 250, (8, 16), dtype=np.int32)
    mask = np.zeros((8, 16), bool)
    for row, keep in enumerate([2, 16, 5, 9, 3, 12, 7, 16]):  # the first `keep` tokens; label t is token t + 1
        mask[row, :keep] = True
    return ids, mask


def _per_rank_by_hand():
    """(ids, mask, params, CE, gradient norm) of trainer.loss_normalisation=per_rank over 4 ranks on
    an uneven batch, computed by hand from the full logits: rank r trains rows r and r + 4 (OLMo-core's
    loader deals instance i to rank i mod 4), CE = sum_r CE_r / n_r / 4."""
    cfg = _per_rank_cfg(micro=2)
    ids, mask = _uneven_batch()
    params = jax.device_get(jax.jit(init_params, static_argnums=0)(cfg.model, jax.random.key(0)))
    labels = make_labels(jnp.asarray(ids), pad_token_id=PAD, label_mask=jnp.asarray(mask))
    counts = np.asarray(labels != IGNORE).sum(axis=1)
    rank_counts = counts.reshape(2, 4).sum(axis=0)  # rows r and r + 4
    assert rank_counts.tolist() == [3, 26, 10, 23]

    def by_hand(p):
        ce = 0.0
        for r in range(4):
            rows = jnp.asarray([r, r + 4])
            hidden = forward_hidden(p, jnp.asarray(ids)[rows], cfg.model)
            ce += loss_sums(lm_head(p, hidden, cfg.model), labels[rows])[0] / rank_counts[r]
        return ce / 4

    expected, grads = jax.value_and_grad(by_hand)(params)
    norm = float(jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads))))
    logits = lm_head(params, forward_hidden(params, jnp.asarray(ids), cfg.model), cfg.model)
    global_ce = float(loss_sums(logits, labels)[0]) / counts.sum()
    assert abs(float(expected) - global_ce) > 1e-3 * global_ce  # 1.8e-3: the two normalisations differ here
    return ids, mask, params, float(expected), norm


def _assert_per_rank_step(layouts: dict) -> tuple:
    """Each layout's step has the CE and gradient norm of the loss by hand; returns the by-hand figures."""
    by_hand = ids, mask, params, expected, norm = _per_rank_by_hand()
    for name, (layout_cfg, devices) in layouts.items():
        metrics = _step_metrics(layout_cfg, params, {"input_ids": ids, "label_mask": mask}, devices)
        np.testing.assert_allclose(float(metrics["ce_loss"]), expected, rtol=1e-6, err_msg=name)
        np.testing.assert_allclose(float(metrics["grad_norm"]), norm, rtol=1e-5, err_msg=name)
    return by_hand


@pytest.mark.slow  # the default suite's 10 minutes (docs/testing.md)
def test_per_rank_loss_is_the_mean_of_rank_means():
    """trainer.loss_normalisation=per_rank: the step's CE and gradient norm are those of the loss by
    hand (_per_rank_by_hand), on 1 device with 4 micro-batches and on 8 devices; the global
    normalisation's gradient is not."""
    ids, mask, params, _, norm = _assert_per_rank_step(
        {
            "1 device, 4 micro-batches": (_per_rank_cfg(micro=2), 1),
            "8 devices": (_per_rank_cfg(mesh=MeshConfig(data=2, fsdp=4, tensor=1)), 8),
        }
    )
    plain = _step_metrics(_per_rank_cfg("global", micro=2), params, {"input_ids": ids, "label_mask": mask}, 1)
    assert abs(float(plain["grad_norm"]) - norm) > 0.1 * norm  # measured 23%: the weights reach the gradient


@pytest.mark.slow  # ~15 s on 2 cores: one more compile of the step, over a context axis
def test_per_rank_loss_over_a_context_axis():
    """The same on 2 x 2 devices with a context axis of 2."""
    _assert_per_rank_step(
        {"2 x 2 devices, context 2": (_per_rank_cfg(mesh=MeshConfig(data=1, fsdp=2, context=2, tensor=1)), 4)}
    )


def test_per_rank_equals_global_when_the_ranks_count_the_same():
    """Every rank with the same count of loss tokens: the two normalisations are one (pre-training)."""
    ids, mask = _uneven_batch()
    mask[:] = True
    params = jax.device_get(jax.jit(init_params, static_argnums=0)(STEP_MODEL, jax.random.key(0)))
    batch = {"input_ids": ids, "label_mask": mask}
    ours = _step_metrics(_per_rank_cfg(micro=2), params, batch, 1)
    ref = _step_metrics(_per_rank_cfg("global", micro=2), params, batch, 1)
    for key in ("ce_loss", "grad_norm"):
        np.testing.assert_allclose(float(ours[key]), float(ref[key]), rtol=1e-6, err_msg=key)


@pytest.mark.parametrize("processes", [1, 2, 4])
@pytest.mark.parametrize("ranks", [1, 2, 4, 8])
def test_loss_ranks_of_rows_are_olmo_core_s(processes, ranks):
    """The rank of each row of the batch olmax.trainer.run assembles (process p's rows from the loader's
    rank_ids(p of processes), in process order) is OLMo-core's: the instance's place in the global
    batch mod the ranks (NumpyFSLDataLoader deals instance i of a batch to rank i mod D)."""
    order = np.random.default_rng(0).permutation(64).astype(np.uint32)
    for batch in range(4):
        step_rows = np.concatenate([rank_ids(order, batch, 16, p, processes) for p in range(processes)])
        place = {int(i): k for k, i in enumerate(batch_ids(order, batch, 16))}
        olmo_core = np.asarray([place[int(i)] % ranks for i in step_rows])
        np.testing.assert_array_equal(loss_rank_of_rows(16, ranks, processes), olmo_core)


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"loss_normalisation": "rank"}, "trainer.loss_normalisation='rank' is not one of global, per_rank"),
        ({"loss_normalisation": "per_rank"}, "per_rank needs trainer.loss_ranks"),
        ({"loss_normalisation": "per_rank", "loss_ranks": 3}, "loss_ranks=3 does not divide trainer.global_batch=8"),
        ({"loss_normalisation": "per_rank", "loss_ranks": 0}, "trainer.loss_ranks must be positive"),
        ({"loss_ranks": 4}, "loss_ranks=4 is only used with trainer.loss_normalisation=per_rank"),
        (
            {"loss_normalisation": "per_rank", "loss_ranks": 4, "objective": "dpo"},
            "is for trainer.objective=lm, not dpo",
        ),
    ],
)
def test_loss_normalisation_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        TrainerConfig(global_batch=8, **overrides)


@pytest.mark.parametrize(
    "name,lr,global_batch,ranks",
    [
        ("olmo3_7b_think_sft", 5e-5, 32, 32),
        ("olmo3_7b_instruct_sft", 8e-5, 32, 16),
        ("olmo3_32b_think_sft", 1e-4, 128, None),
        ("olmo3_32b_instruct_sft", 8e-5, 128, None),
    ],
)
def test_sft_recipes(name, lr, global_batch, ranks):
    """AI2's numbers (OLMo-core src/scripts/train/sft/, open-instruct scripts/train/olmo3/*_sft.sh)."""
    from olmax.config.recipes import get_recipe

    cfg = get_recipe(name)
    assert (cfg.optimizer.lr, cfg.trainer.global_batch * cfg.data.seq_len) == (lr, global_batch * 32768)
    normalisation = "per_rank" if ranks else "global"  # AI2's 7B layouts (docs/post-training/sft.md)
    assert (cfg.trainer.loss_normalisation, cfg.trainer.loss_ranks) == (normalisation, ranks)
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
