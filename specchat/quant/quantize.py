"""`--quantize`: weight-only, group-wise quantization of a checkpoint's linear layers when it loads.

q4_k_m and q8_0 write GGUF blocks as llama-quantize does (`gguf_quantize.py`). int4 and int8 run on torch's
kernels: int4 stores a scale and a minimum per group of 32 inputs (as GGUF's Q4_1), int8 one scale per group of 32
(as Q8_0). The LM head is int8 under both, as llama.cpp's 4-bit files keep their output layer at 6-8 bits: it
decides every token. Embeddings, norms and linear layers of shapes torch's int4 kernel does not take (inputs not
in whole groups, outputs not a multiple of 16) stay dense in the activation dtype.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn

from specchat.quant.int4_linear import Int4Linear
from specchat.quant.int8_linear import Int8Linear
from specchat.quant.q4_k import q4_k_linear

GROUP = 32
ROW_MULTIPLE = 16  # torch's int4 packing takes output rows in multiples of this


def quantize_model(model: nn.Module, scheme: str, *, dtype: torch.dtype, source: list[Path] | None = None) -> None:
    """Replace the linear layers of `model` in place; `dtype` is the activation dtype; `source`, the files the
    weights were read from, keys the GGUF blocks kept on disk (`gguf_quantize.py`)."""
    from specchat.architectures import parts
    from specchat.quant.gguf_quantize import SCHEMES, quantize_to_gguf

    if scheme in SCHEMES:
        return quantize_to_gguf(model, scheme, dtype=dtype, source=source)
    quantize_linears(model, scheme, dtype=dtype, head=parts(model).head)


def quantize_linears(module: nn.Module, scheme: str, *, dtype: torch.dtype, head: nn.Module | None = None) -> None:
    """Replace `module`'s linear layers in place (`head`, the LM head, gets int8 whatever the scheme)."""
    for name, linear in list(module.named_modules()):
        if isinstance(linear, nn.Linear) and quantizable(linear):
            layer_scheme = "int8" if linear is head else scheme
            module.set_submodule(name, quantize_linear(linear, layer_scheme, dtype=dtype))


def quantized_copy(module: nn.Module, scheme: str | None, *, dtype: torch.dtype) -> nn.Module:
    """A copy of `module` with its linear layers in `scheme` (the caller's module stays as it is), or `module`
    itself when `scheme` is None: how a drafter runs its own layers beside a quantized target."""
    if scheme is None:
        return module
    module = copy.deepcopy(module)
    quantize_linears(module, scheme, dtype=dtype)
    return module


def quantizable(linear: nn.Linear) -> bool:
    """Whether torch's int4 kernel takes this shape (int8 runs on it too)."""
    return linear.in_features % GROUP == 0 and linear.out_features % ROW_MULTIPLE == 0


def quantize_linear(linear: nn.Linear, scheme: str, *, dtype: torch.dtype) -> nn.Module:
    """A group-wise `scheme` ("int4" | "int8" | "q4_k") copy of `linear`. "q4_k" (GGUF's blocks, through the
    CPU decoder's kernels: `q4_k.py`): Q4_K where rows are whole 256-value blocks, else Q4_1."""
    if scheme == "q4_k":
        return q4_k_linear(linear, dtype=dtype)
    weight = linear.weight.detach().float().view(linear.out_features, -1, GROUP)
    bias = None if linear.bias is None else linear.bias.detach()
    if scheme == "int4":
        low, high = weight.amin(-1), weight.amax(-1)
        scale = (high - low) / 15
        codes = torch.round((weight - low[..., None]) / _nonzero(scale)[..., None]).clamp(0, 15)
        return Int4Linear(codes.flatten(1), scale, low + 8 * scale, group_size=GROUP, dtype=dtype, bias=bias,
                          format=f"int4-g{GROUP}")  # fmt: skip
    if scheme == "int8":
        scale = weight.abs().amax(-1) / 127
        codes = torch.round(weight / _nonzero(scale)[..., None]).clamp(-127, 127).to(torch.int8)
        return Int8Linear(codes.flatten(1), scale, dtype=dtype, bias=bias, format=f"int8-g{GROUP}")
    raise ValueError(f"unknown quantization scheme '{scheme}'")


def _nonzero(scale: torch.Tensor) -> torch.Tensor:
    """The scale to divide by: a group of equal weights (scale 0) gets codes 0 and is stored by its zero."""
    return torch.where(scale == 0, torch.ones_like(scale), scale)
