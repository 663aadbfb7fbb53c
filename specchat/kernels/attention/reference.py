"""Torch reference of hybrid tree attention: the CPU path and the oracle every kernel is tested against.

Shapes follow docs/design.md, "Tree attention": queries `[B, Hq, n, D]`, keys/values `[B, Hkv, S, D]`
with `Hq = group * Hkv`. Query heads are folded into their KV group (`[B, Hkv, group * n, D]`) so K/V are
never repeated. Every function returns the output in fp32 with its log-sum-exp (natural log, fp32,
`[B, Hq, n]`); a row whose key set is empty has output 0 and LSE -inf, so merging it changes nothing.
"""

from __future__ import annotations

import torch


def prefix_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float):
    """Every query attends to all of `k`/`v` (the committed prefix): no mask."""
    return _attention(q, k, v, None, scale)


def tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tree_mask: torch.Tensor, scale: float):
    """Query i attends to tree key j iff `tree_mask[i, j]` (its ancestors and itself)."""
    return _attention(q, k, v, tree_mask, scale)


def merge_attention(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor):
    """Attention over the union of two disjoint key sets from each set's output and LSE."""
    lse = torch.logaddexp(lse_a, lse_b)
    w_a = torch.exp(lse_a - lse).nan_to_num(0.0)  # both sets empty: -inf - -inf
    w_b = torch.exp(lse_b - lse).nan_to_num(0.0)
    return w_a[..., None] * o_a + w_b[..., None] * o_b, lse


def hybrid_tree_attention(q, k_cache, v_cache, prefix_len: int, tree_mask: torch.Tensor, scale: float):
    """Prefix part without a mask, tree part with the ancestor mask, merged by LSE -> `[B, Hq, n, D]`."""
    n = q.shape[2]
    tree = slice(prefix_len, prefix_len + n)
    out, lse = tree_attention(q, k_cache[:, :, tree], v_cache[:, :, tree], tree_mask, scale)
    if prefix_len:
        o_p, lse_p = prefix_attention(q, k_cache[:, :, :prefix_len], v_cache[:, :, :prefix_len], scale)
        out, lse = merge_attention(o_p, lse_p, out, lse)
    return out.to(q.dtype)


def _attention(q, k, v, mask, scale):
    batch, heads, n, dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    qg = q.float().reshape(batch, kv_heads, group * n, dim)
    scores = qg @ k.float().transpose(-1, -2) * scale  # [B, Hkv, group * n, keys]
    if mask is not None:
        scores = scores.masked_fill(~mask.repeat(group, 1), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse[..., None]).nan_to_num(0.0)  # empty rows: all -inf
    out = probs @ v.float()
    return out.reshape(batch, heads, n, -1), lse.reshape(batch, heads, n)
