"""Tree attention that a CUDA graph replays at any context length, each row's sums in an order its position fixes.

A CUDA graph freezes its launches, so the committed length is read on the device (an int32 tensor the cache owns)
and the grid depends only on shapes. Exact speculative decoding needs more: a verified row must be bitwise the
decode step at its position, whatever rows share the call. So a row at position t (the committed length plus its
depth in the tree) sums its keys in an order t alone fixes, as canonical attention does on a CPU:

- the body, positions [0, s) with s = max(0, t - TAIL), read in place in key blocks laid from position 0, in
  BODY_SPLITS splits of the least power-of-two count of blocks (SPLIT_KEYS at the least) that covers s
  (`_split_blocks`: bounds that s alone fixes, whatever the cache's capacity, so a short context in a large cache
  spreads over as many splits as in a small one, and a long one over BODY_SPLITS partials, not more),
  with one block configuration for every row count (a row's dot products are then the same instructions alone or
  among 64 rows; keys past its own s masked, and a split length other rows of the call have is a pass it sits out),
  K and V read the same way in every forward on one GPU (`copy_engine`);
- the tail, positions [s, t]: the rest of the prefix, then its ancestors in depth order (the tree is topologically
  ordered: a row's ancestors in index order), itself last, gathered row by row and summed in fp32 in chunks of
  TAIL_KEYS keys, TAIL + 1 of them at most;

then the parts merged by log-sum-exp in a fixed order, a part a row does not reach exactly nothing. A decode step
is the one-row case. Two launches a layer: the body's partials, then a program a row and head that sums its tail
and merges it with them into `[n, Hq, D]`, the layout the output projection reads. A causal forward (a prefill, no
tree mask) reads its own keys in place.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from specchat.kernels.attention.configs import dot_dtype, interpreting, prefix_config

LOG2E = 1.4426950408889634
LN2 = tl.constexpr(0.6931471805599453)
TAIL = 64  # keys before a row in its tail, the deepest tree's: every row's body ends inside the committed prefix
TAIL_KEYS = 16  # a row's tail keys gathered at a time (168 registers on sm_90; 64 in the interpreter: fewer steps)
BODY_SPLITS = 32  # a row's body splits: a decode step's programs per KV head, and a row's partials
SPLIT_KEYS = 512  # the fewest keys a split holds: a short body spreads over fewer splits, fewer partials to merge
BODY_ROWS = 64  # query rows a body program takes, at every row count


@triton.jit
def _softmax_step(m_i, l_i, s):
    """One key block's scores `s` (log2 units, -inf where not seen) into the running max and sum: (the new max, the
    block's weights, the factor the running sums scale by, the new sum)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    return m_new, p, alpha, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _online_step(m_i, l_i, acc, s, v, DOT: tl.constexpr):
    """Fold one key block's scores and values `v` [keys, D], shared by the rows, into the running softmax."""
    m_i, p, alpha, l_i = _softmax_step(m_i, l_i, s)
    acc = acc * alpha[:, None] + tl.dot(p.to(DOT), v.to(DOT), input_precision="ieee")
    return m_i, l_i, acc


@triton.jit
def _query_rows(block, kv_h, n, group, BLOCK_M: tl.constexpr):
    """A program's query rows, row r = (query head within the group, query): (in range, query head, query)."""
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    return rows < group * n, kv_h * group + rows // n, rows % n


@triton.jit
def _queries(Q, s_qm, s_qh, s_qd, h, i, row_ok, dims, dim_ok):
    """The rows' queries [rows, BLOCK_D], zero past the head size and the rows."""
    return tl.load(Q + i[:, None] * s_qm + h[:, None] * s_qh + dims[None, :] * s_qd,
                   mask=row_ok[:, None] & dim_ok[None, :], other=0.0)  # fmt: skip


@triton.jit
def _depths(Mask, s_mm, s_mn, i, row_ok, n, CAUSAL: tl.constexpr, TREE: tl.constexpr):
    """Each row's depth below the forward's first position: its ancestors in the tree mask, itself not counted."""
    if CAUSAL:
        depth = i
    else:
        cols = tl.arange(0, TREE)
        seen = tl.load(Mask + i[:, None] * s_mm + cols[None, :] * s_mn, mask=row_ok[:, None] & (cols[None, :] < n),
                       other=0)  # fmt: skip
        depth = tl.sum((seen != 0).to(tl.int32), 1) - 1
    return depth


