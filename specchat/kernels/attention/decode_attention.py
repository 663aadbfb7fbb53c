"""Triton split-KV flash decoding: the prefix part of hybrid attention, and the LSE merge.

The prefix is long (up to 100K+ keys) and needs no mask, while the queries are few (the n tree tokens).
Pass 1 splits the keys across programs so the whole GPU streams the KV cache once; each program takes
BLOCK_M query rows of one KV group (the group's query heads packed together, so K/V are read once per group,
never repeated) and writes a partial output and LSE for its split. Pass 2 reduces the splits by LSE and,
when given the tree part's output and LSE, folds it in as one more partial: that is the hybrid merge.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from specchat.kernels.attention.configs import dot_dtype, interpreting, prefix_config

LOG2E = 1.4426950408889634
LN2 = tl.constexpr(0.6931471805599453)  # read inside kernels: a global there must be a constexpr
MAX_SPLITS = 64


@triton.jit
def _prefix_split_kernel(
    Q, K, V, OP, LP,
    s_qb, s_qh, s_qm, s_qd,
    s_kb, s_kh, s_kn, s_kd,
    s_vb, s_vh, s_vn, s_vd,
    s_ob, s_oh, s_os, s_om, s_od,
    s_lb, s_lh, s_ls, s_lm,
    n, kv_heads, group, head_dim, prefix_len, split_len, scale_log2,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    block = tl.program_id(0)
    split = tl.program_id(1)
    b = tl.program_id(2) // kv_heads
    kv_h = tl.program_id(2) % kv_heads
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)  # row r = (query head within the group, query)
    row_ok = rows < group * n
    h = kv_h * group + rows // n
    i = rows % n
    cols = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < head_dim

    q = tl.load(
        Q + b * s_qb + h[:, None] * s_qh + i[:, None] * s_qm + dims[None, :] * s_qd,
        mask=row_ok[:, None] & dim_ok[None, :], other=0.0,
    )  # fmt: skip
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    start = split * split_len
    end = tl.minimum(start + split_len, prefix_len)
    for key_start in range(start, end, BLOCK_N):
        keys = key_start + cols
        key_ok = keys < end
        k = tl.load(
            K + b * s_kb + kv_h * s_kh + keys[None, :] * s_kn + dims[:, None] * s_kd,
            mask=key_ok[None, :] & dim_ok[:, None], other=0.0,
        )  # fmt: skip
        v = tl.load(
            V + b * s_vb + kv_h * s_vh + keys[:, None] * s_vn + dims[None, :] * s_vd,
            mask=key_ok[:, None] & dim_ok[None, :], other=0.0,
        )  # fmt: skip
        s = tl.dot(q.to(DOT), k.to(DOT), input_precision="ieee") * scale_log2
        s = tl.where(key_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])  # every split holds at least one key: m_new is finite
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT), v.to(DOT), input_precision="ieee")
        m_i = m_new

    base = b * s_ob + h * s_oh + split * s_os + i * s_om
    tl.store(OP + base[:, None] + dims[None, :] * s_od, acc / l_i[:, None], mask=row_ok[:, None] & dim_ok[None, :])
    lse = (m_i + tl.log2(l_i)) * LN2
    tl.store(LP + b * s_lb + h * s_lh + split * s_ls + i * s_lm, lse, mask=row_ok)


@triton.jit
def _merge_splits_kernel(
    OP, LP, OT, LT, Out,
    s_ob, s_oh, s_os, s_om, s_od,
    s_lb, s_lh, s_ls, s_lm,
    s_tb, s_th, s_tm, s_td,
    s_ub, s_uh, s_um,
    s_xb, s_xh, s_xm, s_xd,
    heads, splits, head_dim,
    SPLITS: tl.constexpr, BLOCK_D: tl.constexpr, HAS_TREE: tl.constexpr,
):  # fmt: skip
    i = tl.program_id(0)
    b = tl.program_id(1) // heads
    h = tl.program_id(1) % heads
    parts = tl.arange(0, SPLITS)
    dims = tl.arange(0, BLOCK_D)
    part_ok = parts < splits
    dim_ok = dims < head_dim

    lse = tl.load(LP + b * s_lb + h * s_lh + parts * s_ls + i * s_lm, mask=part_ok, other=float("-inf"))
    top = tl.max(lse, 0)
    if HAS_TREE:
        lse_tree = tl.load(LT + b * s_ub + h * s_uh + i * s_um)
        top = tl.maximum(top, lse_tree)  # the tree part always holds the query's own key: finite
    weights = tl.exp(lse - top)
    total = tl.sum(weights, 0)
    o = tl.load(
        OP + b * s_ob + h * s_oh + parts[:, None] * s_os + i * s_om + dims[None, :] * s_od,
        mask=part_ok[:, None] & dim_ok[None, :], other=0.0,
    )  # fmt: skip
    out = tl.sum(weights[:, None] * o, 0)
    if HAS_TREE:
        w_tree = tl.exp(lse_tree - top)
        total += w_tree
        out += w_tree * tl.load(OT + b * s_tb + h * s_th + i * s_tm + dims * s_td, mask=dim_ok, other=0.0)
    out = out / total
    tl.store(Out + b * s_xb + h * s_xh + i * s_xm + dims * s_xd, out.to(Out.dtype.element_ty), mask=dim_ok)


def prefix_partials(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix_len: int, scale: float):
    """Pass 1 over keys `[0, prefix_len)` of k/v `[B, Hkv, S, D]` -> per-split (O, LSE), both fp32:
    O `[B, Hq, splits, n, D]`, LSE `[B, Hq, splits, n]`."""
    batch, heads, n, dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    rows = group * n
    config = prefix_config(q.device, dim, rows)
    row_blocks = triton.cdiv(rows, config.block_m)
    split_len = _split_len(q.device, prefix_len, row_blocks * batch * kv_heads, config.block_n)
    splits = triton.cdiv(prefix_len, split_len)
    o_part = torch.empty(batch, heads, splits, n, dim, dtype=torch.float32, device=q.device)
    lse_part = torch.empty(batch, heads, splits, n, dtype=torch.float32, device=q.device)
    _prefix_split_kernel[(row_blocks, splits, batch * kv_heads)](
        q, k, v, o_part, lse_part,
        *q.stride(), *k.stride(), *v.stride(), *o_part.stride(), *lse_part.stride(),
        n, kv_heads, group, dim, prefix_len, split_len, scale * LOG2E,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_D=_block_d(dim), DOT=dot_dtype(q.dtype),
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    return o_part, lse_part


def merge_partials(o_part, lse_part, out: torch.Tensor, tree: tuple[torch.Tensor, torch.Tensor] | None = None):
    """Pass 2: reduce the splits (and the tree part's O, LSE when given) by LSE into `out` `[B, Hq, n, D]`."""
    batch, heads, splits, n, dim = o_part.shape
    o_tree, lse_tree = tree if tree is not None else (out, lse_part[:, :, 0])  # unused when HAS_TREE is off
    _merge_splits_kernel[(n, batch * heads)](
        o_part, lse_part, o_tree, lse_tree, out,
        *o_part.stride(), *lse_part.stride(), *o_tree.stride(), *lse_tree.stride(), *out.stride(),
        heads, splits, dim,
        SPLITS=triton.next_power_of_2(splits), BLOCK_D=_block_d(dim), HAS_TREE=tree is not None,
    )  # fmt: skip
    return out


def prefix_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix_len: int, scale: float):
    """Flash decoding over keys `[0, prefix_len)`: (O `[B, Hq, n, D]` in q's dtype). prefix_len must be > 0."""
    o_part, lse_part = prefix_partials(q, k, v, prefix_len, scale)
    return merge_partials(o_part, lse_part, torch.empty_like(q))


def _block_d(dim: int) -> int:
    return triton.next_power_of_2(max(dim, 16))


def _split_len(device: torch.device, prefix_len: int, programs_per_split: int, block_n: int) -> int:
    """Keys per split: enough splits to give every SM eight programs (measured on an H100), each split a whole number of
    blocks."""
    target = 4 if interpreting() else 8 * _sm_count(device)
    splits = max(1, min(MAX_SPLITS, triton.cdiv(target, programs_per_split), triton.cdiv(prefix_len, block_n)))
    return triton.cdiv(triton.cdiv(prefix_len, splits), block_n) * block_n


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
