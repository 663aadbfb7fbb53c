"""Hybrid tree attention that a CUDA graph can replay at any context length.

`hybrid.py`'s kernels take the committed length as a host integer and size their split-KV grid from it, so a
captured launch would be frozen at one length. Here the length is read on the device (an int32 tensor the
cache owns) and the grid depends only on shapes: `splits` programs per row block and KV head share the prefix
`[0, length)` in whole key blocks (a split past the length exits with an empty partial), and one more program
per row block takes the tree slots `[length, length + n)` under the tree mask. Pass 2 reduces the `splits + 1`
partials by LSE into `[n, Hq, D]`, the layout the output projection reads. Two launches per layer, one graph for
every length up to the cache's capacity.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specchat.kernels.attention.configs import dot_dtype, interpreting, prefix_config
from specchat.kernels.attention.decode_attention import MAX_SPLITS, _sm_count

LOG2E = 1.4426950408889634
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _online_step(m_i, l_i, acc, s, v, DOT: tl.constexpr):
    """Fold one key block's scores `s` (log2 units, -inf where not seen) and values into the running softmax."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(DOT), v.to(DOT), input_precision="ieee")
    return m_new, l_i, acc


@triton.jit
def _partials_kernel(
    Q, K, V, Mask, Length, OP, LP,
    s_qm, s_qh, s_qd,
    s_kh, s_kn, s_kd,
    s_vh, s_vn, s_vd,
    s_mm, s_mn,
    s_oh, s_os, s_om,
    s_lh, s_ls,
    n, group, head_dim, splits, scale_log2,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    block = tl.program_id(0)
    split = tl.program_id(1)  # splits: the tree part
    kv_h = tl.program_id(2)
    length = tl.load(Length)
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)  # row r = (query head within the group, query)
    row_ok = rows < group * n
    h = kv_h * group + rows // n
    i = rows % n
    cols = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < head_dim
    k_base = K + kv_h * s_kh + dims[:, None] * s_kd
    v_base = V + kv_h * s_vh + dims[None, :] * s_vd

    q = tl.load(
        Q + i[:, None] * s_qm + h[:, None] * s_qh + dims[None, :] * s_qd,
        mask=row_ok[:, None] & dim_ok[None, :], other=0.0,
    )  # fmt: skip
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if split < splits:  # the prefix: no mask, the lean loop of a compute-bound kernel at many rows
        split_len = tl.cdiv(tl.cdiv(length, splits), BLOCK_N) * BLOCK_N
        start = split * split_len
        end = tl.minimum(start + split_len, length)
        for key_start in range(start, end, BLOCK_N):
            keys = key_start + cols
            key_ok = keys < end
            k = tl.load(k_base + keys[None, :] * s_kn, mask=key_ok[None, :] & dim_ok[:, None], other=0.0)
            v = tl.load(v_base + keys[:, None] * s_vn, mask=key_ok[:, None] & dim_ok[None, :], other=0.0)
            s = tl.dot(q.to(DOT), k.to(DOT), input_precision="ieee") * scale_log2
            m_i, l_i, acc = _online_step(m_i, l_i, acc, tl.where(key_ok[None, :], s, float("-inf")), v, DOT)
    else:  # the tree slots after the prefix, under the tree mask
        for key_start in tl.range(0, n, BLOCK_N, num_stages=1):  # short: no pipeline buffers beside the prefix loop's
            cols_in = key_start + cols
            key_ok = cols_in < n
            keys = length + cols_in
            k = tl.load(k_base + keys[None, :] * s_kn, mask=key_ok[None, :] & dim_ok[:, None], other=0.0)
            v = tl.load(v_base + keys[:, None] * s_vn, mask=key_ok[:, None] & dim_ok[None, :], other=0.0)
            seen = tl.load(
                Mask + i[:, None] * s_mm + cols_in[None, :] * s_mn, mask=row_ok[:, None] & key_ok[None, :], other=0
            )
            s = tl.dot(q.to(DOT), k.to(DOT), input_precision="ieee") * scale_log2
            m_i, l_i, acc = _online_step(m_i, l_i, acc, tl.where(seen != 0, s, float("-inf")), v, DOT)

    empty = l_i == 0.0  # a split past the length, or a padding row
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * LN2)
    base = h * s_oh + split * s_os + i * s_om
    tl.store(OP + base[:, None] + dims[None, :], out, mask=row_ok[:, None] & dim_ok[None, :])
    tl.store(LP + h * s_lh + split * s_ls + i, lse, mask=row_ok)


