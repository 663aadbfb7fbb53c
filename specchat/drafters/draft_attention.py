"""Attention of a draft's rows over keys it reads: a few rows, or a prompt's worth, each the fastest way."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from specchat.engine.decoder_ops import op

FEW_ROWS = 32  # attention over at most this many rows is plain matmuls


def attend(q, keys, values, mask, cap: float = 0.0) -> torch.Tensor:
    """q [H, q, D] over keys / values [Hkv, k, D] (grouped heads), mask [q, k] (True = visible) or None ->
    [H, q, D]; a row that sees no key gets zeros. With `cap`, scores are soft-capped (cap * tanh(s / cap), Gemma 2's),
    which SDPA does not do: rows go through the matmuls FEW_ROWS at a time.

    A few rows (a draft step) are two batched matmuls: SDPA's CPU kernel costs 15x more at one row over 7K
    keys (3.0 vs 0.2 ms), about the same at 32 to 64 rows. The scores are K q^T: q K^T copied a view of the
    target's cache to K^T first, 2.4x the time at 30K keys. More rows (catching up a prompt) go through SDPA,
    which never holds the whole score matrix.
    """
    heads, rows, dim = q.shape
    kv, count = keys.shape[:2]
    if count == 0:
        return torch.zeros_like(q)
    if rows > FEW_ROWS and cap:
        pieces = [attend(q[:, i : i + FEW_ROWS], keys, values, None if mask is None else mask[i : i + FEW_ROWS], cap)
                  for i in range(0, rows, FEW_ROWS)]  # fmt: skip
        return torch.cat(pieces, dim=1)
    if rows > FEW_ROWS:
        out = F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=mask, enable_gqa=True)[0]
        return out if mask is None else out.masked_fill(~mask.any(dim=-1)[None, :, None], 0)
    scores = torch.bmm(keys, q.reshape(kv, -1, dim).transpose(1, 2)).transpose(1, 2)  # [kv, group * q, k]
    scores = scores.float() * dim**-0.5
    if cap:
        scores = torch.tanh(scores / cap) * cap
    if mask is not None:
        scores = scores.view(kv, -1, rows, count).masked_fill(~mask, -math.inf).view(kv, -1, count)
    probs = scores.softmax(dim=-1)
    if mask is not None:
        probs = probs.nan_to_num(0.0)  # rows that see nothing
    return torch.bmm(probs.to(values.dtype), values).view(heads, rows, dim)


def attend_prefix(q, cache_keys, cache_values, length: torch.Tensor) -> torch.Tensor:
    """q [H, q, D] over the first `length` (an int32 tensor [1] on q's device) of whole caches [Hkv, capacity, D] ->
    [H, q, D], zeros where `length` is 0: the target's cache read by a CUDA graph replayed at any length (its
    programs past the length exit, so a short context reads no more than it holds)."""
    return _prefix_attention(q.transpose(0, 1), cache_keys, cache_values, length).transpose(0, 1)


@op("prefix_attention")
def _prefix_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
    """q [n, H, D] over the first `length` slots of keys / values [Hkv, capacity, D] -> [n, H, D]: on a CPU (where no
    graph replays) the slots are read to the length as `attend` reads them; on CUDA the graph kernel reads them."""
    count = int(length)
    out = attend(q.transpose(0, 1), keys[:, :count], values[:, :count], None)
    return out.transpose(0, 1).contiguous()


@_prefix_attention.register_kernel("cuda")
def _(q, keys, values, length):
    from specchat.kernels.attention.graph_attention import graph_prefix_attention  # Triton

    return graph_prefix_attention(q, keys, values, length, q.shape[-1] ** -0.5)


@_prefix_attention.register_fake
def _(q, keys, values, length):
    return torch.empty_like(q)
