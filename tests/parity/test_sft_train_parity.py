"""SFT training parity with ai2-olmo-core 3.0.0: the same tiny OLMo 3 fine-tuned by olmax and by
OLMo-core on the same chat parts, step by step (olmax.parity.training with `Setup(sft=True)`; its
docstrings say what each side runs).

Data: conversations written by `olmax tokenize --chat instruct` (olmax.data.chat_files.tokenize_chat),
renumbered onto the tiny vocabulary, read by OLMo-core's `NumpyPackedFSLDataset` with
`label_mask_paths` and `generate_doc_lengths` and by olmax with data.packing=obfd, doc_masking and
label_masks: every step's tokens, label mask and documents are checked to be the same. Both sides train
with the `olmo3_7b_instruct_sft` recipe's settings: SkipStepAdamW betas (0.9, 0.95), weight decay 0,
clip 1.0, no z-loss, 3% warmup then linear to 0 (OLMo-core's `LinearWithWarmup(warmup_fraction=0.03,
alpha_f=0)` against schedule.warmup_fraction=0.03). On one rank OLMo-core's per-rank loss
normalisation and olmax's global one divide by the same count; over 2 ranks OLMo-core's own
`TransformerTrainModule` runs in 2 processes (torch.distributed, gloo, FSDP) against olmax with
trainer.loss_normalisation=per_rank and trainer.loss_ranks=2.

Bounds, those of tests/parity/test_train_parity.py (measured on 8 devices, 8 steps / 50 steps): every step's CE
within 1e-4 relative (8.7e-8 / 2.1e-7, float32 rounding: OLMo-core started one ulp away from its own
start drifts from itself by as much); the learning rate within 1e-9 (5e-11); no skipped step on either
side; final parameters within 1e-3 of the overall norm (5.9e-7 / 6.2e-7) and every tensor within 5e-3
of its largest entry (1.6e-4 / 1.2e-4). Without doc masking olmax is 2.9e-4 off at step 1. Over 300
steps rounding grows past these bounds for OLMo-core against itself too (docs/post-training/sft-parity.md, "SFT
training parity with OLMo-core"), so the long run stops at 50.
"""

from __future__ import annotations

import pytest

from olmax.parity.harness import Setup
from olmax.parity.training import compare_training

pytest.importorskip("olmo_core")
pytestmark = pytest.mark.parity


def check(setup: Setup, tmp_path):
    ref, ours, f = compare_training(setup, tmp_path)
    assert f["same_batches"], "the two loaders gave different tokens, label masks or documents"
    batch = ref.batches[0]
    assert 0 < batch["label_mask"].mean() < 1  # prompts masked, answers trained
    assert (batch["doc"][batch["label_mask"]] >= 1).any()  # answers of a conversation packed after another
    assert f["max_rel_ce_delta"] < 1e-4, f
    assert f["max_abs_lr_delta"] < 1e-9, f
    assert ref.lr[-1] == ours.lr[-1] == 0.0  # linear to 0 at the horizon
    assert ref.skipped == ours.skipped == [], f
    assert ref.ce[-1] < 0.95 * ref.ce[0]  # the model did learn (8 steps: 5.90 -> 5.46; 50: -> 3.42)
    assert f["final_rel_l2_param_diff"] < 1e-3, f
    assert f["final_max_rel_param_diff"] < 5e-3, f
    return ref, ours


@pytest.mark.parity
def test_sft_train_parity_short(tmp_path):
    """8 steps (3% of 8 rounds to no warmup: lr falls linearly from step 1)."""
    check(Setup.sft_run(8), tmp_path)


@pytest.mark.parity
@pytest.mark.slow
def test_sft_train_parity_50_steps(tmp_path):
    """50 steps: 2 warmup steps (round(1.5)), then linear to 0 at step 50."""
    setup = Setup.sft_run(50)
    ref, _ = check(setup, tmp_path)
    assert ref.lr[:2] == pytest.approx([setup.lr / 2, setup.lr])


@pytest.mark.parity
@pytest.mark.slow
def test_sft_train_parity_two_ranks(tmp_path):
    """50 steps over 2 data-parallel ranks with 2 micro-batches each: OLMo-core's train module divides
    each rank's CE by its own count of loss tokens (over both micro-batches) and averages the ranks;
    olmax, on its 8 devices, with trainer.loss_normalisation=per_rank over 2 ranks. The ranks' counts
    differ (rank r trains rows r and r + 2 of a step's 8): olmax's global normalisation against the
    same 2 ranks is 1.6e-3 off (relative CE) within 8 steps."""
    import numpy as np

    ref, _ = check(Setup.sft_run(50, ranks=2, micro_batch=2), tmp_path)
    # the trained targets of each rank per step: label t is trained when token t + 1 is
    counts = np.asarray([[b["label_mask"][r::2, 1:].sum() for r in range(2)] for b in ref.batches])
    ratio = counts.max(axis=1) / counts.min(axis=1)
    print(f"per rank, step 1: {counts[0].tolist()}; max/min median {np.median(ratio):.2f}, max {ratio.max():.2f}")
    assert np.median(ratio) > 1.1 and ratio.max() > 1.4


@pytest.mark.parity
def test_olmo_core_attention_within_documents():
    """The harness's backend for OLMo-core (train_parity_sft.mask_within_documents_, flash-attn varlen's
    masking on OLMo-core's SDPA backend) on packed rows gives each document's logits as OLMo-core's own,
    unmodified model gives them for the document alone (RoPE restarted by OLMo-core's rope.py); across
    the batch too (cu_doc_lens runs over the flattened rows)."""
    import numpy as np
    import torch

    from olmax.parity.harness import VOCAB
    from olmax.parity.olmo_core import build_olmo_core_model

    packed = build_olmo_core_model(Setup.sft_run(8))
    plain = build_olmo_core_model(Setup(seq_len=128))
    plain.load_state_dict(packed.state_dict())
    lens = [[50, 40, 38], [128, 0, 0]]
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, VOCAB, (2, 128))).long()
    with torch.no_grad():
        out = packed(ids, doc_lens=torch.tensor(lens), max_doc_lens=[50, 128])
        # without doc_lens: what OLMo-core's SDPA backend computes
        torch.testing.assert_close(packed(ids), plain(ids), rtol=0, atol=1e-6)
        assert (out[0, 50:] - plain(ids)[0, 50:]).abs().max() > 1e-2  # the documents matter
        for row, doc_lens in enumerate(lens):
            start = 0
            for n in filter(None, doc_lens):
                alone = plain(ids[row : row + 1, start : start + n])[0]
                torch.testing.assert_close(out[row, start : start + n], alone, rtol=0, atol=1e-5)
                start += n
