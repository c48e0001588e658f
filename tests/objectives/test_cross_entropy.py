"""Loss: labels and masking as OLMo-core builds them, CE and z-loss sums against olmo_core's
cross_entropy_loss, global-batch normalisation under micro-batching, and the chunked output layer."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from models import STEP_MODEL

from olmax.model.olmo3 import forward_hidden, init_params, lm_head
from olmax.objectives.cross_entropy import IGNORE, loss_denominator, loss_sums, make_labels, output_loss

PAD = 7


def _tokens(b=4, t=12, vocab=50, seed=0):
    ids = np.random.default_rng(seed).integers(0, vocab, (b, t), dtype=np.int32)
    ids[1, 5:] = PAD  # a padded tail
    ids[2, 3] = PAD
    return ids


def test_labels_shift_left_and_ignore_last():
    ids = _tokens()
    labels = np.asarray(make_labels(jnp.asarray(ids)))
    np.testing.assert_array_equal(labels[:, :-1], ids[:, 1:])
    assert (labels[:, -1] == IGNORE).all()
    assert float(loss_denominator(jnp.asarray(labels))) == ids.size - ids.shape[0]


def test_pad_masking_is_a_switch():
    ids = _tokens()
    assert (np.asarray(make_labels(jnp.asarray(ids)))[:, :-1] == PAD).sum() == 8  # off by default
    labels = np.asarray(make_labels(jnp.asarray(ids), pad_token_id=PAD))
    assert not (labels == PAD).any()
    assert (labels[1, 4:] == IGNORE).all() and labels[1, 3] == ids[1, 4]


@pytest.mark.parity
def test_labels_and_denominator_match_olmo_core():
    """olmo_core.data.utils.get_labels with an instance mask, and the train module's count: masked
    instances are ignored but still counted with their full length."""
    import torch
    from olmo_core.data.utils import get_labels

    ids = _tokens()
    keep = np.array([True, False, True, True])
    ref = get_labels({"input_ids": torch.from_numpy(ids).long(), "instance_mask": torch.from_numpy(keep)})
    ours = make_labels(jnp.asarray(ids), instance_mask=jnp.asarray(keep))
    np.testing.assert_array_equal(np.asarray(ours), ref.numpy())
    ref_count = int((ref != -100).sum()) + int((~torch.from_numpy(keep)).sum()) * ids.shape[1]
    assert float(loss_denominator(ours, jnp.asarray(keep))) == ref_count


@pytest.mark.parity
def test_sums_match_olmo_core_cross_entropy():
    import torch
    from olmo_core.nn.functional import cross_entropy_loss

    rng = np.random.default_rng(1)
    logits = (rng.standard_normal((3, 10, 64)) * 4).astype(np.float32)
    labels = np.array(make_labels(jnp.asarray(rng.integers(0, 64, (3, 10), dtype=np.int32)), pad_token_id=5))
    ce, z_sq = loss_sums(jnp.asarray(logits), jnp.asarray(labels))
    ref_ce, ref_z = cross_entropy_loss(
        torch.from_numpy(logits).view(-1, 64),
        torch.from_numpy(labels).long().view(-1),
        reduction="sum",
        compute_z_loss=True,
        z_loss_multiplier=1.0,
    )
    # float32 sums of 30 terms of size ~10: agreement to a few ulp of the total.
    assert float(ce) == pytest.approx(float(ref_ce), rel=1e-6)
    assert float(z_sq) == pytest.approx(float(ref_z), rel=1e-6)


def test_micro_batches_sum_to_the_global_mean():
    """With pad masking the micro-batches have different label counts: normalising each by the
    GLOBAL count and summing gives the global per-token mean; a per-micro-batch mean would not."""
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((4, 12, 32)).astype(np.float32)
    labels = np.asarray(make_labels(jnp.asarray(_tokens(vocab=32)), pad_token_id=PAD))
    sums = jax.jit(loss_sums)  # two compiles (a batch, a row), not one per operation per call
    n = float(loss_denominator(labels))
    whole = float(sums(logits, labels)[0]) / n
    rows = [float(sums(logits[i : i + 1], labels[i : i + 1])[0]) for i in range(4)]
    micro = sum(row / n for row in rows)
    per_micro_means = np.mean([row / float(loss_denominator(labels[i : i + 1])) for i, row in enumerate(rows)])
    assert float(micro) == pytest.approx(float(whole), rel=1e-6)
    assert abs(float(per_micro_means) - float(whole)) > 1e-3  # the test distinguishes the two


_init_params = jax.jit(init_params, static_argnums=0)


def _fused_inputs():
    ids = jnp.asarray(np.random.default_rng(3).integers(0, 250, (2, 16), dtype=np.int32))
    return ids, make_labels(ids, pad_token_id=PAD)


@jax.jit  # z_loss an argument: one program for every case's reference
def _full_logits_loss_and_grads(params, z_loss):
    ids, labels = _fused_inputs()

    def full(params):
        ce, z_sq = loss_sums(lm_head(params, forward_hidden(params, ids, STEP_MODEL), STEP_MODEL), labels)
        return ce + z_loss * z_sq, (ce, z_sq)

    return jax.value_and_grad(full, has_aux=True)(params)


@pytest.mark.parametrize("chunk, z_loss", [(4, 1e-5), (0, 0.1), (8, 0.1)])
def test_fused_output_loss_equals_autodiff_of_full_logits(chunk, z_loss):
    """The fused output layer + loss (gradients formed in its forward pass) against plain autodiff
    through the full float32 logits, with pad and last-position labels ignored; z_loss 0.1 makes the
    z-loss gradient big enough to be checked, 1e-5 is AI2's."""
    params = _init_params(STEP_MODEL, jax.random.key(0))
    ids, labels = _fused_inputs()

    def fused(params):
        return output_loss(
            params, forward_hidden(params, ids, STEP_MODEL), labels, STEP_MODEL, chunk=chunk, z_loss=z_loss
        )

    (total_ref, sums_ref), g_ref = _full_logits_loss_and_grads(params, z_loss)

    @jax.jit  # with and without gradients in one program: one compile, not two
    def with_and_without_grads(params):
        return jax.value_and_grad(fused, has_aux=True)(params), fused(params)[0]

    ((total, sums), g), no_grad_total = with_and_without_grads(params)
    assert float(total) == pytest.approx(float(total_ref), rel=1e-6)
    for a, b in zip(sums_ref, sums):
        assert float(b) == pytest.approx(float(a), rel=1e-6)
    assert float(no_grad_total) == pytest.approx(float(total_ref), rel=1e-6)  # the path without gradients
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g_ref), jax.tree.leaves(g)):
        scale = float(jnp.max(jnp.abs(a)))
        assert scale > 0, path
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=0, atol=1e-5 * scale, err_msg=str(path))


def test_chunk_must_divide_sequence():
    params = {"lm_head": jnp.zeros((32, 256))}
    hidden = jnp.zeros((1, 16, 32))
    with pytest.raises(ValueError, match="loss_chunk=5"):
        output_loss(params, hidden, jnp.zeros((1, 16), jnp.int32), STEP_MODEL, chunk=5, z_loss=1e-5)
