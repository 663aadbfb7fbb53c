"""Projections of one input (q/k/v, gate/up) as one product: one kernel call instead of two or three.

On a CPU a small model's decode step is a few hundred tiny matmuls, each with a fixed cost of 10-20 us: the
three 4-bit q/k/v products of the default model take 37 us, one over their stacked codes 14 us. The stacked
product gives each projection's outputs bit for bit (tests/test_lean_forward.py checks dense, 4-bit and 8-bit
layers).

`fuse_projections` stacks the weights once, keeping one copy: dense projections stay the `nn.Linear`s they were,
their weights and biases re-pointed at their rows of the stacked ones (the model's modules, state dict and
outputs unchanged); a quantized projection is replaced by a `Rows` view of the fused layer (same outputs).
"""

from __future__ import annotations

import torch
from torch import nn

from specchat.quant.formats import layer_format
from specchat.quant.quantized_linear import QuantizedLinear


class Rows(nn.Module):
    """The output columns [start, end) of a fused layer: one of the projections it stacks."""

    def __init__(self, fused: nn.Module, start: int, end: int):
        super().__init__()
        self.fused, self.start, self.end = fused, start, end
        self.in_features, self.out_features = fused.in_features, end - start

    @property
    def format(self) -> str:
        return layer_format(self.fused)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fused(x)[..., self.start : self.end]

    def dequantize(self) -> torch.Tensor:
        return self.fused.dequantize()[self.start : self.end]


class Side(nn.Module):
    """Layers that cannot share one product (different kinds), run one after the other, outputs side by side."""

    def __init__(self, layers: list[nn.Module]):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.in_features, self.out_features = layers[0].in_features, sum(layer.out_features for layer in layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([layer(x) for layer in self.layers], dim=-1)


def fuse_projections(parent: nn.Module, names: tuple[str, ...]) -> nn.Module:
    """One layer computing `parent`'s projections `names` side by side (built once, then found again)."""
    layers = [getattr(parent, name) for name in names]
    if isinstance(layers[0], Rows):
        return layers[0].fused
    kinds = {type(layer) for layer in layers}
    if len(kinds) == 1 and issubclass(kinds.pop(), nn.Linear):  # nn.Linear, or HalfLinear's fp16
        return _dense_stacked(layers)
    fused = _stacked(layers)
    if fused is None:
        return Side(layers)
    start = 0
    for name, layer in zip(names, layers):
        setattr(parent, name, Rows(fused, start, start + layer.out_features))
        start += layer.out_features
    return fused


def _dense_stacked(layers: list[nn.Linear]) -> nn.Module:
    """A layer of their kind over the layers' stacked weights (and biases), each layer's now a view of its rows; found
    again from the views when they already are (stacked weights are one storage, the first layer's at its
    start)."""
    if len({layer.in_features for layer in layers}) != 1 or len({layer.bias is None for layer in layers}) != 1:
        return Side(layers)
    rows, first = sum(layer.out_features for layer in layers), layers[0]
    fused = type(first)(first.in_features, rows, bias=first.bias is not None, device="meta")
    for name in ("weight", "bias") if first.bias is not None else ("weight",):
        parts = [getattr(layer, name) for layer in layers]
        held = _whole(parts)
        stacked = held if held is not None else torch.cat(parts)
        setattr(fused, name, nn.Parameter(stacked, requires_grad=False))
        start = 0
        for layer, part in zip(layers, parts):
            view = stacked[start : start + part.shape[0]]
            setattr(layer, name, nn.Parameter(view, requires_grad=False))
            start += part.shape[0]
    return fused


def _whole(parts: list[torch.Tensor]) -> torch.Tensor | None:
    """The stacked tensor whose consecutive rows `parts` are views of, or None when they are not."""
    first = parts[0]
    storage = first.untyped_storage()
    rows = sum(part.shape[0] for part in parts)
    offset = first.storage_offset()
    for part in parts:
        if part.untyped_storage().data_ptr() != storage.data_ptr() or part.storage_offset() != offset:
            return None
        offset += part.numel()
    if first.storage_offset() != 0 or offset * first.element_size() != storage.nbytes():
        return None
    return first.new_empty(0).set_(storage, 0, (rows, *first.shape[1:]))


def _stacked(layers: list[nn.Module]) -> nn.Module | None:
    kinds = {type(layer) for layer in layers}
    if len(kinds) != 1 or len({layer.in_features for layer in layers}) != 1:
        return None
    kind = kinds.pop()
    biases = [layer.bias for layer in layers]
    if any(bias is None for bias in biases) and any(bias is not None for bias in biases):
        return None
    bias = None if biases[0] is None else torch.cat(biases)
    return kind.stacked(layers, bias) if issubclass(kind, QuantizedLinear) else None
