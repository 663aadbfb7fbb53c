"""The torch reference of hybrid tree attention against dense masked softmax attention (fp32, 1e-5)."""

from __future__ import annotations

import pytest
import torch
from attention_oracle import dense_attention, random_tree_mask

import specchat.kernels.attention
from specchat.kernels.attention import reference

# (prefix_len, tree nodes, query heads, kv heads, head_dim): GQA ratios 1/3/4/8, head_dim 64/80/128
SHAPES = [
    (0, 1, 4, 4, 64),
    (0, 37, 6, 2, 80),
    (1, 1, 8, 1, 128),
    (17, 5, 4, 1, 64),
    (300, 64, 8, 2, 128),
    (1000, 128, 3, 1, 80),
    (2048, 17, 8, 8, 64),
    (5000, 100, 12, 4, 128),
    (4999, 2, 32, 4, 80),
]


def _inputs(prefix_len, n, heads, kv_heads, dim, seed, slack=7):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(2, heads, n, dim, generator=generator)
    k = torch.randn(2, kv_heads, prefix_len + n + slack, dim, generator=generator)  # slack: unused cache slots
    v = torch.randn(2, kv_heads, prefix_len + n + slack, dim, generator=generator)
    return q, k, v, random_tree_mask(n, generator)


@pytest.mark.parametrize("prefix_len, n, heads, kv_heads, dim", SHAPES)
def test_reference_equals_dense_masked_attention(prefix_len, n, heads, kv_heads, dim):
    q, k, v, mask = _inputs(prefix_len, n, heads, kv_heads, dim, seed=prefix_len + n)
    got = reference.hybrid_tree_attention(q, k, v, prefix_len, mask, dim**-0.5)
    want = dense_attention(q, k, v, prefix_len, mask, dim**-0.5)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("prefix_len, n, heads, kv_heads, dim", [(0, 12, 4, 2, 64), (333, 40, 8, 2, 80)])
def test_each_node_sees_exactly_its_root_to_node_path(prefix_len, n, heads, kv_heads, dim):
    """Node i's output equals plain causal attention over prefix + its path, computed on that path alone."""
    q, k, v, mask = _inputs(prefix_len, n, heads, kv_heads, dim, seed=n)
    scale = dim**-0.5
    out = specchat.kernels.attention.hybrid_tree_attention(q, k, v, prefix_len, mask, scale)
    group = heads // kv_heads
    for i in range(n):
        path = mask[i].nonzero().flatten()  # ancestors and itself, root first
        slots = torch.cat([torch.arange(prefix_len), prefix_len + path])
        keys = k[:, :, slots].repeat_interleave(group, dim=1).double()
        values = v[:, :, slots].repeat_interleave(group, dim=1).double()
        scores = q[:, :, i : i + 1].double() @ keys.transpose(-1, -2) * scale
        want = torch.softmax(scores, dim=-1) @ values
        torch.testing.assert_close(out[:, :, i : i + 1].double(), want, atol=1e-5, rtol=1e-5)


def test_merge_of_a_split_key_set_equals_attention_over_the_union():
    q, k, v, _ = _inputs(200, 9, 4, 2, 64, seed=3, slack=0)
    full = torch.ones(9, 209, dtype=torch.bool)
    o_a, lse_a = reference.prefix_attention(q, k[:, :, :120], v[:, :, :120], 0.125)
    o_b, lse_b = reference.tree_attention(q, k[:, :, 120:], v[:, :, 120:], full[:, 120:], 0.125)
    o, lse = reference.merge_attention(o_a, lse_a, o_b, lse_b)
    o_all, lse_all = reference.tree_attention(q, k, v, full, 0.125)
    torch.testing.assert_close(o, o_all, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, lse_all, atol=1e-5, rtol=1e-5)


def test_an_empty_key_set_has_lse_minus_infinity_and_merges_to_nothing():
    q, k, v, mask = _inputs(0, 4, 2, 1, 64, seed=5, slack=0)
    o_empty, lse_empty = reference.prefix_attention(q, k[:, :, :0], v[:, :, :0], 0.125)
    assert torch.isneginf(lse_empty).all() and (o_empty == 0).all()
    o_tree, lse_tree = reference.tree_attention(q, k, v, mask, 0.125)
    o, lse = reference.merge_attention(o_empty, lse_empty, o_tree, lse_tree)
    torch.testing.assert_close(o, o_tree)
    torch.testing.assert_close(lse, lse_tree)


def test_the_scale_is_the_callers_not_a_hard_coded_head_size():
    q, k, v, mask = _inputs(50, 6, 4, 2, 80, seed=9)
    for scale in (80**-0.5, 0.3):
        got = specchat.kernels.attention.hybrid_tree_attention(q, k, v, 50, mask, scale)
        torch.testing.assert_close(got.double(), dense_attention(q, k, v, 50, mask, scale), atol=1e-5, rtol=1e-5)


def test_output_keeps_the_query_dtype_and_fills_a_strided_out():
    q, k, v, mask = _inputs(30, 5, 4, 2, 64, seed=1)
    q16, k16, v16 = q.bfloat16(), k.bfloat16(), v.bfloat16()
    out = torch.empty(2, 5, 4, 64, dtype=torch.bfloat16).transpose(1, 2)  # transformers' layout, seen as [B,H,n,D]
    returned = specchat.kernels.attention.hybrid_tree_attention(q16, k16, v16, 30, mask, 0.125, out=out)
    assert returned is out and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), dense_attention(q16, k16, v16, 30, mask, 0.125), atol=2e-2, rtol=2e-2)
