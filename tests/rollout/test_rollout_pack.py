"""Rollouts packed into rows as open-instruct's `pack_sequences` lays them out (rl_utils.py, 42aa63c):
greedy in order, response indices 1-based, the sampler's log-probs on response tokens; and the
doc_lens the train step turns into one attention segment per sample plus one for the padding."""

import numpy as np
import pytest

from olmax.model.attention import document_positions, segment_ids
from olmax.rollout.pack import pack_rollouts

PAD = 99


def test_greedy_rows_in_order():
    prompts = [[1, 2], [3], [4, 5, 6], [7]]
    responses = [[10, 11, 12], [13], [14, 15], [16, 17, 18, 19]]
    logps = [[-0.1, -0.2, -0.3], [-0.4], [-0.5, -0.6], [-0.7, -0.8, -0.9, -1.0]]
    p = pack_rollouts(prompts, responses, logps, pack_len=8, pad_id=PAD)
    # 5 + 2 fit one row of 8; 5 more start a second; 5 more a third (greedy, no reordering)
    assert p.input_ids.tolist() == [
        [1, 2, 10, 11, 12, 3, 13, PAD],
        [4, 5, 6, 14, 15, PAD, PAD, PAD],
        [7, 16, 17, 18, 19, PAD, PAD, PAD],
    ]
    assert p.response_index.tolist() == [
        [0, 0, 1, 1, 1, 0, 2, 0],
        [0, 0, 0, 3, 3, 0, 0, 0],
        [0, 4, 4, 4, 4, 0, 0, 0],
    ]
    assert (p.response_mask == (p.response_index > 0)).all()
    np.testing.assert_array_equal(p.sampler_logps[0], np.float32([0, 0, -0.1, -0.2, -0.3, 0, -0.4, 0]))
    assert p.doc_lens.tolist() == [[5, 2, 1, 0, 0, 0, 0, 0], [5, 3, 0, 0, 0, 0, 0, 0], [5, 3, 0, 0, 0, 0, 0, 0]]
    # attention segments and positions restart per sample, as open-instruct's position_ids do
    seg = np.asarray(segment_ids(p.doc_lens))
    assert seg[0].tolist() == [0, 0, 0, 0, 0, 1, 1, 2]
    assert np.asarray(document_positions(seg))[0].tolist() == [0, 1, 2, 3, 4, 0, 1, 0]


def test_a_full_row_has_no_padding_segment():
    p = pack_rollouts([[1, 2]], [[3, 4]], [[-1.0, -2.0]], pack_len=4, pad_id=PAD)
    assert p.rows == 1 and p.doc_lens.tolist() == [[4, 0, 0, 0]]


def test_bad_samples_are_refused():
    with pytest.raises(ValueError, match="exceed pack length 4"):
        pack_rollouts([[1, 2, 3]], [[4, 5]], [[0.0, 0.0]], pack_len=4, pad_id=PAD)
    with pytest.raises(ValueError, match="2 response tokens but 1 log-probs"):
        pack_rollouts([[1]], [[4, 5]], [[0.0]], pack_len=4, pad_id=PAD)
