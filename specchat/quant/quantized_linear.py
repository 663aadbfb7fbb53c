"""The one contract every quantized linear layer follows (int4 and int8 on torch's kernel, GGUF blocks).

What the rest of specchat may ask of a quantized layer, and nothing more: its sizes and `format` (for
reports), `forward`, `dequantize()` (the exact matrix it multiplies by: for tests and training), `dequantize_rows`
(some rows of it: a draft head built from a 152K-row head's draft vocabulary), `native(decoder)` (the same product
inside the compiled CPU decoder) and `stacked(layers, bias)` (one layer computing several side by side, or None when its
kind does not stack). A new kind is one subclass.
"""

from __future__ import annotations

import torch
from torch import nn


class QuantizedLinear(nn.Module):
    in_features: int
    out_features: int
    format: str  # what the weights are, for reports: "q4_k", "int4-g32", ...

    def dequantize(self) -> torch.Tensor:
        """The weight matrix [out, in] the layer multiplies by."""
        raise NotImplementedError

    def dequantize_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Rows `rows` of the weight matrix [len(rows), in]: the whole matrix indexed, unless a kind does better."""
        return self.dequantize()[rows]

    def native(self, decoder):
        """This layer as the CPU decoder's `Linear` (`decoder`: the compiled module)."""
        raise NotImplementedError

    @classmethod
    def stacked(cls, layers: list[QuantizedLinear], bias: torch.Tensor | None) -> QuantizedLinear | None:
        """One layer whose outputs are those of `layers` (all of this kind) side by side, or None."""
        return None


def dense_weight(layer: nn.Module) -> torch.Tensor:
    """A linear layer's weight matrix [out, in], dequantized where it is quantized."""
    return layer.dequantize() if isinstance(layer, QuantizedLinear) else layer.weight


def dense_rows(layer: nn.Module, rows: torch.Tensor) -> torch.Tensor:
    """Rows `rows` of a linear layer's weight matrix [len(rows), in], dequantized where it is quantized."""
    return layer.dequantize_rows(rows) if isinstance(layer, QuantizedLinear) else layer.weight[rows]
