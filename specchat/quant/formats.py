"""What a model's weights are, in the words reports use: "q4_1", "int4-g32", "int8-g32", "float32", ..."""

from __future__ import annotations

from collections import Counter

from torch import nn

from specchat.quant.quantized_linear import QuantizedLinear


def weight_format(model: nn.Module) -> str:
    """The format most of the model's linear layers hold."""
    formats = Counter(
        layer_format(module)
        for module in model.modules()
        if isinstance(module, nn.Linear | QuantizedLinear)
    )
    return formats.most_common(1)[0][0]


def layer_format(layer: nn.Module) -> str:
    """A linear layer's format: quantized layers say theirs, dense ones give their dtype."""
    return getattr(layer, "format", None) or str(layer.weight.dtype).removeprefix("torch.")
