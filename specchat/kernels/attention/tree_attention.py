"""Triton `fused_mask_attn`: the tree part of hybrid attention.

Queries are the n verification tokens, keys/values the same n tree slots of the cache, and a boolean
ancestor mask says who sees whom. Each program owns BLOCK_M queries of one query head and streams the tree's
keys with an online softmax; K/V are read from the query head's KV head (GQA without repeating them).
Returns O (fp32) and LSE (natural log, fp32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specchat.kernels.attention.configs import dot_dtype, tree_config

LOG2E = 1.4426950408889634
LN2 = tl.constexpr(0.6931471805599453)  # read inside kernels: a global there must be a constexpr


@triton.jit
def _tree_attention_kernel(
    Q, K, V, Mask, O, LSE,
    s_qb, s_qh, s_qm, s_qd,
    s_kb, s_kh, s_kn, s_kd,
    s_vb, s_vh, s_vn, s_vd,
    s_mm, s_mn,
    s_ob, s_oh, s_om, s_od,
    s_lb, s_lh, s_lm,
    n, heads, group, head_dim, scale_log2,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    block = tl.program_id(0)
    b = tl.program_id(1) // heads
    h = tl.program_id(1) % heads
    kv_h = h // group
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    row_ok = rows < n
    dim_ok = dims < head_dim

    q = tl.load(
        Q + b * s_qb + h * s_qh + rows[:, None] * s_qm + dims[None, :] * s_qd,
        mask=row_ok[:, None] & dim_ok[None, :], other=0.0,
    )  # fmt: skip
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(0, n, BLOCK_N):
        keys = start + cols
        key_ok = keys < n
        k = tl.load(
            K + b * s_kb + kv_h * s_kh + keys[None, :] * s_kn + dims[:, None] * s_kd,
            mask=key_ok[None, :] & dim_ok[:, None], other=0.0,
        )  # fmt: skip
        allowed = tl.load(
            Mask + rows[:, None] * s_mm + keys[None, :] * s_mn, mask=row_ok[:, None] & key_ok[None, :], other=0
        )
        s = tl.dot(q.to(DOT), k.to(DOT), input_precision="ieee") * scale_log2
        s = tl.where(allowed != 0, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        v = tl.load(
            V + b * s_vb + kv_h * s_vh + keys[:, None] * s_vn + dims[None, :] * s_vd,
            mask=key_ok[:, None] & dim_ok[None, :], other=0.0,
        )  # fmt: skip
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT), v.to(DOT), input_precision="ieee")
        m_i = m_new

    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * LN2)
    tl.store(
        O + b * s_ob + h * s_oh + rows[:, None] * s_om + dims[None, :] * s_od, out,
        mask=row_ok[:, None] & dim_ok[None, :],
    )  # fmt: skip
    tl.store(LSE + b * s_lb + h * s_lh + rows * s_lm, lse, mask=row_ok)


def fused_mask_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tree_mask: torch.Tensor, scale: float):
    """q `[B, Hq, n, D]`, k/v `[B, Hkv, n, D]` (any strides), tree_mask `[n, n]` bool
    -> (O `[B, Hq, n, D]` fp32, LSE `[B, Hq, n]` fp32)."""
    batch, heads, n, dim = q.shape
    kv_heads = k.shape[1]
    out = torch.empty(batch, heads, n, dim, dtype=torch.float32, device=q.device)
    lse = torch.empty(batch, heads, n, dtype=torch.float32, device=q.device)
    config = tree_config(q.device, dim)
    grid = (triton.cdiv(n, config.block_m), batch * heads)
    _tree_attention_kernel[grid](
        q, k, v, tree_mask, out, lse,
        *q.stride(), *k.stride(), *v.stride(), *tree_mask.stride(), *out.stride(), *lse.stride(),
        n, heads, heads // kv_heads, dim, scale * LOG2E,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_D=triton.next_power_of_2(max(dim, 16)),
        DOT=dot_dtype(q.dtype), num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    return out, lse
