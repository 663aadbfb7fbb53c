"""A dense matrix written as GGUF Q4_K blocks, to run through the kernels a GGUF target's own matrices run on.

A draft on a CPU reads its few small matrices right after the target's step has evicted them, then reads the
draft vocabulary's head again at every depth of its tree. Torch's int4 kernel takes about as long over a cold
matrix as our Q4_K tiles do, and twice as long over a warm one (8192 x 1536 at 1-3 rows: 0.19-0.27 ms against
0.10-0.16), and its calls cost more around them: a chained TokenSwift draft of budget 3, caches evicted first,
took 2.31 ms in int4 and 1.38 ms in Q4_K. Q4_K is what the tiled kernels read, so a draft beside a GGUF target
is quantized to it; a layer whose rows are not whole Q4_K blocks (the embedded model's 576 columns) to Q4_1, 32 values
a block (torch's int4 kernel, the other choice, runs fp32 activations 50 times slower than bf16 ones).

Q4_K, per group of 256 values of a row: 8 sub-blocks of 32, each value w = d * sc * q - dmin * m, with q in
0..15, sc and m 6-bit integers per sub-block and d, dmin fp16 per group (ggml's `block_q4_K`: d, dmin, 12 bytes
of packed scales and mins, 128 bytes of nibbles). Each sub-block's range is split in 15 steps from min(0, its
smallest value), and its step and offset are rounded onto the group's 63-step scales: no search for the best
scales as llama.cpp's quantizer does, which costs a draft nothing measurable. Q5_K is the same with q in 0..31,
each code's fifth bit in 32 bytes before the nibbles (bit j of byte l for value 32j + l): benchmarks write whole
models in it (`scripts/requantize_gguf.py`), as no Q5_K file is at hand here.
"""

from __future__ import annotations

import torch
from torch import nn

from specchat.quant.gguf_linear import GGUFLinear
from specchat.quant.gguf_types import Q4_1, Q4_K

GROUP = 256  # values per Q4_K block
SUB = 32  # values per sub-block


def takes_q4_k(linear: nn.Linear) -> bool:
    """Whether a layer's rows split into whole Q4_K blocks."""
    return linear.in_features % GROUP == 0


def q4_k_linear(linear: nn.Linear, *, dtype: torch.dtype) -> GGUFLinear:
    """`linear` as a layer on Q4_K blocks, or Q4_1 where its rows are not whole Q4_K blocks (its bias kept); `dtype`
    is the activation dtype."""
    bias = None if linear.bias is None else linear.bias.detach()
    weight = linear.weight.detach()
    if takes_q4_k(linear):
        return GGUFLinear(q4_k_blocks(weight), Q4_K, linear.in_features, dtype=dtype, bias=bias)
    return GGUFLinear(q4_1_blocks(weight), Q4_1, linear.in_features, dtype=dtype, bias=bias)


def q4_1_blocks(weight: torch.Tensor) -> torch.Tensor:
    """[rows, cols] float -> Q4_1 blocks [rows, cols / 32 * 20] uint8: per 32 values d and m (fp16), then the codes
    q in 0..15 (w = d * q + m), values 0-15 in the low nibbles and 16-31 in the high ones."""
    rows, cols = weight.shape
    x = weight.float().reshape(rows, cols // SUB, SUB)
    low = x.amin(-1)
    d = ((x.amax(-1) - low) / 15).half().float()
    m = low.half().float()
    codes = torch.round((x - m[..., None]) / _nonzero(d)[..., None]).clamp(0, 15).to(torch.uint8)
    nibbles = codes[..., :16] | codes[..., 16:] << 4
    halves = torch.stack([d, m], dim=-1).half().view(torch.uint8)
    return torch.cat([halves, nibbles], dim=-1).reshape(rows, -1).contiguous()


def q4_k_blocks(weight: torch.Tensor) -> torch.Tensor:
    """[rows, cols] float -> Q4_K blocks [rows, cols / 256 * 144] uint8, as a GGUF file stores them."""
    return k_quant_blocks(weight, bits=4)


def k_quant_blocks(weight: torch.Tensor, *, bits: int) -> torch.Tensor:
    """[rows, cols] float -> Q4_K (`bits` 4) or Q5_K (5) blocks [rows, cols / 256 * (144 or 176)] uint8."""
    rows, cols = weight.shape
    levels = (1 << bits) - 1
    x = weight.float().reshape(rows, cols // GROUP, GROUP // SUB, SUB)
    low = x.amin(-1).clamp(max=0)  # [rows, groups, 8]
    step = (x.amax(-1) - low) / levels
    d = (step.amax(-1) / 63).half().float()  # [rows, groups]
    dmin = ((-low).amax(-1) / 63).half().float()
    scales = torch.round(step / _nonzero(d)[..., None]).clamp(0, 63)
    mins = torch.round(-low / _nonzero(dmin)[..., None]).clamp(0, 63)
    codes = torch.round((x + (dmin[..., None] * mins)[..., None]) / _nonzero(d[..., None] * scales)[..., None])
    codes = codes.clamp(0, levels).to(torch.uint8)  # [rows, groups, 8, 32]
    high = ((codes >> 4) << torch.arange(8, dtype=torch.uint8)[:, None]).sum(-2, dtype=torch.uint8)  # [.., 32]
    codes = (codes & 15).reshape(rows, cols // GROUP, 4, 2, SUB)
    scales, mins = scales.to(torch.uint8), mins.to(torch.uint8)
    packed = torch.cat([  # ggml's get_scale_min_k4, inverted: sub-blocks 4-7 keep their top 2 bits in bytes 0-7
        scales[..., :4] | (scales[..., 4:] >> 4) << 6,
        mins[..., :4] | (mins[..., 4:] >> 4) << 6,
        (scales[..., 4:] & 15) | (mins[..., 4:] & 15) << 4,
    ], dim=-1)  # fmt: skip
    nibbles = (codes[..., 0, :] | codes[..., 1, :] << 4).flatten(-2)  # per 64 values: low nibbles 0-31, high 32-63
    halves = torch.stack([d, dmin], dim=-1).half().view(torch.uint8)
    parts = [halves, packed, high, nibbles] if bits == 5 else [halves, packed, nibbles]
    return torch.cat(parts, dim=-1).reshape(rows, -1).contiguous()


def _nonzero(scale: torch.Tensor) -> torch.Tensor:
    return torch.where(scale > 0, scale, torch.ones_like(scale))
