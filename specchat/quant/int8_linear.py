"""A linear layer whose weights are 8-bit codes with one scale per group: w = d * q, q in -128..127 (GGUF Q8_0).

torch's CPU int8 kernel takes one scale per output row only, so group-wise int8 runs on the int4 kernel
instead: q = 16 * hi + lo splits into two 4-bit planes, hi in -8..7 with scale 16 d and lo in 0..15 with
scale d, and x W^T = x W_hi^T + x W_lo^T. Both planes hold exact multiples of d, so the weights the kernel
sees are exactly d * q; the bytes read are those of int8 weights.
"""

from __future__ import annotations

import torch
from torch import nn

from specchat.quant.int4_linear import int4_matmul, pack, scales_and_zeros, stackable
from specchat.quant.quantized_linear import QuantizedLinear


class Int8Linear(QuantizedLinear):
    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, *, group_size: int, dtype: torch.dtype,
                 bias: torch.Tensor | None = None, format: str = "int8"):  # fmt: skip
        """`codes` [out, in] int8; `scale` [out, in // group_size]."""
        super().__init__()
        self._hold(self.planes(codes, scale, dtype), group_size, format, bias, dtype)

    @staticmethod
    def planes(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> dict:
        """What the layer holds of `codes` and `scale`, as the kernel reads them: both planes packed, with their
        scales and zeros in the activation dtype."""
        high = codes >> 4  # -8..7: the arithmetic shift floors
        scale = scale.float()
        return {
            "high": pack(high + 8),  # (code - 8) * 16 d + 0 = 16 d hi
            "low": pack(codes & 15),  # lo = code - 16 hi: (code - 8) * d + 8 d = d lo
            "high_scales": scales_and_zeros(16 * scale, torch.zeros_like(scale), dtype),
            "low_scales": scales_and_zeros(scale, 8 * scale, dtype),
        }

    @classmethod
    def held(cls, planes: dict, *, group_size: int, format: str, dtype: torch.dtype, bias=None) -> Int8Linear:
        """The layer over `planes`, what `planes` made (packing nothing)."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer._hold(planes, group_size, format, bias, dtype)
        return layer

    @classmethod
    def stacked(cls, layers: list[Int8Linear], bias: torch.Tensor | None) -> Int8Linear | None:
        """One layer whose outputs are those of `layers` side by side; None unless they share input size,
        groups and format and all but the last are a multiple of PACK_BLOCK rows."""
        if not stackable(layers):
            return None
        first = layers[0]
        planes = {name: torch.cat([getattr(each, name) for each in layers]) for name in ("high", "low")}
        for name in ("high_scales", "low_scales"):
            planes[name] = torch.cat([getattr(each, name) for each in layers], dim=1).contiguous()
        dtype = planes["high_scales"].dtype
        return cls.held(planes, group_size=first.group_size, format=first.format, dtype=dtype, bias=bias)

    def _hold(self, planes: dict, group_size: int, format: str, bias, dtype) -> None:
        self.out_features, half = planes["high"].shape  # two codes a byte
        self.in_features = 2 * half
        self.group_size = group_size
        self.format = format
        for name in ("high", "low", "high_scales", "low_scales"):
            self.register_buffer(name, planes[name])
        self.register_buffer("bias", None if bias is None else bias.to(dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = int4_matmul(x, self.high, self.group_size, self.high_scales)
        out += int4_matmul(x, self.low, self.group_size, self.low_scales)
        return out if self.bias is None else out + self.bias

    def dequantize(self) -> torch.Tensor:
        """The weight matrix [out, in] the kernel multiplies by (computed by the kernel itself)."""
        eye = torch.eye(self.in_features, dtype=self.low_scales.dtype)
        high = int4_matmul(eye, self.high, self.group_size, self.high_scales)
        return (high + int4_matmul(eye, self.low, self.group_size, self.low_scales)).T.contiguous()

    def native(self, decoder):
        planes, scales = [self.high, self.low], [self.high_scales, self.low_scales]
        return decoder.Linear.int4(planes, scales, self.group_size, self.bias)  # x W^T = x W_hi^T + x W_lo^T

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, {self.format}, group={self.group_size}"
