"""Tree attention whose result for a query depends only on its position and the keys it sees.

Exact speculative decoding needs a verified node's logits to be bitwise what a decode step at that node's
position computes. Fused attention kernels do not give that: their sums run in blocks laid over the call's
keys and queries, so a node whose ancestors sit in scattered tree slots, among masked siblings, next to other
query rows, sums in another order than the same token decoded alone. Here every query at position t sums in
one order, fixed by t alone:

- the committed keys [0, s) with s = max(0, (t - TAIL) // CHUNK * CHUNK), read in place from the cache;
- its last t - s + 1 keys (the rest of the prefix, then its ancestors in depth order, itself last), gathered
  into a row of fixed width TAIL + CHUNK, padding masked;

one softmax over the two parts' scores side by side (padding at -inf), then one product with each part's
values. A decode step is the one-node case of the same computation. The matmuls run in the activation dtype
(bf16 or fp16, whose CPU matmuls are row-independent), the softmax in fp32: tests/test_canonical_attention.py
checks every row of random trees against the decode step at its position, bit for bit.

A decode step of a small model is a few microseconds of arithmetic per layer, so what it costs is the number
of torch calls: a decode step makes about ten a layer, and rows that share a split point (all of them, but for trees
that straddle one) are computed together. Trees may be up to TAIL deep.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

CHUNK = 64  # split points move in steps of CHUNK positions: a tree's rows share at most a few of them
TAIL = 64  # the deepest tree (MAX_BUDGET nodes): every row's split point lies in the committed prefix
WIDTH = TAIL + CHUNK  # keys in a row's gathered tail, padding included


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
    q = q[0].view(kv_heads, heads // kv_heads, rows, dim).transpose(1, 2)  # [Hkv, rows, g, D]
    if len(plan.splits) == 1:
        split = plan.splits[0]
        wide_k, wide_v = (_widened(k, split + WIDTH), _widened(v, split + WIDTH)) if plan.chain else (None, None)
        if wide_k is not None and wide_v is not None:
            result = _attend(q, wide_k, wide_v, plan.slots, plan.padding, split, scale, in_place=True)
        else:
            result = _attend(q, k, v, plan.slots, plan.padding, split, scale, in_place=False)
    else:  # a tree across a split point: each set of rows on its own
        result = q.new_empty(q.shape)
        for split, chosen in zip(plan.splits, plan.rows):
            result[:, chosen] = _attend(q[:, chosen], k, v, plan.slots[chosen], plan.padding[chosen], split, scale,
                                        in_place=False)
    result = result.transpose(1, 2).reshape(1, heads, rows, dim)
    return result if out is None else out.copy_(result)


@dataclass(frozen=True)
class _Plan:
    """Where each row's keys are: the same for every layer of a forward."""

    slots: torch.Tensor  # [rows, WIDTH] cache slot of each tail key (0 where padding)
    padding: torch.Tensor  # [rows, 1, WIDTH] True where a tail key is padding
    splits: list[int]  # the split points of the rows, ascending
    rows: list[torch.Tensor]  # the rows with each split point (when there are several)
    chain: bool  # every row's keys lie in place: row i in slot prefix_len + i, its ancestors right before it


@functools.lru_cache(maxsize=1)  # keyed by the mask object, which the cache keeps alive: one entry a forward
def _plan(tree_mask: torch.Tensor, prefix_len: int) -> _Plan:
    rows = tree_mask.shape[0]
    depth = tree_mask.sum(-1) - 1  # ancestors in the tree, root included
    if int(depth.max()) > TAIL:
        raise ValueError(f"canonical attention verifies trees up to {TAIL} deep")
    position = prefix_len + depth
    split = ((position - TAIL).clamp_min(0) // CHUNK) * CHUNK
    logical = split[:, None] + torch.arange(WIDTH, device=tree_mask.device)  # [rows, WIDTH] positions
    ancestors = torch.sort((~tree_mask).to(torch.int8), dim=-1, stable=True).indices  # own tree slots first
    in_tree = (logical - prefix_len).clamp(0, rows - 1)
    slots = torch.where(logical < prefix_len, logical, prefix_len + ancestors.gather(1, in_tree))
    padding = logical > position[:, None]
    splits = split.unique().tolist()
    chosen = [(split == s).nonzero()[:, 0] for s in splits] if len(splits) > 1 else []
    chain = bool(torch.equal(tree_mask, torch.ones_like(tree_mask).tril()))
    return _Plan(slots.masked_fill(padding, 0), padding[:, None], splits, chosen, chain)


def _widened(x: torch.Tensor, slots: int) -> torch.Tensor | None:
    """x [Hkv, S, D], a view of a cache, seen with `slots` slots when the cache holds them, else None.

    The attention gets the cache cut at the forward's last key; a chain's tails run past it into slots the
    cache preallocated (their stale keys are masked)."""
    heads, length, dim = x.shape
    if slots <= length:
        return x[:, :slots]
    last = x.storage_offset() + (heads - 1) * x.stride(0) + (slots - 1) * x.stride(1) + (dim - 1) * x.stride(2)
    if slots * x.stride(1) > x.stride(0) or last >= x.untyped_storage().nbytes() // x.element_size():
        return None
    return x.as_strided((heads, slots, dim), x.stride())


def _attend(q, k, v, slots, padding, split: int, scale: float, in_place: bool) -> torch.Tensor:
    """Rows with one split point: q [Hkv, m, g, D]; k, v [Hkv, S, D] -> [Hkv, m, g, D].

    Scores of the committed keys [0, split) and of each row's tail sit side by side in one row per query, so
    one softmax covers both. When the tails lie in place (a chain: a decode step, an n-gram draft),
    they are read from the cache where they are, in the same product as the committed keys."""
    kv_heads, m, group, dim = q.shape
    flat = q.reshape(kv_heads, m * group, dim)
    if in_place:
        tail_v = v[:, split : split + WIDTH]
        scores = (flat @ k[:, : split + WIDTH].transpose(-1, -2)).view(kv_heads, m, group, split + WIDTH)
        scores[..., split:].masked_fill_(padding, float("-inf"))
    else:
        tail_k, tail_v = k[:, slots], v[:, slots]  # [Hkv, m, WIDTH, D]
        scores = (q @ tail_k.transpose(-1, -2)).masked_fill_(padding, float("-inf"))  # [Hkv, m, g, WIDTH]
        if split:
            head = flat @ k[:, :split].transpose(-1, -2)
            scores = torch.cat([head.view(kv_heads, m, group, split), scores], dim=-1)
    probs = torch.softmax(scores.float().mul_(scale), dim=-1).to(q.dtype)
    if in_place:
        out = (probs[..., split:].reshape(kv_heads, m * group, WIDTH) @ tail_v).view(q.shape)
    else:
        out = probs[..., split:] @ tail_v
    if split:
        out += (probs[..., :split].reshape(kv_heads, m * group, split) @ v[:, :split]).view(out.shape)
    return out
