"""A linear layer whose weights are 8-bit codes with one scale per group of 32 inputs: w = d * q, q in -128..127
(`--quantize int8`, and the LM head under `--quantize int4`).

The codes stay as they are, a byte a weight in rows, with fp32 scales: the CPU decoder's dense product
(`kernels/cpu/dense_matmul.h`) multiplies each weight d * q, exact in fp32, by the activations in fp32, every output
from its own activation row alone. Off the CPU, or where the decoder cannot be built, the matrix is dequantized for
torch's product.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from specchat.quant.quantized_linear import QuantizedLinear

GROUP = 32  # inputs a scale covers: Q8_0's block, the decoder's product's


class Int8Linear(QuantizedLinear):
    group_size = GROUP

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, *, dtype: torch.dtype,
                 bias: torch.Tensor | None = None, format: str = "int8"):  # fmt: skip
        """`codes` [out, in] int8; `scale` [out, in // 32]. Tensors already int8 and fp32 are held as they are."""
        super().__init__()
        self.out_features, self.in_features = codes.shape
        if self.in_features % GROUP or tuple(scale.shape) != (self.out_features, self.in_features // GROUP):
            raise ValueError(f"codes {tuple(codes.shape)} and scales {tuple(scale.shape)} mismatch groups of {GROUP}")
        self.format = format
        self.register_buffer("codes", codes.to(torch.int8).contiguous())
        self.register_buffer("scale", scale.float().contiguous())
        self.register_buffer("bias", None if bias is None else bias.to(dtype))

    @classmethod
    def stacked(cls, layers: list[Int8Linear], bias: torch.Tensor | None) -> Int8Linear | None:
        """One layer whose outputs are those of `layers` side by side; None unless they share input size and format."""
        if len({(each.in_features, each.format) for each in layers}) != 1:
            return None
        codes, scale = (torch.cat([getattr(each, name) for each in layers]) for name in ("codes", "scale"))
        dtype = bias.dtype if bias is not None else torch.float32
        return cls(codes, scale, dtype=dtype, bias=bias, format=layers[0].format)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        decoder = _decoder() if x.device.type == "cpu" else None
        if decoder is not None:  # rows in two dimensions, as the decoder's product takes them
            out = decoder.Projection([self.native(decoder)])(x.reshape(-1, self.in_features))
            return out.view(*x.shape[:-1], self.out_features)
        out = F.linear(x, self.dequantize().to(x.dtype))
        return out if self.bias is None else out + self.bias

    def dequantize(self) -> torch.Tensor:
        """The weight matrix [out, in], d * q in fp32."""
        return self.dequantize_rows(slice(None))

    def dequantize_rows(self, rows) -> torch.Tensor:
        codes, scale = self.codes[rows], self.scale[rows]
        return (codes.float().view(*scale.shape, GROUP) * scale[..., None]).flatten(-2)

    def native(self, decoder):
        return decoder.Linear.int8(self.codes, self.scale, self.bias)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, {self.format}, group={GROUP}"


@functools.cache
def _decoder():
    """The compiled CPU decoder, or None where it cannot be built (asked once)."""
    from specchat.kernels.cpu.cpu_decoder import cpu_decoder

    try:
        return cpu_decoder()
    except RuntimeError:
        return None
