"""The Triton kernels against the torch reference: on GPU for real, on CPU in the interpreter (conftest sets
TRITON_INTERPRET=1 there). Small shapes: the interpreter runs every program in Python."""

from __future__ import annotations

import pytest
import torch
from attention_oracle import random_tree_mask

from specchat.kernels.attention import reference

pytest.importorskip("triton")

from specchat.kernels.attention.decode_attention import prefix_attention
from specchat.kernels.attention.hybrid import triton_hybrid_tree_attention
from specchat.kernels.attention.tree_attention import fused_mask_attn

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# bf16: inputs and outputs are rounded to 8 bits of mantissa (the interpreter also truncates fp32 -> bf16)
TOLERANCE = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 3e-2}


def _inputs(prefix_len, n, heads, kv_heads, dim, dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    shape = (1, kv_heads, prefix_len + n + 5, dim)
    q = torch.randn(1, heads, n, dim, generator=generator)
    k, v = torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)
    mask = random_tree_mask(n, generator)
    return [t.to(DEVICE, dtype) for t in (q, k, v)] + [mask.to(DEVICE)]


def _close(got, want, dtype):
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(got.float().cpu(), want.float().cpu(), atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n, heads, kv_heads, dim", [(1, 2, 2, 64), (13, 3, 1, 80), (40, 4, 1, 96), (33, 8, 2, 128)])
def test_fused_mask_attn_matches_the_reference(n, heads, kv_heads, dim, dtype):
    q, k, v, mask = _inputs(0, n, heads, kv_heads, dim, dtype, seed=n)
    o, lse = fused_mask_attn(q, k[:, :, :n], v[:, :, :n], mask, dim**-0.5)
    o_want, lse_want = reference.tree_attention(q, k[:, :, :n], v[:, :, :n], mask, dim**-0.5)
    assert o.dtype == lse.dtype == torch.float32
    _close(o, o_want, dtype)
    _close(lse, lse_want, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "prefix_len, n, heads, kv_heads, dim", [(1, 1, 4, 1, 64), (200, 3, 4, 4, 80), (333, 9, 8, 2, 128)]
)
def test_split_kv_prefix_attention_matches_the_reference(prefix_len, n, heads, kv_heads, dim, dtype):
    q, k, v, _ = _inputs(prefix_len, n, heads, kv_heads, dim, dtype, seed=prefix_len)
    got = prefix_attention(q, k, v, prefix_len, dim**-0.5)
    want, _ = reference.prefix_attention(q, k[:, :, :prefix_len], v[:, :, :prefix_len], dim**-0.5)
    assert got.dtype == dtype
    _close(got, want, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "prefix_len, n, heads, kv_heads, dim", [(0, 7, 4, 2, 64), (1, 1, 3, 1, 80), (257, 21, 8, 2, 64)]
)
def test_triton_hybrid_matches_the_reference(prefix_len, n, heads, kv_heads, dim, dtype):
    q, k, v, mask = _inputs(prefix_len, n, heads, kv_heads, dim, dtype, seed=n)
    got = triton_hybrid_tree_attention(q, k, v, prefix_len, mask, dim**-0.5, prefix="triton")
    want = reference.hybrid_tree_attention(q.float(), k.float(), v.float(), prefix_len, mask, dim**-0.5)
    _close(got, want, dtype)


def test_triton_hybrid_writes_a_transposed_out_in_place():
    q, k, v, mask = _inputs(100, 6, 4, 2, 64, torch.float32, seed=2)
    out = torch.empty(1, 6, 4, 64, device=DEVICE).transpose(1, 2)
    returned = triton_hybrid_tree_attention(q, k, v, 100, mask, 0.125, out=out, prefix="triton")
    assert returned is out
    _close(out, reference.hybrid_tree_attention(q, k, v, 100, mask, 0.125), torch.float32)


@pytest.mark.skipif(DEVICE == "cpu", reason="flash-attn runs on CUDA only")
def test_flash_attn_prefix_matches_the_reference():
    from specchat.kernels.attention.flash_decoding import flash_attn_available

    if not flash_attn_available():
        pytest.skip("flash-attn >= 2.6 is not installed")
    q, k, v, mask = _inputs(1000, 17, 8, 2, 128, torch.bfloat16, seed=4)
    got = triton_hybrid_tree_attention(q, k, v, 1000, mask, 128**-0.5, prefix="flash")
    _close(got, reference.hybrid_tree_attention(q, k, v, 1000, mask, 128**-0.5), torch.bfloat16)
