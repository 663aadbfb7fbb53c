"""flash-attn's `flash_attn_with_kvcache` as the prefix part, when flash-attn >= 2.6 is installed.

It reads the cache in place (`[B, S, Hkv, D]` views of our `[B, Hkv, S, D]` layers, last dim contiguous),
stops at `cache_seqlens = prefix_len`, and returns the LSE the hybrid merge needs.
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def flash_attn_available() -> bool:
    try:
        import flash_attn
    except ImportError:
        return False
    major, minor = (int(part) for part in flash_attn.__version__.split(".")[:2])
    return (major, minor) >= (2, 6)


def flash_prefix_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, prefix_len: int, scale):
    """Attention of q `[B, Hq, n, D]` over keys `[0, prefix_len)` -> (O `[B, Hq, n, D]`, LSE `[B, Hq, n]` fp32)."""
    from flash_attn import flash_attn_with_kvcache

    lengths = torch.full((q.shape[0],), prefix_len, dtype=torch.int32, device=q.device)
    out, lse = flash_attn_with_kvcache(
        q.transpose(1, 2),
        k_cache.transpose(1, 2),
        v_cache.transpose(1, 2),
        cache_seqlens=lengths,
        softmax_scale=scale,
        causal=False,
        return_softmax_lse=True,
    )
    return out.transpose(1, 2), lse