@triton.jit
def _split_blocks(body_end, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, LEAST: tl.constexpr):
    """Key blocks in each of a row's SPLITS body splits: the least power of two, LEAST (one) at the least, with which
    they cover its body. A function of the row's position alone."""
    need = tl.maximum((body_end + SPLITS * BLOCK_N - 1) // (SPLITS * BLOCK_N), LEAST) - 1
    need |= need >> 1
    need |= need >> 2
    need |= need >> 4
    need |= need >> 8
    need |= need >> 16
    return need + 1


@triton.jit
def _log2(power):
    """The exponent of a power of two (a scalar): the one bits below it."""
    return tl.sum((power - 1) >> tl.arange(0, 32) & 1, 0)


@triton.jit
def _store_part(OP, LP, m_i, l_i, acc, h, i, part, row_ok, dims, dim_ok, s_oh, s_os, s_om, s_lh, s_ls):
    """A part's LSE for every row, -inf where the row reached no key; its output only where it did (a short context
    in a large cache leaves most splits empty: the merge skips their outputs)."""
    empty = l_i == 0.0  # a part the row does not reach, or a padding row
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * LN2)
    base = h * s_oh + part * s_os + i * s_om
    tl.store(OP + base[:, None] + dims[None, :], out, mask=(row_ok & ~empty)[:, None] & dim_ok[None, :])
    tl.store(LP + h * s_lh + part * s_ls + i, lse, mask=row_ok)


@triton.jit
def _body_kernel(
    Q, K, V, Mask, Length, OP, LP,
    s_qm, s_qh, s_qd,
    s_kh, s_kn, s_kd,
    s_vh, s_vn, s_vd,
    s_mm, s_mn,
    s_oh, s_os, s_om,
    s_lh, s_ls,
    n, group, head_dim, scale_log2,
    CAUSAL: tl.constexpr, TREE: tl.constexpr, TAIL: tl.constexpr, SPLITS: tl.constexpr, LEAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT: tl.constexpr, DESCRIPTORS: tl.constexpr,
):  # fmt: skip
    split = tl.program_id(1)
    kv_h = tl.program_id(2)
    row_ok, h, i = _query_rows(tl.program_id(0), kv_h, n, group, BLOCK_M)
    position = tl.load(Length) + _depths(Mask, s_mm, s_mn, i, row_ok, n, CAUSAL, TREE)
    body_end = tl.where(row_ok, tl.maximum(position - TAIL, 0), 0)
    cols = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < head_dim
    if not DESCRIPTORS:
        k_base = K + kv_h * s_kh + dims[:, None] * s_kd
        v_base = V + kv_h * s_vh + dims[None, :] * s_vd
    q = _queries(Q, s_qm, s_qh, s_qd, h, i, row_ok, dims, dim_ok)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    blocks = _split_blocks(body_end, SPLITS, BLOCK_N, LEAST)
    last = tl.max(body_end, 0)
    fewest = tl.min(tl.where(row_ok, blocks, 1 << 30), 0)
    most = tl.max(tl.where(row_ok, blocks, 1), 0)
    for level in range(_log2(fewest), _log2(most) + 1):  # one pass, unless the rows' bodies straddle a power of two
        span = BLOCK_N << level
        start = split * span
        end = tl.minimum(start + span, last)
        ends = tl.where(blocks == 1 << level, body_end, 0)  # rows whose splits are this long; the others see none
        for key_start in range(start, end, BLOCK_N):
            keys = key_start + cols
            if DESCRIPTORS:  # whole blocks, zeros past the capacity; keys past `end` weigh 0, their values finite
                k = tl.trans(K.load([kv_h, key_start, 0]).reshape(BLOCK_N, BLOCK_D))
                v = V.load([kv_h, key_start, 0]).reshape(BLOCK_N, BLOCK_D)
            else:
                key_ok = keys < end
                k = tl.load(k_base + keys[None, :] * s_kn, mask=key_ok[None, :] & dim_ok[:, None], other=0.0)
                v = tl.load(v_base + keys[:, None] * s_vn, mask=key_ok[:, None] & dim_ok[None, :], other=0.0)
            s = tl.dot(q.to(DOT), k.to(DOT), input_precision="ieee") * scale_log2
            seen = keys[None, :] < ends[:, None]
            m_i, l_i, acc = _online_step(m_i, l_i, acc, tl.where(seen, s, float("-inf")), v, DOT)
    _store_part(OP, LP, m_i, l_i, acc, h, i, split, row_ok, dims, dim_ok, s_oh, s_os, s_om, s_lh, s_ls)


