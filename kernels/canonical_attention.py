"""Tree attention whose result for a query depends only on its position and the keys it sees.

Exact speculative decoding needs a verified node's logits to be bitwise what a decode step at that node's
position computes. Fused attention kernels do not give that: their sums run in blocks laid over the call's
keys and queries, so a node whose ancestors sit in scattered tree slots, among masked siblings, next to other
query rows, sums in another order than the same token decoded alone. Here every query at position t sums in
one order, fixed by t alone:

- the committed keys [0, s) with s = max(0, (t - TAIL) // CHUNK * CHUNK), read in place from the cache;
- its last t - s + 1 keys (the rest of the prefix, then its ancestors in depth order, itself last), gathered
  into a row of fixed width TAIL + CHUNK, padding masked;

each part with a max-subtracted softmax whose sums run over exactly those keys, merged by log-sum-exp. A
decode step is the one-node case of the same computation. The matmuls run in the activation dtype (bf16 or
fp16, whose CPU matmuls are row-independent: tests/test_canonical_attention.py), softmax and merge in fp32.
Trees may be up to TAIL deep.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

CHUNK = 64  # split points move in steps of CHUNK positions: a tree's rows share at most a few of them
TAIL = 64  # the deepest tree (MAX_BUDGET nodes): every row's split point lies in the committed prefix


def canonical_tree_attention(q, k_cache, v_cache, prefix_len: int, tree_mask: torch.Tensor, scale: float,
                             *, out: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """q [1, Hq, n, D]; caches [1, Hkv, S, D] whose slots [prefix_len, prefix_len + n) hold the rows' own keys;
    tree_mask [n, n] bool (row i attends tree slot j, itself included) -> [1, Hq, n, D]."""
    batch, heads, rows, dim = q.shape
    kv_heads = k_cache.shape[1]
    if batch != 1:
        raise ValueError("canonical attention verifies one sequence at a time (batch 1)")
    plan = _plan(tree_mask, prefix_len)
    k, v = k_cache[0], v_cache[0]
    q = q[0].reshape(kv_heads, heads // kv_heads, rows, dim)
    acc, top, total = _tail(q, k[:, plan.slots], v[:, plan.slots], plan.valid, scale)
    for split, chosen in plan.heads:  # these rows also see the committed keys [0, split)
        head = _head(q[:, :, chosen], k[:, :split], v[:, :split], scale)
        acc[:, :, chosen], top[:, :, chosen], total[:, :, chosen] = _merge(
            head, (acc[:, :, chosen], top[:, :, chosen], total[:, :, chosen])
        )
    result = (acc / total[..., None]).to(q.dtype).reshape(1, heads, rows, dim)
    if out is None:
        return result
    return out.copy_(result)


@dataclass(frozen=True)
class _Plan:
    """Where each row's keys are: the same for every layer of a forward."""

    slots: torch.Tensor  # [rows, TAIL + CHUNK] cache slot of each tail key (0 where padding)
    valid: torch.Tensor  # [rows, TAIL + CHUNK] False on padding
    heads: list[tuple[int, torch.Tensor]]  # (split point, the rows with it), for split points > 0


@functools.lru_cache(maxsize=1)  # keyed by the mask object, which the cache keeps alive: one entry a forward
def _plan(tree_mask: torch.Tensor, prefix_len: int) -> _Plan:
    rows = tree_mask.shape[0]
    depth = tree_mask.sum(-1) - 1  # ancestors in the tree, root included
    if int(depth.max()) > TAIL:
        raise ValueError(f"canonical attention verifies trees up to {TAIL} deep")
    position = prefix_len + depth
    split = ((position - TAIL).clamp_min(0) // CHUNK) * CHUNK
    logical = split[:, None] + torch.arange(TAIL + CHUNK, device=tree_mask.device)  # [rows, width] positions
    ancestors = torch.sort((~tree_mask).to(torch.int8), dim=-1, stable=True).indices  # own tree slots first
    in_tree = (logical - prefix_len).clamp(0, rows - 1)
    slots = torch.where(logical < prefix_len, logical, prefix_len + ancestors.gather(1, in_tree))
    valid = logical <= position[:, None]
    heads = [(s, (split == s).nonzero()[:, 0]) for s in split.unique().tolist() if s]
    return _Plan(torch.where(valid, slots, 0), valid, heads)


def _head(q, k, v, scale):
    """Softmax parts over the committed keys [0, s): q [Hkv, g, m, D]; k, v [Hkv, s, D]."""
    kv_heads, group, rows, dim = q.shape
    scores = (q.reshape(kv_heads, group * rows, dim) @ k.transpose(-1, -2)).float() * scale
    top = scores.amax(-1)
    weights = torch.exp(scores - top[..., None])
    total = weights.sum(-1)
    out = (weights.to(v.dtype) @ v).float()
    shape = (kv_heads, group, rows)
    return out.view(*shape, dim), top.view(shape), total.view(shape)


def _tail(q, keys, values, valid, scale):
    """Softmax parts over each row's keys [split, position], gathered: keys, values [Hkv, rows, width, D]."""
    scores = (q.transpose(1, 2) @ keys.transpose(-1, -2)).float() * scale  # [Hkv, rows, g, width]
    scores = scores.masked_fill(~valid[None, :, None], float("-inf"))
    top = scores.amax(-1)
    weights = torch.exp(scores - top[..., None])
    total = weights.sum(-1)
    out = (weights.to(values.dtype) @ values).float()  # [Hkv, rows, g, D]
    return out.transpose(1, 2), top.transpose(1, 2), total.transpose(1, 2)


def _merge(first, second):
    """One (unnormalised output, max, sum) softmax part from two over disjoint keys."""
    out_a, max_a, sum_a = first
    out_b, max_b, sum_b = second
    top = torch.maximum(max_a, max_b)
    wa, wb = torch.exp(max_a - top), torch.exp(max_b - top)
    return out_a * wa[..., None] + out_b * wb[..., None], top, sum_a * wa + sum_b * wb
