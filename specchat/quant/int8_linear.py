"""A linear layer whose weights are 8-bit codes with one scale per group: w = d * q, q in -128..127 (GGUF Q8_0).

torch's CPU int8 kernel takes one scale per output row only, so group-wise int8 runs on the int4 kernel
instead: q = 16 * hi + lo splits into two 4-bit planes, hi in -8..7 with scale 16 d and lo in 0..15 with
scale d, and x W^T = x W_hi^T + x W_lo^T. Both planes hold exact multiples of d, so the weights the kernel
sees are exactly d * q; the bytes read are those of int8 weights.
"""

from __future__ import annotations

import torch

from specchat.quant.int4_linear import empty_stack, int4_matmul, pack, scales_and_zeros
from specchat.quant.quantized_linear import QuantizedLinear


class Int8Linear(QuantizedLinear):
    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, *, group_size: int, dtype: torch.dtype,
                 bias: torch.Tensor | None = None, format: str = "int8"):  # fmt: skip
        """`codes` [out, in] int8; `scale` [out, in // group_size]."""
        super().__init__()
        self.out_features, self.in_features = codes.shape
        high = codes >> 4  # -8..7: the arithmetic shift floors
        scale = scale.float()
        self._hold(
            pack(high + 8),  # (code - 8) * 16 d + 0 = 16 d hi
            pack(codes & 15),  # lo = code - 16 hi: (code - 8) * d + 8 d = d lo
            scales_and_zeros(16 * scale, torch.zeros_like(scale), dtype),
            scales_and_zeros(scale, 8 * scale, dtype),
            group_size, format, bias, dtype,
        )  # fmt: skip

    @classmethod
    def stacked(cls, layers: list[Int8Linear], bias: torch.Tensor | None) -> Int8Linear | None:
        """One layer whose outputs are those of `layers` side by side; None unless they share input size,
        groups and format and all but the last are a multiple of PACK_BLOCK rows."""
        layer = empty_stack(cls, layers)
        if layer is None:
            return None
        first = layers[0]
        planes = [torch.cat([getattr(each, name) for each in layers]) for name in ("high", "low")]
        scales = [torch.cat([getattr(each, name) for each in layers], dim=1).contiguous()
                  for name in ("high_scales", "low_scales")]  # fmt: skip
        layer._hold(*planes, *scales, first.group_size, first.format, bias, scales[0].dtype)
        return layer

    def _hold(self, high, low, high_scales, low_scales, group_size: int, format: str, bias, dtype) -> None:
        self.group_size = group_size
        self.format = format
        self.register_buffer("high", high)
        self.register_buffer("low", low)
        self.register_buffer("high_scales", high_scales)
        self.register_buffer("low_scales", low_scales)
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