@triton.jit
def _tail(Q, K, V, Mask, length, s_qm, s_qh, s_qd, s_kh, s_kn, s_kd, s_vh, s_vn, s_vd, s_mm, s_mn,
          i, h, kv_h, row_ok, n, head_dim, scale_log2,
          CAUSAL: tl.constexpr, TREE: tl.constexpr, TAIL: tl.constexpr, TAIL_KEYS: tl.constexpr,
          BLOCK_D: tl.constexpr):  # fmt: skip
    """One row's tail part (m, l, acc; rows `[1]`): its positions [t - TAIL, t], the committed ones read in place,
    those past the prefix its ancestors at their depths, itself last; in fp32, TAIL_KEYS keys at a time."""
    position = length + _depths(Mask, s_mm, s_mn, i, row_ok, n, CAUSAL, TREE)
    start = tl.maximum(position - TAIL, 0)
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < head_dim
    q = _queries(Q, s_qm, s_qh, s_qd, h, i, row_ok, dims, dim_ok).to(tl.float32)
    if not CAUSAL:  # each tree column's rank among the row's ancestors: the depth it sits at
        tree_cols = tl.arange(0, TREE)
        seen = tl.load(Mask + i[:, None] * s_mm + tree_cols[None, :] * s_mn,
                       mask=row_ok[:, None] & (tree_cols[None, :] < n), other=0).to(tl.int32)  # fmt: skip
        rank = tl.where(seen != 0, tl.cumsum(seen, 1) - 1, -1)
    offsets = tl.arange(0, TAIL_KEYS)
    m_i = tl.full([1], float("-inf"), tl.float32)
    l_i = tl.zeros([1], tl.float32)
    acc = tl.zeros([1, BLOCK_D], tl.float32)
    for chunk in range(0, TAIL + 1, TAIL_KEYS):
        positions = start[:, None] + chunk + offsets[None, :]  # [1, keys]
        key_ok = row_ok[:, None] & (positions <= position[:, None])
        slots = positions
        if not CAUSAL:  # a position past the committed prefix: the ancestor at that depth
            depth = positions - length
            column = tl.sum(tl.where(rank[:, None, :] == depth[:, :, None], tree_cols[None, None, :], 0), 2)
            slots = tl.where(depth >= 0, length + column, positions)
        gathered = key_ok[:, :, None] & dim_ok[None, None, :]
        k = tl.load(K + kv_h * s_kh + slots[:, :, None] * s_kn + dims[None, None, :] * s_kd, mask=gathered, other=0.0)
        v = tl.load(V + kv_h * s_vh + slots[:, :, None] * s_vn + dims[None, None, :] * s_vd, mask=gathered, other=0.0)
        s = tl.sum(q[:, None, :] * k.to(tl.float32), 2) * scale_log2
        m_i, p, alpha, l_i = _softmax_step(m_i, l_i, tl.where(key_ok, s, float("-inf")))
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32), 1)
    return m_i, l_i, acc