@triton.jit
def _reduce_kernel(
    OP, LP, Out,
    s_oh, s_os, s_om,
    s_lh, s_ls,
    s_xm, s_xh, s_xd,
    parts, head_dim,
    PARTS: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    i = tl.program_id(0)
    h = tl.program_id(1)
    part = tl.arange(0, PARTS)
    dims = tl.arange(0, BLOCK_D)
    part_ok = part < parts
    dim_ok = dims < head_dim
    lse = tl.load(LP + h * s_lh + part * s_ls + i, mask=part_ok, other=float("-inf"))
    top = tl.max(lse, 0)
    top = tl.where(top == float("-inf"), 0.0, top)  # the tree part holds the row's own key: never all empty
    weights = tl.exp(lse - top)
    o = tl.load(
        OP + h * s_oh + part[:, None] * s_os + i * s_om + dims[None, :],
        mask=part_ok[:, None] & dim_ok[None, :], other=0.0,
    )  # fmt: skip
    out = tl.sum(weights[:, None] * o, 0) / tl.sum(weights, 0)
    tl.store(Out + i * s_xm + h * s_xh + dims * s_xd, out.to(Out.dtype.element_ty), mask=dim_ok)


def graph_splits(device: torch.device, rows: int, kv_heads: int, head_dim: int, capacity: int) -> int:
    """Prefix splits for `rows` = group * n query rows: eight programs per SM at any length (as `prefix_partials`
    picks them), never more splits than key blocks in the capacity, and with the tree part at most 64 partials
    for pass 2 to hold. A function of shapes only."""
    config = prefix_config(device, head_dim, rows)
    programs_per_split = triton.cdiv(rows, config.block_m) * kv_heads
    target = 4 if interpreting() else 8 * _sm_count(device)
    return max(1, min(MAX_SPLITS - 1, triton.cdiv(target, programs_per_split), triton.cdiv(capacity, config.block_n)))


def graph_tree_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    length: torch.Tensor,
    tree_mask: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """q `[n, Hq, D]` (rotated); k/v caches `[Hkv, capacity, D]` whose slots `[length, length + n)` hold this
    forward's keys/values; `length` an int32 tensor `[1]` on q's device; tree_mask bool `[n, n]`, True on its
    diagonal -> `[n, Hq, D]` in q's dtype."""
    n, heads, dim = q.shape
    kv_heads, capacity = k_cache.shape[0], k_cache.shape[1]
    group = heads // kv_heads
    rows = group * n
    config = prefix_config(q.device, dim, rows)
    splits = graph_splits(q.device, rows, kv_heads, dim, capacity)
    block_d = triton.next_power_of_2(max(dim, 16))
    o_part = torch.empty(heads, splits + 1, n, dim, dtype=torch.float32, device=q.device)
    lse_part = torch.empty(heads, splits + 1, n, dtype=torch.float32, device=q.device)
    _partials_kernel[(triton.cdiv(rows, config.block_m), splits + 1, kv_heads)](
        q, k_cache, v_cache, tree_mask, length, o_part, lse_part,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *tree_mask.stride(),
        *o_part.stride()[:3], *lse_part.stride()[:2],
        n, group, dim, splits, scale * LOG2E,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_D=block_d, DOT=dot_dtype(q.dtype),
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    out = torch.empty_like(q)
    _reduce_kernel[(n, heads)](
        o_part, lse_part, out,
        *o_part.stride()[:3], *lse_part.stride()[:2], *out.stride(),
        splits + 1, dim,
        PARTS=triton.next_power_of_2(splits + 1), BLOCK_D=block_d,
    )  # fmt: skip
    return out
