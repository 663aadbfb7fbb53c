"""How fast this device moves memory, and how many bytes a decode step must read: the two sides of a forward's
GB/s. A decode step of a weight-bound model streams every matrix once (and its KV cache), so that count over
its time, against a large copy's rate, says how much of the memory's speed the kernels reach."""

from __future__ import annotations

import functools
import itertools

import torch
from torch import nn

from specchat.quant.quantized_linear import QuantizedLinear

COPY_BYTES = {"cuda": 2**30, "cpu": 256 * 2**20}  # per tensor of the copy reference: well past the caches


def copy_bandwidth(timer, device: torch.device) -> tuple[float, float]:
    """(seconds, bytes/s) of a large copy_ on `device`: read + written bytes / time, as STREAM's copy counts."""
    size = COPY_BYTES[device.type]
    src = torch.ones(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = timer.seconds(functools.partial(dst.copy_, src))
    return seconds, 2 * size / seconds


def weight_bytes(model: nn.Module) -> int:
    """Bytes of every linear layer's tensors (weights, blocks, scales, biases), the output head included: what
    one decode step reads of the model. A tensor two layers share is counted once."""
    seen: dict[int, int] = {}
    for module in model.modules():
        if isinstance(module, (nn.Linear, QuantizedLinear)):
            for tensor in itertools.chain(module.parameters(recurse=False), module.buffers(recurse=False)):
                if tensor is not None:
                    seen[tensor.data_ptr()] = tensor.numel() * tensor.element_size()
    return sum(seen.values())
