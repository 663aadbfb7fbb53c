"""The trainer's position ids, lag masks and reduced draft vocabulary are exactly their definitions.

Proven here: `anchor_offset_positions` keeps rng.randint(0, 4) sinks and shifts the rest by one offset drawn
from 0..min(30000, window - 1000) - length (literal seeded cases, and the bounds over many draws: strictly
increasing, below the window); `lag_visibility`, `loss_rows` and `block_lag_visibility` are literal tables;
`frequent_tokens` picks by count with ties to the lower id and always keeps `always`; `draft_vocab_targets`
maps ids to draft indices or -100.
"""

from __future__ import annotations

import random

import pytest
import torch

from specchat.training.indices import (
    anchor_offset_positions,
    block_lag_visibility,
    lag_pad,
    lag_visibility,
    loss_rows,
)
from specchat.training.vocab import draft_vocab_targets, frequent_tokens

# --- anchor-offset positions ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seed", "length", "window", "expected"),
    [
        # Random(0): sinks 3, offset 1552 of 0..min(30000, 2000) - 10
        (0, 10, 3000, [0, 1, 2, 1555, 1556, 1557, 1558, 1559, 1560, 1561]),
        # Random(3): sinks 1, offset 19419 of 0..30000 - 10 (the 30000 cap, not the window, bounds it)
        (3, 10, 40000, [0, 19420, 19421, 19422, 19423, 19424, 19425, 19426, 19427, 19428]),
        # Random(1): sinks 1, but the window leaves no room for an offset: 0..max(0, 8 - 8)
        (1, 8, 1008, [0, 1, 2, 3, 4, 5, 6, 7]),
        # Random(5): sinks 4, offset 523
        (5, 10, 3000, [0, 1, 2, 3, 527, 528, 529, 530, 531, 532]),
    ],
)
def test_anchor_offset_literal(seed, length, window, expected):
    positions = anchor_offset_positions(length, window, random.Random(seed))
    assert positions.dtype == torch.long
    assert positions.tolist() == expected


def test_anchor_offset_bounds():
    rng = random.Random(7)
    for _ in range(500):
        window = rng.choice([512, 1000, 1500, 4096, 32768, 131072])
        length = rng.randint(1, min(window, 1200))
        seed = rng.randrange(10**9)
        positions = anchor_offset_positions(length, window, random.Random(seed))
        sinks = random.Random(seed).randint(0, 4)  # the first draw is the sinks
        assert positions.shape == (length,)
        assert positions[-1] < window
        assert (positions[1:] > positions[:-1]).all()
        assert positions[:sinks].tolist() == list(range(min(sinks, length)))
        offsets = positions[sinks:] - torch.arange(sinks, length)
        if length > sinks:
            assert (offsets == offsets[0]).all()
            assert 0 <= offsets[0] <= max(0, min(30000, window - 1000) - length)


def test_anchor_offset_reaches_large_positions():
    tops = [anchor_offset_positions(100, 131072, random.Random(seed))[-1].item() for seed in range(200)]
    assert max(tops) > 25000


def test_anchor_offset_rejects_a_sample_longer_than_the_window():
    assert anchor_offset_positions(16, 16, random.Random(0)).tolist() == list(range(16))
    with pytest.raises(ValueError):
        anchor_offset_positions(17, 16, random.Random(0))


# --- lag masks --------------------------------------------------------------------------------------------


def test_lag_visibility_literal():
    expected = torch.tensor(
        [
            [0, 0, 0, 0, 0, 0],
            [0, 0, 0, 0, 0, 0],
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [1, 1, 1, 1, 0, 0],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(lag_visibility(6, 2), expected)
    assert loss_rows(6, 2).tolist() == [False, False, True, True, True, True]


def test_lag_visibility_without_lag_is_causal():
    assert torch.equal(lag_visibility(5, 0), torch.ones(5, 5, dtype=torch.bool).tril())
    assert loss_rows(5, 0).all()
    with pytest.raises(ValueError):
        lag_visibility(5, -1)


def test_lag_pad_draws_one_to_four():
    rng = random.Random(0)
    assert {lag_pad(rng) for _ in range(200)} == {1, 2, 3, 4}


def test_block_lag_visibility_literal():
    # blocks: rows 0-4 -> 0, rows 5-9 -> 1, rows 10-11 -> 2
    none, first, two = [0] * 12, [1] * 5 + [0] * 7, [1] * 10 + [0] * 2
    expected = torch.tensor([none] * 5 + [first] * 5 + [two] * 2, dtype=torch.bool)
    assert torch.equal(block_lag_visibility(12, 5), expected)
    assert torch.equal(block_lag_visibility(4, 1), lag_visibility(4, 1))  # blocks of one: a lag of one
    with pytest.raises(ValueError):
        block_lag_visibility(4, 0)


# --- draft vocabulary -------------------------------------------------------------------------------------


def test_frequent_tokens_by_count_ties_to_lower_id():
    # counts: 7 -> 3, 2 -> 2, 5 -> 2, 9 -> 2, 1 -> 1
    lists = [[7, 2, 5], [7, 9, 5], [2, 7, 9, 1]]
    assert frequent_tokens(lists, 1, 10).tolist() == [7]
    assert frequent_tokens(lists, 2, 10).tolist() == [2, 7]
    assert frequent_tokens(lists, 3, 10).tolist() == [2, 5, 7]
    assert frequent_tokens(lists, 5, 10).tolist() == [1, 2, 5, 7, 9]
    assert frequent_tokens(lists, 6, 10).tolist() == [0, 1, 2, 5, 7, 9]  # unseen ids, lowest first
    assert frequent_tokens(lists, 6, 10).dtype == torch.long


def test_frequent_tokens_always():
    lists = [[7, 2, 5], [7, 9, 5], [2, 7, 9, 1]]
    assert frequent_tokens(lists, 3, 10, always=[8]).tolist() == [2, 7, 8]
    assert frequent_tokens(lists, 3, 10, always=[7, 8]).tolist() == [2, 7, 8]  # 7 is not counted twice
    assert frequent_tokens(lists, 2, 10, always=[0, 3]).tolist() == [0, 3]
    with pytest.raises(ValueError):
        frequent_tokens(lists, 1, 10, always=[0, 3])
    with pytest.raises(ValueError):
        frequent_tokens(lists, 3, 10, always=[10])
    with pytest.raises(ValueError):
        frequent_tokens([[11]], 3, 10)


def test_frequent_tokens_full_vocabulary():
    assert frequent_tokens([[3, 3]], 0, 6).tolist() == [0, 1, 2, 3, 4, 5]
    assert frequent_tokens([[3, 3]], 6, 6).tolist() == [0, 1, 2, 3, 4, 5]
    assert frequent_tokens([[3, 3]], 60, 6).tolist() == [0, 1, 2, 3, 4, 5]


def test_draft_vocab_targets():
    draft_vocab = torch.tensor([2, 5, 7, 9])
    targets = torch.tensor([[7, 2, 3], [9, 10, -100], [0, 5, 9]])
    expected = torch.tensor([[2, 0, -100], [3, -100, -100], [-100, 1, 3]])
    assert torch.equal(draft_vocab_targets(targets, draft_vocab), expected)
