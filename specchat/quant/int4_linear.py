"""A linear layer whose weights are 4-bit codes in groups along the input: w = (q - 8) * scale + zero.

This is the layout of torch's CPU int4 kernel (`_weight_int4pack_mm_for_cpu`), and GGUF's Q4_0 / Q4_1 blocks
map onto it without touching a code: Q4_1 stores w = d * q + m per block of 32, that is scale = d and
zero = m + 8 d. The kernel computes each output row on its own, so a row's result is bitwise the same whether
it is computed alone or among the rows of a verification forward (tested in tests/test_quant.py).
"""

from __future__ import annotations

import torch
from torch import nn

from specchat.quant.quantized_linear import QuantizedLinear

PACK_ROWS = 4096  # codes are packed this many output rows at a time: no int32 copy of a whole large matrix
PACK_BLOCK = 64  # the kernel interleaves rows in blocks of 64: packed matrices stack at multiples of it


def pack(codes: torch.Tensor) -> torch.Tensor:
    """Codes [out, in] in 0..15 -> the kernel's packed uint8 [out, in / 2]."""
    chunks = codes.split(PACK_ROWS)
    return torch.cat([torch.ops.aten._convert_weight_to_int4pack_for_cpu(c.to(torch.int32), 1) for c in chunks])


def scales_and_zeros(scale: torch.Tensor, zero: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Per-group scale and zero [out, groups] -> the kernel's [groups, out, 2] in the activation dtype."""
    return torch.stack([scale.T, zero.T], dim=-1).to(dtype).contiguous()


def int4_matmul(x: torch.Tensor, packed: torch.Tensor, group_size: int, scales_zeros: torch.Tensor) -> torch.Tensor:
    """x [..., in] @ W^T -> [..., out]."""
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(x.reshape(-1, x.shape[-1]), packed, group_size, scales_zeros)
    return out.view(*x.shape[:-1], -1)


def stackable(layers: list[nn.Module]) -> bool:
    """Whether `layers`' packed rows can stack side by side in one layer: the same input size, group and format, and
    all but the last a multiple of PACK_BLOCK rows (where packed rows stack)."""
    same = len({(each.in_features, each.group_size, each.format) for each in layers}) == 1
    return same and all(each.out_features % PACK_BLOCK == 0 for each in layers[:-1])


class Int4Linear(QuantizedLinear):
    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, *, group_size: int,
                 dtype: torch.dtype, bias: torch.Tensor | None = None, format: str = "int4"):  # fmt: skip
        """`codes` [out, in] integers in 0..15; `scale`, `zero` [out, in // group_size]."""
        super().__init__()
        out_features, in_features = codes.shape
        if in_features % group_size or scale.shape != (out_features, in_features // group_size):
            raise ValueError(
                f"codes {tuple(codes.shape)} and scales {tuple(scale.shape)} mismatch groups of {group_size}"
            )
        self._hold(self.planes(codes, scale, zero, dtype), group_size, format, bias, dtype)

    @staticmethod
    def planes(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, dtype: torch.dtype) -> dict:
        """What the layer holds of `codes`, `scale` and `zero`, as the kernel reads them: packed codes, and scales
        and zeros in the activation dtype."""
        return {"packed": pack(codes), "scales_zeros": scales_and_zeros(scale, zero, dtype)}

    @classmethod
    def held(cls, planes: dict, *, group_size: int, format: str, dtype: torch.dtype, bias=None) -> Int4Linear:
        """The layer over `planes`, what `planes` made (packing nothing)."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer._hold(planes, group_size, format, bias, dtype)
        return layer

    @classmethod
    def stacked(cls, layers: list[Int4Linear], bias: torch.Tensor | None) -> Int4Linear | None:
        """One layer whose outputs are those of `layers` side by side; None unless they share input size,
        groups and format and all but the last are a multiple of PACK_BLOCK rows."""
        if not stackable(layers):
            return None
        first = layers[0]
        scales_zeros = torch.cat([each.scales_zeros for each in layers], dim=1).contiguous()
        planes = {"packed": torch.cat([each.packed for each in layers]), "scales_zeros": scales_zeros}
        return cls.held(planes, group_size=first.group_size, format=first.format, dtype=scales_zeros.dtype, bias=bias)

    def _hold(self, planes: dict, group_size: int, format: str, bias, dtype) -> None:
        self.out_features, half = planes["packed"].shape  # two codes a byte
        self.in_features = 2 * half
        self.group_size = group_size
        self.format = format  # what the weights are, for reports: "q4_1", "int4-g32", ...
        self.register_buffer("packed", planes["packed"])
        self.register_buffer("scales_zeros", planes["scales_zeros"])
        self.register_buffer("bias", None if bias is None else bias.to(dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = int4_matmul(x, self.packed, self.group_size, self.scales_zeros)
        return out if self.bias is None else out + self.bias

    def dequantize(self) -> torch.Tensor:
        """The weight matrix [out, in] the kernel multiplies by (computed by the kernel itself)."""
        eye = torch.eye(self.in_features, dtype=self.scales_zeros.dtype)
        return int4_matmul(eye, self.packed, self.group_size, self.scales_zeros).T.contiguous()

    def native(self, decoder):
        return decoder.Linear.int4([self.packed], [self.scales_zeros], self.group_size, self.bias)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, {self.format}, group={self.group_size}"
