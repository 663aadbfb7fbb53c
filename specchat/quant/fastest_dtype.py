"""On a CPU, run quantized weights with float32 or bfloat16 activations: whichever is faster on this machine.

torch's int4 kernel and the decoder's int8 product are row-independent in both (what exact speculative decoding
needs), but which is faster depends on the CPU (bf16 units or not), so it is timed once per machine, weight format,
kernel and matrix shape, on the rows a decode step and a small verification tree multiply, and kept on disk. Not per
thread count: the two dtypes answer differently, and the answer must not change with `--threads`.
"""

from __future__ import annotations

import functools
import platform

import torch

from specchat.disk_cache import cache_dir, cached_json
from specchat.engine.timing import Timer
from specchat.quant.int4_linear import Int4Linear
from specchat.quant.int8_linear import Int8Linear

CANDIDATES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
ROWS = (1, 4)  # a decode step, a small verification tree


def fastest_activation_dtype(weights: str, shape: tuple[int, int]) -> torch.dtype:
    """`weights`: "int4" | "int8"; `shape`: [out, in] of a representative matrix."""
    product = "dense" if weights == "int8" else "int4pack"  # the kernel timed: a new one is measured anew
    machine = platform.processor() or platform.machine()
    key = f"{weights}|{product}|{shape[0]}x{shape[1]}|{machine}|torch={torch.__version__}"
    name = cached_json(cache_dir() / "activation_dtype.json", key, lambda: _measure(weights, shape))
    return CANDIDATES[name]


def _measure(weights: str, shape: tuple[int, int]) -> str:
    seconds = {name: _seconds(_layer(weights, shape, dtype), dtype) for name, dtype in CANDIDATES.items()}
    return min(seconds, key=seconds.get)


def _layer(weights: str, shape: tuple[int, int], dtype: torch.dtype) -> torch.nn.Module:
    out_features, in_features = shape
    groups = torch.rand(out_features, in_features // 32) * 0.01
    if weights == "int8":
        codes = torch.randint(-128, 128, shape, dtype=torch.int8)
        return Int8Linear(codes, groups, dtype=dtype)
    return Int4Linear(torch.randint(0, 16, shape), groups, groups, group_size=32, dtype=dtype)


@torch.inference_mode()
def _seconds(layer: torch.nn.Module, dtype: torch.dtype, repeats: int = 7) -> float:
    """Sum over ROWS of the median time of one call."""
    timer = Timer(repeats=repeats, warmup=1)
    inputs = [torch.randn(rows, layer.in_features, dtype=dtype) for rows in ROWS]
    return sum(timer.seconds(functools.partial(layer, x)) for x in inputs)
