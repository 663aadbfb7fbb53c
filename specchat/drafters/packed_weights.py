"""Draft checkpoints stored in 4 bits: each matrix in groups of 32 along its rows, one code 0..15 a weight and
the group's minimum and step in fp16, unpacked to floats when read.

Beside a quantized target that is not a GGUF file a draft runs its linears in int4 with this very grouping
(`quant/quantize.py`, as GGUF's Q4_1): quantizing the unpacked weights again gives back the same codes, since a
group's minimum and maximum are codes 0 and 15, so the stored draft is the one that runs there. Beside a GGUF
target it runs them as Q4_K blocks (`quant/q4_k.py`), whose sub-blocks are these groups with their steps and
minimums rounded onto 6-bit scales; elsewhere it runs the unpacked weights. A 1.5B target's draft layer is 39 MB
in bf16 and 12 MB packed: the checkpoints shipped in the repository stay within what travels with it.
"""

from __future__ import annotations

import torch

from specchat.quant.quantize import GROUP

CODES, STEP, LOW = ".int4", ".int4_step", ".int4_low"  # suffixes of a packed matrix's three tensors


def pack(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`tensors` with every float matrix of whole groups replaced by its codes (uint8 [rows, columns / 2], two a
    byte, the even column's in the low nibble), steps and minimums (fp16 [rows, columns / 32])."""
    packed = {}
    for name, tensor in tensors.items():
        if not packable(name, tensor):
            packed[name] = tensor
            continue
        groups = tensor.detach().float().reshape(tensor.shape[0], -1, GROUP)
        low = groups.amin(-1).half()
        step = ((groups.amax(-1) - low.float()) / 15).half()
        divisor = torch.where(step == 0, 1.0, step.float())  # a group of equal weights is its minimum, codes 0
        codes = torch.round((groups - low.float()[..., None]) / divisor[..., None]).clamp(0, 15).to(torch.uint8)
        codes = codes.reshape(tensor.shape[0], -1)
        packed[name + CODES] = codes[:, 0::2] | codes[:, 1::2] << 4
        packed[name + STEP], packed[name + LOW] = step, low
    return packed


def unpack(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`tensors` with each packed matrix as fp32 again; ValueError where one lacks a part."""
    unpacked = {}
    for name, tensor in tensors.items():
        if name.endswith((STEP, LOW)):
            continue
        if not name.endswith(CODES):
            unpacked[name] = tensor
            continue
        base = name.removesuffix(CODES)
        if base + STEP not in tensors or base + LOW not in tensors:
            raise ValueError(f"the packed matrix {base} lacks its steps or minimums")
        codes = torch.stack([tensor & 15, tensor >> 4], dim=-1).reshape(tensor.shape[0], -1, GROUP).float()
        step, low = tensors[base + STEP].float(), tensors[base + LOW].float()
        unpacked[base] = (codes * step[..., None] + low[..., None]).reshape(tensor.shape[0], -1)
    return unpacked


def is_packed(tensors: dict[str, torch.Tensor]) -> bool:
    return any(name.endswith(CODES) for name in tensors)


def packable(name: str, tensor: torch.Tensor) -> bool:
    """A float matrix of whole groups (norms, biases and vocabulary lists stay as they are)."""
    return (tensor.is_floating_point() and tensor.dim() == 2 and tensor.shape[1] % GROUP == 0
            and not name.endswith((STEP, LOW)))
