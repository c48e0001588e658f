"""The mini reproduction: the same tiny OLMo 3 trained by olmax and by ai2-olmo-core 3.0.0.

Both start from OLMo-core's own initialisation (its state dict through olmax's converter), read the
same token files in the same order (OLMo-core's NumpyFSLDataset + NumpyDataLoader on one side,
olmax's make_loader on the other; the batches are compared token for token), and train on CPU in
fp32 with AI2's optimizer: SkipStepAdamW with clipping at 1.0, weight decay 0.1 except the
embedding, z-loss 1e-5, CE over the padded vocabulary divided by the global batch's label count,
CosWithWarmup vs olmax's cosine. At one step both train on a pathological batch (tokens the corpus
never contains), which the skip-step rule must reject on both sides. The OLMo-core side is its plain
torch model in a hand-written loop doing what its train module does per step;
olmax.parity.training holds both loops; benchmarks/train_parity.py runs them longer, with a plot.

Tolerances (measured on 8 devices: 30 steps / 100 steps): every step's CE within 1e-4 (1.4e-6 /
1.3e-5: float32 summation order, growing as the runs drift apart exactly as OLMo-core drifts from
itself when started 1 ulp away, see docs/training.md); the same skipped steps; final parameters
within 1e-3 of the overall parameter norm (6.3e-6 / 4.4e-5) and every tensor within 5e-3 of its
largest entry (3.9e-4 / 3.4e-4; the embedding's rarely seen rows get near-zero gradients that Adam
still turns into steps of ~lr). A wrong loss normalisation, bias correction, decay mask, clipping or schedule
moves the CE by >1e-3 within a few steps; a missed or extra skip moves parameters by ~lr (3e-3),
about 10% of their 0.02 scale.
"""

from __future__ import annotations

import pytest

from olmax.parity.harness import Setup
from olmax.parity.training import compare_training

pytest.importorskip("olmo_core")
pytestmark = pytest.mark.parity


def check(setup: Setup, tmp_path) -> dict:
    ref, ours, f = compare_training(setup, tmp_path)
    assert f["same_batches"], "the two loaders gave different batches"
    assert f["max_abs_ce_delta"] < 1e-4, f
    assert f["max_abs_z_delta"] < 1e-6, f
    assert f["max_abs_lr_delta"] < 1e-9, f
    # the spike is skipped, by both, and nothing else is
    assert ref.skipped == [setup.spike_step], f
    assert ours.skipped == ref.skipped, f
    assert ref.ce[setup.spike_step - 1] > ref.ce[setup.spike_step - 2] + 1.0  # it is a spike
    assert ref.ce[-1] < ref.ce[0] - 0.5  # and the model did learn
    assert f["final_rel_l2_param_diff"] < 1e-3, f
    assert f["final_max_rel_param_diff"] < 5e-3, f
    return f


@pytest.mark.parity
def test_train_parity_short(tmp_path):
    """30 steps with a 16-value skip window on both sides, so the rule can fire at step 20."""
    check(Setup(steps=30, spike_step=20, skip_window=16), tmp_path)


@pytest.mark.parity
@pytest.mark.slow
def test_train_parity_100_steps_ai2_skip_window(tmp_path):
    """AI2's 128-value window (nothing can skip before step 64), 100 steps, the spike at step 80."""
    check(Setup(steps=100, spike_step=80), tmp_path)
