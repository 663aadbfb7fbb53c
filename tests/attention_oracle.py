"""Dense masked softmax attention and random trees: the plain definitions kernels are checked against."""

from __future__ import annotations

import torch


def random_tree_mask(n: int, generator: torch.Generator) -> torch.Tensor:
    """[n, n] ancestor mask of a random tree over n verification tokens (row 0 = the root)."""
    mask = torch.eye(n, dtype=torch.bool)
    for i in range(1, n):
        parent = int(torch.randint(0, i, (), generator=generator))
        mask[i] |= mask[parent]
    return mask


def dense_attention(q, k, v, prefix_len: int, tree_mask: torch.Tensor, scale: float) -> torch.Tensor:
    """Softmax attention with K/V repeated per query head and one dense mask over prefix + tree."""
    heads, n = q.shape[1], q.shape[2]
    group = heads // k.shape[1]
    keys = k[:, :, : prefix_len + n].double().repeat_interleave(group, dim=1)
    values = v[:, :, : prefix_len + n].double().repeat_interleave(group, dim=1)
    mask = torch.cat([torch.ones(n, prefix_len, dtype=torch.bool), tree_mask], dim=1)
    scores = (q.double() @ keys.transpose(-1, -2) * scale).masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ values
