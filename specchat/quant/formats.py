"""What a model's weights are, in the words reports use: "q4_1", "int4-g32", "int8-g32", "float32", ..."""

from __future__ import annotations

from collections import Counter

from torch import nn

from specchat.quant.quantized_linear import QuantizedLinear


def weight_format(model: nn.Module) -> str:
    """The format most of the model's linear weights are in, counted by their values (a Q3_K_M file's few large
    Q3_K matrices outweigh its many small Q4_K and Q5_K ones)."""
    formats = Counter()
    for module in model.modules():
        if isinstance(module, nn.Linear | QuantizedLinear):
            formats[layer_format(module)] += module.in_features * module.out_features
    return formats.most_common(1)[0][0]


def layer_format(layer: nn.Module) -> str:
    """A linear layer's format: quantized layers say theirs, dense ones give their dtype."""
    return getattr(layer, "format", None) or str(layer.weight.dtype).removeprefix("torch.")
