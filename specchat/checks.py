"""Option checks that run before anything slow is imported (no torch): names and ranges, one-line errors."""

from __future__ import annotations

from specchat.errors import SpecchatError

DTYPE_NAMES = ("float32", "bfloat16", "float16")
QUANTIZE = ("int4", "int8")


def check_dtype(dtype: str) -> None:
    if dtype != "auto" and dtype not in DTYPE_NAMES:
        raise SpecchatError(f"invalid dtype '{dtype}'; use auto, {', '.join(DTYPE_NAMES)}")


def check_quantize(quantize: str | None, device: str = "cpu") -> None:
    if quantize is not None and quantize not in QUANTIZE:
        raise SpecchatError(f"invalid --quantize '{quantize}'; use {', '.join(QUANTIZE)}")
    if quantize is not None and device not in ("auto", "cpu"):
        raise SpecchatError("--quantize runs on CPU only (its kernels are torch's CPU int4 kernels)")
