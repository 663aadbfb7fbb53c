"""Attention functions with transformers' signature that verify trees through a tree-attention kernel.

Registered as "specchat_hybrid" (hybrid tree attention) and "specchat_canonical" (canonical tree attention)
by specchat/engine/attention.py, they let stock models verify trees without vendored modeling code. The engine tells it a forward is a tree verification by passing, as the model's
`attention_mask`, a 4-D bool mask exactly as wide as the query (`[1, 1, n, n]`): the tree's ancestor mask,
with the whole cached prefix visible. transformers hands such a mask through untouched. A single query
without a mask (a decode step) is a one-node tree. Anything else (prefill, generic masks) goes to SDPA.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from specchat.kernels.canonical_attention import canonical_tree_attention
from specchat.kernels.hybrid import hybrid_tree_attention


def tree_attention_forward(tree_attention):
    """transformers' attention function for a kernel with `hybrid_tree_attention`'s signature."""

    def forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
        return _forward(tree_attention, query, key, value, attention_mask, scaling)

    return forward


def _forward(
    tree_attention,
    query: torch.Tensor,  # [B, Hq, q_len, D]
    key: torch.Tensor,  # [B, Hkv, kv_len, D]: the cache's view, this forward's tokens last
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
) -> tuple[torch.Tensor, None]:
    batch, heads, q_len, dim = query.shape
    kv_len = key.shape[2]
    scale = dim**-0.5 if scaling is None else scaling
    tree_mask = _tree_mask(attention_mask, q_len, query.device)
    if tree_mask is None:
        return _sdpa(query, key, value, attention_mask, scale), None
    out = query.new_empty(batch, q_len, heads, dim)  # transformers' output layout, filled through a view
    tree_attention(query, key, value, kv_len - q_len, tree_mask, scale, out=out.transpose(1, 2))
    return out, None


hybrid_attention_forward = tree_attention_forward(hybrid_tree_attention)
canonical_attention_forward = tree_attention_forward(canonical_tree_attention)


def _tree_mask(attention_mask: torch.Tensor | None, q_len: int, device: torch.device) -> torch.Tensor | None:
    if attention_mask is None:
        return _one_node(device) if q_len == 1 else None
    if attention_mask.dtype == torch.bool and attention_mask.shape[-2:] == (q_len, q_len):
        return attention_mask[0, 0]
    return None


@functools.cache
def _one_node(device: torch.device) -> torch.Tensor:
    """The tree of a decode step, one object per device: kernels may key per-forward work on it."""
    return torch.ones(1, 1, dtype=torch.bool, device=device)


def _sdpa(query, key, value, attention_mask, scale) -> torch.Tensor:
    q_len, kv_len = query.shape[2], key.shape[2]
    causal = attention_mask is None and q_len > 1
    if causal and kv_len > q_len:  # SDPA's is_causal aligns top-left; a cached prefix needs bottom-right
        attention_mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).tril(kv_len - q_len)
        causal = False
    elif attention_mask is not None:
        attention_mask = attention_mask[..., :kv_len]
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, is_causal=causal, scale=scale, enable_gqa=True
    )
    return out.transpose(1, 2).contiguous()
