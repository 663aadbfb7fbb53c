"""Hybrid tree attention: the committed prefix without a mask, the tree with its ancestor mask, merged by LSE.

Backends, picked per call from where the tensors live:
- CUDA with triton: our `fused_mask_attn` for the tree; for the prefix flash-attn when >= 2.6 is installed,
  else our split-KV flash-decoding kernel, whose reduction pass also performs the merge;
- anything else (CPU): the torch reference.
"""

from __future__ import annotations

import functools
import importlib.util

import torch

from specchat.kernels.attention import reference


@functools.cache
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def uses_triton(device: torch.device) -> bool:
    """Whether hybrid attention on `device` runs the Triton kernels (else the torch reference)."""
    return device.type == "cuda" and triton_available()


def hybrid_tree_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    prefix_len: int,
    tree_mask: torch.Tensor,
    scale: float,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """q `[B, Hq, n, D]`; caches `[B, Hkv, S, D]` whose slots `[prefix_len, prefix_len + n)` hold the tree's
    keys/values; tree_mask bool `[n, n]` (True = row may attend column) -> `[B, Hq, n, D]` in q's dtype,
    written into `out` when given (any strides, e.g. a transposed view)."""
    if uses_triton(q.device):
        result = triton_hybrid_tree_attention(q, k_cache, v_cache, prefix_len, tree_mask, scale, out=out)
    else:
        result = reference.hybrid_tree_attention(q, k_cache, v_cache, prefix_len, tree_mask, scale)
    if out is None:
        return result
    if result is not out:
        out.copy_(result)
    return out


def triton_hybrid_tree_attention(q, k_cache, v_cache, prefix_len, tree_mask, scale, *, out=None, prefix="auto"):
    """The GPU path; `prefix` = auto | triton | flash picks the prefix kernel (tests pin it)."""
    from specchat.kernels.attention.decode_attention import merge_partials, prefix_partials
    from specchat.kernels.attention.flash_decoding import flash_attn_available, flash_prefix_attention
    from specchat.kernels.attention.tree_attention import fused_mask_attn

    n = q.shape[2]
    out = torch.empty_like(q) if out is None else out
    tree = slice(prefix_len, prefix_len + n)
    o_tree, lse_tree = fused_mask_attn(q, k_cache[:, :, tree], v_cache[:, :, tree], tree_mask, scale)
    if prefix_len == 0:
        return out.copy_(o_tree)
    if prefix == "flash" or (prefix == "auto" and flash_attn_available()):
        o_prefix, lse_prefix = flash_prefix_attention(q, k_cache, v_cache, prefix_len, scale)
        merged, _ = reference.merge_attention(o_prefix.float(), lse_prefix, o_tree, lse_tree)
        return out.copy_(merged)
    o_part, lse_part = prefix_partials(q, k_cache, v_cache, prefix_len, scale)
    return merge_partials(o_part, lse_part, out, tree=(o_tree, lse_tree))
