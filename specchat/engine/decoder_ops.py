"""The torch decoder's non-matmul steps as custom ops (`specchat::*`): torch code on a CPU, Triton kernels on CUDA.

Registered with `torch.library.custom_op`, each is one opaque node to `torch.compile` (no graph break, no
retrace of Triton's launcher) and one call to a CUDA graph capture. The CPU bodies follow transformers' modules
operation for operation, which the parity tests compare against; the CUDA bodies fuse each step into one or two
launches (`specchat.kernels.layer_kernels`, `specchat.kernels.attention.graph_attention`) and read the committed length
from the device, so a captured graph serves every context length.

Caches are passed whole (`[layers, B, Hkv, capacity, D]`, batch 1) with the layer's index: a mutated argument is
then a graph input itself, never a view of one.

A call on a CPU that nothing traces or watches runs the op's body as a plain function: an op's dispatch costs ~17 us
there, as long as a small model's whole RMSNorm, and nothing needs the node.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specchat.kernels.attention import reference
from specchat.kernels.attention.canonical_attention import TAIL, canonical_tree_attention


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm: fp32 statistics, the row rounded to x's dtype before the weight multiplies it."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' RoPE on `[n, H, D]` with cos/sin `[n, 1, D]`: the second half rotated into the first."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class DecoderOp:
    """A custom op `specchat::NAME` of `body` (its CPU kernel), called as the op, or as `body` itself on a CPU where
    no trace (`torch.compile`, fake tensors) and no dispatch mode sees the call."""

    def __init__(self, name: str, body, mutates_args: tuple[str, ...] = ()):
        self.body = body
        self.op = torch.library.custom_op(f"specchat::{name}", body, mutates_args=mutates_args)
        self.register_kernel, self.register_fake = self.op.register_kernel, self.op.register_fake

    def __call__(self, *args):
        if torch.compiler.is_compiling() or args[0].device.type != "cpu" or torch._C._len_torch_dispatch_stack():
            return self.op(*args)
        return self.body(*args)


def op(name: str, mutates_args: tuple[str, ...] = ()):
    """Decorates a CPU body as `DecoderOp` `name`."""
    return lambda body: DecoderOp(name, body, mutates_args)


@op("rms_norm")
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of `[rows, width]`."""
    return _rms(x, weight, eps)


@rms_norm.register_kernel("cuda")
def _(x, weight, eps):
    from specchat.kernels.layer_kernels import rms_norm as kernel

    return kernel(x, weight, eps)


@rms_norm.register_fake
def _(x, weight, eps):
    return torch.empty_like(x)


@op("silu_mul")
def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """`silu(gate) * up` of the fused projection's output `[rows, 2 * I]`."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


@silu_mul.register_kernel("cuda")
def _(gate_up):
    from specchat.kernels.layer_kernels import silu_mul as kernel

    return kernel(gate_up)


@silu_mul.register_fake
def _(gate_up):
    return gate_up.new_empty(gate_up.shape[0], gate_up.shape[1] // 2)


@op("rope_write", mutates_args=("k_cache", "v_cache"))
def rope_write(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    length: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    layer: int,
    qk_norm: torch.Tensor | None,
    eps: float,
) -> torch.Tensor:
    """RoPE on the queries and keys of `qkv` `[n, (Hq + 2 Hkv) D]` at `positions` (after qwen3's per-head norms
    `qk_norm` `[2, D]` when given); keys and values written to slots `[length, length + n)` of layer `layer`.
    Returns the rotated queries `[n, Hq, D]`."""
    kv_heads, dim = k_cache.shape[2], k_cache.shape[4]
    n = qkv.shape[0]
    x = qkv.view(n, -1, dim)
    q, k, v = x.split([x.shape[1] - 2 * kv_heads, kv_heads, kv_heads], dim=1)
    if qk_norm is not None:
        q, k = _rms(q, qk_norm[0], eps), _rms(k, qk_norm[1], eps)
    c, s = cos[positions].to(x.dtype), sin[positions].to(x.dtype)
    c, s = torch.cat((c, c), dim=-1)[:, None], torch.cat((s, s), dim=-1)[:, None]
    start = int(length)
    k_cache[layer, 0, :, start : start + n] = _rotate(k, c, s).transpose(0, 1)
    v_cache[layer, 0, :, start : start + n] = v.transpose(0, 1)
    return _rotate(q, c, s).contiguous()


@rope_write.register_kernel("cuda")
def _(qkv, positions, cos, sin, length, k_cache, v_cache, layer, qk_norm, eps):
    from specchat.kernels.layer_kernels import rope_write as kernel

    return kernel(qkv, positions, cos, sin, length, k_cache[layer, 0], v_cache[layer, 0], qk_norm, eps)


@rope_write.register_fake
def _(qkv, positions, cos, sin, length, k_cache, v_cache, layer, qk_norm, eps):
    dim = k_cache.shape[4]
    return qkv.new_empty(qkv.shape[0], qkv.shape[1] // dim - 2 * k_cache.shape[2], dim)


@op("tree_attention")
def tree_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    layer: int,
    length: torch.Tensor,
    tree_mask: torch.Tensor,
    scale: float,
    causal: bool,
    width: int,
) -> torch.Tensor:
    """Tree attention of the rotated queries `[n, Hq, D]`: the committed prefix `[0, length)` without a mask,
    this forward's slots after it under `tree_mask` `[n, n]` (`causal`: lower-triangular, a prefill's) -> `[width,
    Hq, D]`, the rows past n zeros (the padding of the products that follow, written with the rows, not copied
    after). On CUDA every row sums in the order its position fixes (`graph_tree_attention`), and so does a CPU in
    bf16 / fp16 for a forward of up to TAIL rows (`canonical_tree_attention`): a verified tree row is then bitwise
    the decode step at its position."""
    canonical = q.dtype in (torch.bfloat16, torch.float16) and q.shape[0] <= TAIL
    attention = canonical_tree_attention if canonical else reference.hybrid_tree_attention
    out = attention(q.transpose(0, 1)[None], k_cache[layer], v_cache[layer], int(length), tree_mask, scale)
    return torch.cat([out[0].transpose(0, 1), q.new_zeros(width - q.shape[0], *q.shape[1:])])


@tree_attention.register_kernel("cuda")
def _(q, k_cache, v_cache, layer, length, tree_mask, scale, causal, width):
    from specchat.kernels.attention.graph_attention import graph_tree_attention

    return graph_tree_attention(q, k_cache[layer, 0], v_cache[layer, 0], length, tree_mask, scale, causal, width)


@tree_attention.register_fake
def _(q, k_cache, v_cache, layer, length, tree_mask, scale, causal, width):
    return q.new_empty(width, *q.shape[1:])
