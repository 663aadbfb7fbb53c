"""What a model's weights are, in the words reports use: "q4_1", "int4-g32", "int8-g32", "float32", ..."""

from __future__ import annotations

from collections import Counter

from torch import nn


def weight_format(model: nn.Module) -> str:
    """The format most of the model's linear layers hold (quantized layers say theirs; dense ones their dtype)."""
    formats = Counter(
        getattr(module, "format", None) or str(module.weight.dtype).removeprefix("torch.")
        for module in model.modules()
        if isinstance(module, nn.Linear) or hasattr(module, "format") and hasattr(module, "in_features")
    )
    return formats.most_common(1)[0][0]
