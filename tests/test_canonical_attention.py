"""Canonical tree attention: every row of a tree is bit for bit the decode step at its position, and close to
exact softmax attention."""

from __future__ import annotations

import pytest
import torch
from attention_oracle import dense_attention, random_tree_mask

from specchat.kernels.attention.canonical_attention import CHUNK, TAIL, WIDTH, canonical_tree_attention

HEADS, KV_HEADS, DIM = 9, 3, 64  # the default model's attention
SCALE = DIM**-0.5
PREFIXES = (0, 1, 37, TAIL - 1, TAIL + CHUNK - 3, TAIL + CHUNK, 300, 1500)  # before, at and past split points
ROWS = (1, 2, 5, 17, 65)


def _inputs(prefix: int, rows: int, dtype: torch.dtype, seed: int, *, chain: bool = False, spare: int = 8):
    """A query per tree row and a cache of prefix + rows + `spare` slots; slots past the tree hold stale keys,
    as after a rejected tree."""
    generator = torch.Generator().manual_seed(seed)
    size = prefix + rows + spare
    q = torch.randn(1, HEADS, rows, DIM, generator=generator).to(dtype)
    k = torch.randn(1, KV_HEADS, size, DIM, generator=generator).to(dtype)
    v = torch.randn(1, KV_HEADS, size, DIM, generator=generator).to(dtype)
    mask = torch.ones(rows, rows, dtype=torch.bool).tril() if chain else random_tree_mask(rows, generator)
    return q, k, v, mask


def _decoded(q, k, v, prefix: int, tree_mask: torch.Tensor, row: int, *, spare: int) -> torch.Tensor:
    """Row `row` computed as a decode step: its prefix and ancestors laid out contiguously, then itself, then
    `spare` stale slots (with WIDTH of them the step reads its keys in place, with fewer it gathers them)."""
    keys = torch.cat([torch.arange(prefix), prefix + tree_mask[row].nonzero()[:, 0]])  # ancestors in slot order
    position = len(keys) - 1
    size = position + 1 + spare
    k_row, v_row = torch.randn(1, KV_HEADS, size, DIM).to(k.dtype), torch.randn(1, KV_HEADS, size, DIM).to(v.dtype)
    k_row[:, :, : position + 1], v_row[:, :, : position + 1] = k[:, :, keys], v[:, :, keys]
    one = torch.ones(1, 1, dtype=torch.bool)
    return canonical_tree_attention(q[:, :, row : row + 1], k_row, v_row, position, one, SCALE)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("shape", ["random", "chain"])
def test_tree_rows_equal_decode_steps_bitwise(prefix, dtype, shape):
    """Random trees gather their rows' keys, chains (and decode steps with room after them) read them in place,
    decode steps at the cache's end gather: all the same bits."""
    for rows in ROWS:
        spare = WIDTH if shape == "chain" else 8
        q, k, v, mask = _inputs(prefix, rows, dtype, seed=prefix * 100 + rows, chain=shape == "chain", spare=spare)
        tree = canonical_tree_attention(q, k, v, prefix, mask, SCALE)
        for row in range(rows):
            for room in (0, WIDTH):
                decoded = _decoded(q, k, v, prefix, mask, row, spare=room)
                assert torch.equal(tree[:, :, row : row + 1], decoded), f"{rows} rows, row {row}, {room} spare"


@pytest.mark.parametrize("prefix", PREFIXES)
def test_close_to_exact_attention(prefix):
    for rows in ROWS:
        q, k, v, mask = _inputs(prefix, rows, torch.bfloat16, seed=rows)
        exact = dense_attention(q, k, v, prefix, mask, SCALE)
        out = canonical_tree_attention(q, k, v, prefix, mask, SCALE)
        torch.testing.assert_close(out.double(), exact, atol=2e-2, rtol=2e-2)


def test_writes_into_a_given_output():
    q, k, v, mask = _inputs(200, 5, torch.bfloat16, seed=1)
    out = torch.empty(1, 5, HEADS, DIM, dtype=torch.bfloat16)  # transformers' [B, n, H, D], filled via a view
    canonical_tree_attention(q, k, v, 200, mask, SCALE, out=out.transpose(1, 2))
    assert torch.equal(out.transpose(1, 2), canonical_tree_attention(q, k, v, 200, mask, SCALE))


def test_trees_deeper_than_the_tail_are_refused():
    chain = torch.ones(TAIL + 2, TAIL + 2, dtype=torch.bool).tril()
    q, k, v, _ = _inputs(10, TAIL + 2, torch.bfloat16, seed=0)
    with pytest.raises(ValueError, match="deep"):
        canonical_tree_attention(q, k, v, 10, chain, SCALE)
