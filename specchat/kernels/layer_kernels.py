"""Triton kernels for the elementwise parts of a Llama-family layer: RMSNorm, SiLU-and-multiply, and RoPE with
the KV-cache write.

Each replaces what eager torch runs as 4-10 small kernels, so a CUDA graph of the decoder is the matmuls, the
attention and one launch per elementwise step. Roundings follow transformers' modules (the normalised row
rounded to the activations' dtype before the weight multiplies it; SiLU rounded before the product), so bf16
results differ from theirs only where transformers rounds RoPE's two products separately.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(X, W, Out, s_x, s_o, width, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < width
    x = tl.load(X + row * s_x + cols, mask=ok, other=0.0).to(tl.float32)
    normed = x * tl.rsqrt(tl.sum(x * x, 0) / width + eps)
    w = tl.load(W + cols, mask=ok, other=0.0)
    out = normed.to(X.dtype.element_ty).to(tl.float32) * w.to(tl.float32)
    tl.store(Out + row * s_o + cols, out.to(Out.dtype.element_ty), mask=ok)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`weight * normalise(x)` over the last dim of a 2-D `x` (rows contiguous)."""
    out = torch.empty_like(x)
    block = triton.next_power_of_2(x.shape[1])
    _rms_norm_kernel[(x.shape[0],)](x, weight, out, x.stride(0), out.stride(0), x.shape[1], eps, BLOCK=block,
                                    num_warps=8 if block >= 4096 else 4)  # fmt: skip
    return out


@triton.jit
def _silu_mul_kernel(GU, Out, s_g, s_o, width, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < width
    gate = tl.load(GU + row * s_g + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(GU + row * s_g + width + cols, mask=ok, other=0.0)
    act = (gate / (1.0 + tl.exp(-gate))).to(GU.dtype.element_ty)
    tl.store(Out + row * s_o + cols, (act.to(tl.float32) * up.to(tl.float32)).to(Out.dtype.element_ty), mask=ok)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """`silu(gate) * up` of `[rows, 2 * I]` (gate first) -> `[rows, I]`."""
    rows, width = gate_up.shape[0], gate_up.shape[1] // 2
    out = gate_up.new_empty(rows, width)
    block = 1024
    _silu_mul_kernel[(rows, triton.cdiv(width, block))](gate_up, out, gate_up.stride(0), out.stride(0), width,
                                                        BLOCK=block)  # fmt: skip
    return out


@triton.jit
def _rope_write_kernel(
    QKV, Pos, Cos, Sin, Length, QKNorm, Q, K, V,
    s_x, s_c, s_qm, s_qh, s_kh, s_kn, s_vh, s_vn,
    heads, kv_heads, half, eps,
    HAS_NORM: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    i = tl.program_id(0)
    head = tl.program_id(1)  # q heads, then k heads, then v heads: the fused projection's column order
    dims = tl.arange(0, BLOCK)
    ok = dims < half
    src = QKV + i * s_x + head * 2 * half
    x1 = tl.load(src + dims, mask=ok, other=0.0)
    x2 = tl.load(src + half + dims, mask=ok, other=0.0)
    slot = tl.load(Length) + i
    if head >= heads + kv_heads:  # a value: copied
        dst = V + (head - heads - kv_heads) * s_vh + slot * s_vn
        tl.store(dst + dims, x1, mask=ok)
        tl.store(dst + half + dims, x2, mask=ok)
    else:
        is_q = head < heads
        a = x1.to(tl.float32)
        b = x2.to(tl.float32)
        if HAS_NORM:  # qwen3: an RMSNorm over each head before RoPE
            norm = QKNorm + tl.where(is_q, 0, 2 * half)  # row 0 the queries' weight, row 1 the keys'
            r = tl.rsqrt((tl.sum(a * a, 0) + tl.sum(b * b, 0)) / (2 * half) + eps)
            w1 = tl.load(norm + dims, mask=ok, other=0.0).to(tl.float32)
            w2 = tl.load(norm + half + dims, mask=ok, other=0.0).to(tl.float32)
            a = ((a * r).to(x1.dtype).to(tl.float32) * w1).to(x1.dtype).to(tl.float32)
            b = ((b * r).to(x1.dtype).to(tl.float32) * w2).to(x1.dtype).to(tl.float32)
        pos = tl.load(Pos + i)
        c = tl.load(Cos + pos * s_c + dims, mask=ok, other=0.0)
        s = tl.load(Sin + pos * s_c + dims, mask=ok, other=0.0)
        out1 = (a * c - b * s).to(x1.dtype)
        out2 = (b * c + a * s).to(x1.dtype)
        if is_q:
            dst = Q + i * s_qm + head * s_qh
        else:
            dst = K + (head - heads) * s_kh + slot * s_kn
        tl.store(dst + dims, out1, mask=ok)
        tl.store(dst + half + dims, out2, mask=ok)


def rope_write(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    length: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    qk_norm: torch.Tensor | None,
    eps: float,
) -> torch.Tensor:
    """Rotate the queries and keys of `qkv` `[n, (Hq + 2 Hkv) D]` at `positions` `[n]` (cos/sin tables
    `[max_positions, D / 2]`, fp32), write keys and values into slots `[length, length + n)` of the caches
    `[Hkv, capacity, D]`, return the rotated queries `[n, Hq, D]`. `qk_norm`: the per-head RMSNorm weights of
    queries and keys `[2, D]`, applied first (qwen3), or None."""
    kv_heads, _, dim = k_cache.shape
    n = qkv.shape[0]
    heads = qkv.shape[1] // dim - 2 * kv_heads
    q = qkv.new_empty(n, heads, dim)
    has_norm = qk_norm is not None
    _rope_write_kernel[(n, heads + 2 * kv_heads)](
        qkv, positions, cos, sin, length, qk_norm if has_norm else qkv, q, k_cache, v_cache,
        qkv.stride(0), cos.stride(0), q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1),
        heads, kv_heads, dim // 2, eps,
        HAS_NORM=has_norm, BLOCK=triton.next_power_of_2(dim // 2), num_warps=1,
    )  # fmt: skip
    return q