@triton.jit
def _merge_kernel(
    Q, K, V, Mask, Length, OP, LP, Out,
    s_qm, s_qh, s_qd,
    s_kh, s_kn, s_kd,
    s_vh, s_vn, s_vd,
    s_mm, s_mn,
    s_oh, s_os, s_om,
    s_lh, s_ls,
    s_xm, s_xh, s_xd,
    n, group, head_dim, parts, scale_log2,
    CAUSAL: tl.constexpr, TREE: tl.constexpr, TAIL: tl.constexpr, WITH_TAIL: tl.constexpr,
    TAIL_KEYS: tl.constexpr, PARTS: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """One row and head: its body partials and (`WITH_TAIL`) its tail, computed here, merged by LSE in a fixed
    order; a row past the queries (a product's padding) writes zeros."""
    i = tl.program_id(0)
    h = tl.program_id(1)
    part = tl.arange(0, PARTS)
    dims = tl.arange(0, BLOCK_D)
    part_ok = part < tl.where(i < n, parts, 0)  # an output row past the queries reads nothing
    dim_ok = dims < head_dim
    lse = tl.load(LP + h * s_lh + part * s_ls + i, mask=part_ok, other=float("-inf"))
    o = tl.load(  # an empty part's output, never written, is not read: it weighs 0
        OP + h * s_oh + part[:, None] * s_os + i * s_om + dims[None, :],
        mask=(part_ok & (lse > float("-inf")))[:, None] & dim_ok[None, :], other=0.0,
    )  # fmt: skip
    top = tl.max(lse, 0)
    if WITH_TAIL:
        rows = tl.full([1], i, tl.int32)
        row_ok = rows < n
        heads = tl.full([1], h, tl.int32)
        m_t, l_t, acc_t = _tail(Q, K, V, Mask, tl.load(Length), s_qm, s_qh, s_qd, s_kh, s_kn, s_kd, s_vh, s_vn, s_vd,
                                s_mm, s_mn, rows, heads, h // group, row_ok, n, head_dim, scale_log2,
                                CAUSAL, TREE, TAIL, TAIL_KEYS, BLOCK_D)  # fmt: skip
        empty = l_t == 0.0  # a padding row
        lse_t = tl.where(empty, float("-inf"), (m_t + tl.log2(tl.where(empty, 1.0, l_t))) * LN2)  # [1]
        top = tl.maximum(top, tl.max(lse_t, 0))
    top = tl.where(top == float("-inf"), 0.0, top)
    weights = tl.exp(lse - top)
    total = tl.sum(weights, 0)
    summed = tl.sum(weights[:, None] * o, 0)
    if WITH_TAIL:
        weight_t = tl.exp(lse_t - top)  # [1]
        total += tl.sum(weight_t, 0)
        summed += tl.sum(weight_t[:, None] * (acc_t / tl.where(empty, 1.0, l_t)[:, None]), 0)
    out = summed / tl.where(total == 0.0, 1.0, total)  # a row that sees no key: zeros
    tl.store(Out + i * s_xm + h * s_xh + dims * s_xd, out.to(Out.dtype.element_ty), mask=dim_ok)


def body_splits(block_n: int) -> tuple[int, int]:
    """(a row's body splits, the fewest key blocks of `block_n` keys a split holds): BODY_SPLITS, SPLIT_KEYS' worth;
    4 and one in the interpreter, so that tests' short contexts cross split bounds and lengths."""
    if interpreting():
        return 4, 1
    return BODY_SPLITS, max(1, SPLIT_KEYS // block_n)


def graph_tree_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    length: torch.Tensor,
    tree_mask: torch.Tensor,
    scale: float,
    causal: bool = False,
    width: int | None = None,
) -> torch.Tensor:
    """q `[n, Hq, D]` (rotated); k/v caches `[Hkv, capacity, D]` whose slots `[length, length + n)` hold this
    forward's keys/values; `length` an int32 tensor `[1]` on q's device; tree_mask bool `[n, n]`, True on its
    diagonal, the tree topologically ordered (a parent before its children) and at most TAIL deep; `causal`: the
    rows are consecutive positions (tree_mask lower-triangular, not read: a prefill of any length) -> `[width, Hq,
    D]` in q's dtype (`width` >= n, default n; rows past n zeros: a product's padding, written by the merge)."""
    tree = 1 if causal else max(16, triton.next_power_of_2(q.shape[0]))
    o_part, lse_part, splits = _body(q, k_cache, v_cache, tree_mask, length, scale, causal, tree, TAIL)
    return _merge(q, k_cache, v_cache, tree_mask, length, o_part, lse_part, splits, scale, causal, tree, True,
                  width or q.shape[0])  # fmt: skip


def graph_prefix_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           length: torch.Tensor, scale: float) -> torch.Tensor:  # fmt: skip
    """q `[n, Hq, D]` (rotated), every row over the first `length` slots (an int32 tensor `[1]` on q's device) of
    k/v caches `[Hkv, capacity, D]` -> `[n, Hq, D]` in q's dtype, zeros where `length` is 0: a draft layer's
    cross-attention to the target's cache, in a CUDA graph replayed at any length. The body pass alone, each row at
    depth 0 (an identity mask) with no tail, so its body ends at `length`."""
    n = q.shape[0]
    rows_alone = torch.eye(n, dtype=torch.bool, device=q.device)
    tree = max(16, triton.next_power_of_2(n))
    o_part, lse_part, splits = _body(q, k_cache, v_cache, rows_alone, length, scale, False, tree, 0)
    return _merge(q, k_cache, v_cache, rows_alone, length, o_part, lse_part, splits, scale, False, tree, False, n)


