"""Position ids and visibility masks for training a drafter that reads the target's KV cache.

A drafter trained on short samples must still work at the long positions it meets at inference, and at
inference it reads a target cache that lags the tokens it drafts. The anchor-offset positions (LongSpec) give
short samples large position ids; the lag masks (LongSpec, GLIDE) hide the target KV that would not exist yet.
A mask is bool [query, key]: True where the draft query at row t may attend to the target's KV at key j.
"""

from __future__ import annotations

import random

import torch

ANCHOR_MAX_OFFSET = 30000  # LongSpec's largest shift of a sample's positions
ANCHOR_WINDOW_MARGIN = 1000  # the offset keeps this far below the window
ANCHOR_MAX_SINKS = 4  # at most this many first positions keep their own index (attention sinks)
LAG_MAX_PAD = 4


def anchor_offset_positions(length: int, window: int, rng: random.Random) -> torch.Tensor:
    """LongSpec's Anchor-Offset Indices: LongTensor [length], strictly increasing, every id < `window`.

    Meant for samples up to about 1200 tokens. The first `rng.randint(0, 4)` positions keep their index (the
    sinks the model always sees at 0..); every later position i becomes i + offset, with offset drawn from
    0..min(30000, window - 1000) - length, a range that keeps the last position at least 1000 below `window`
    (or, where the window is too short for any offset, leaves the positions as they are).
    """
    if length > window:
        raise ValueError(f"a sample of {length} tokens does not fit a window of {window} positions")
    sinks = rng.randint(0, ANCHOR_MAX_SINKS)
    offset = rng.randint(0, max(0, min(ANCHOR_MAX_OFFSET, window - ANCHOR_WINDOW_MARGIN) - length))
    positions = torch.arange(length)
    positions[sinks:] += offset
    return positions


def lag_pad(rng: random.Random) -> int:
    """How many positions the target's KV lags the draft in a LongSpec lag-training sample (1 to 4)."""
    return rng.randint(1, LAG_MAX_PAD)


def lag_visibility(length: int, pad: int) -> torch.Tensor:
    """LongSpec's lag mask, bool [length, length]: the query at t sees the target's KV at j <= t - pad.

    Rows t < pad see no target KV at all; their outputs are dropped from the loss (see `loss_rows`).
    """
    if pad < 0:
        raise ValueError(f"the lag is {pad}, it must be >= 0")
    t = torch.arange(length)
    return t[None, :] <= t[:, None] - pad


def loss_rows(length: int, pad: int) -> torch.Tensor:
    """bool [length]: the outputs of a lag sample that count in the loss, those with t >= pad."""
    return torch.arange(length) >= pad


def block_lag_visibility(length: int, block: int = 5) -> torch.Tensor:
    """GLIDE's block-wise lag mask, bool [length, length]: a query in block t // block sees the blocks before it.

    At inference the target's cache is complete up to the start of the draft's block, so training hides the
    target KV of the query's own block and later ones.
    """
    if block < 1:
        raise ValueError(f"the block is {block} positions, it must be >= 1")
    blocks = torch.arange(length) // block
    return blocks[None, :] < blocks[:, None]