def _block_d(dim: int) -> int:
    return triton.next_power_of_2(max(dim, 16))


def _strides(q, k_cache, v_cache, mask, o_part, lse_part) -> tuple[int, ...]:
    return (*q.stride(), *k_cache.stride(), *v_cache.stride(), *mask.stride(), *o_part.stride()[:3],
            *lse_part.stride()[:2])  # fmt: skip


def _body(q, k_cache, v_cache, mask, length, scale, causal, tree, tail):
    """The body pass into fresh partials: (outputs, LSEs, body splits)."""
    n, heads, dim = q.shape
    kv_heads = k_cache.shape[0]
    config = prefix_config(q.device, dim, BODY_ROWS)
    splits, least = body_splits(config.block_n)
    o_part = torch.empty(heads, splits, n, dim, dtype=torch.float32, device=q.device)
    lse_part = torch.empty(heads, splits, n, dtype=torch.float32, device=q.device)
    descriptors = copy_engine(q.device) and all(_descriptor_layout(cache) for cache in (k_cache, v_cache))
    keys, values = k_cache, v_cache
    if descriptors:
        block = [1, config.block_n, dim]
        keys, values = TensorDescriptor.from_tensor(k_cache, block), TensorDescriptor.from_tensor(v_cache, block)
    _body_kernel[(triton.cdiv(heads // kv_heads * n, config.block_m), splits, kv_heads)](
        q, keys, values, mask, length, o_part, lse_part, *_strides(q, k_cache, v_cache, mask, o_part, lse_part),
        n, heads // kv_heads, dim, scale * LOG2E,
        CAUSAL=causal, TREE=tree, TAIL=tail, SPLITS=splits, LEAST=least,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_D=_block_d(dim),
        DOT=dot_dtype(q.dtype), DESCRIPTORS=descriptors, num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    return o_part, lse_part, splits


def copy_engine(device: torch.device) -> bool:
    """Whether the body pass reads K and V through tensor descriptors: on Hopper and later (sm_90+), whose copy
    engine (TMA) moves whole key blocks into shared memory (a 65-row body pass 12-17% faster than pointer loads at
    32K and 128K keys on an H200). A descriptor is encoded on the host at each launch, once in a CUDA graph. Every
    forward on one GPU reads the same way, so a prefill's or a tree's row keeps the decode step's bits."""
    return not interpreting() and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def _descriptor_layout(cache: torch.Tensor) -> bool:
    """A cache `[Hkv, capacity, D]` a descriptor can describe: D a power of two (its blocks whole rows) of at most
    256 (a TMA box's side), rows contiguous, base and strides 16-byte aligned."""
    size, dim = cache.element_size(), cache.shape[-1]
    return (dim == _block_d(dim) and dim <= 256 and cache.stride(-1) == 1 and cache.data_ptr() % 16 == 0
            and all(stride * size % 16 == 0 for stride in cache.stride()[:-1]))  # fmt: skip


def _merge(q, k_cache, v_cache, mask, length, o_part, lse_part, parts, scale, causal, tree, with_tail,
           width) -> torch.Tensor:  # fmt: skip
    """Each row's `parts` body partials and (`with_tail`) its tail merged into `[width, Hq, D]` in q's dtype, zeros
    past q's n rows."""
    n, heads, dim = q.shape
    out = q.new_empty(width, heads, dim)
    _merge_kernel[(width, heads)](
        q, k_cache, v_cache, mask, length, o_part, lse_part, out,
        *_strides(q, k_cache, v_cache, mask, o_part, lse_part), *out.stride(),
        n, heads // k_cache.shape[0], dim, parts, scale * LOG2E,
        CAUSAL=causal, TREE=tree, TAIL=TAIL, WITH_TAIL=with_tail, TAIL_KEYS=64 if interpreting() else TAIL_KEYS,
        PARTS=triton.next_power_of_2(parts), BLOCK_D=_block_d(dim),
    )  # fmt: skip
    return out
