"""Layers that compute on a GGUF tensor's own blocks (memory-mapped from the file, never dequantized whole).

`GGUFLinear` multiplies by the blocks through the CPU decoder's kernels (kernels/gguf_blocks.h): activations
are quantized to int8 per row, as llama.cpp does for these types, and each row's result is bitwise the same
whatever rows share the call. `GGUFEmbedding` dequantizes only the rows it looks up.
"""

from __future__ import annotations

import torch
from torch import nn

from specchat.kernels.cpu_decoder import cpu_decoder
from specchat.quant.gguf_types import BLOCK_TYPES


class GGUFLinear(nn.Module):
    def __init__(self, blocks: torch.Tensor, type_id: int, in_features: int, *, dtype: torch.dtype,
                 bias: torch.Tensor | None = None):  # fmt: skip
        """`blocks` [out, bytes per row] uint8, as the file stores them."""
        super().__init__()
        kind = BLOCK_TYPES[type_id]
        if blocks.shape[1] != kind.row_bytes(in_features):
            raise ValueError(f"{kind.name} blocks of {blocks.shape[1]} bytes per row do not hold {in_features} values")
        self.type_id, self.in_features, self.out_features = type_id, in_features, blocks.shape[0]
        self.format = kind.name  # what the weights are, for reports
        self.register_buffer("blocks", blocks, persistent=False)
        self.register_buffer("bias", None if bias is None else bias.to(dtype), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        out = cpu_decoder().gguf_matmul(flat, [self.blocks], [self.type_id], self.in_features, False).to(x.dtype)
        if self.bias is not None:
            out += self.bias
        return out.view(*x.shape[:-1], self.out_features)

    def dequantize(self) -> torch.Tensor:
        """The weight matrix [out, in] in float32 (tests and small models only: it is the whole matrix)."""
        rows = torch.arange(self.out_features)
        return cpu_decoder().gguf_rows(self.blocks, self.type_id, self.in_features, rows)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, {self.format}"


class GGUFEmbedding(nn.Module):
    def __init__(self, blocks: torch.Tensor, type_id: int, embedding_dim: int, *, dtype: torch.dtype):
        super().__init__()
        self.type_id, self.embedding_dim, self.num_embeddings = type_id, embedding_dim, blocks.shape[0]
        self.format, self.dtype = BLOCK_TYPES[type_id].name, dtype
        self.register_buffer("blocks", blocks, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = cpu_decoder().gguf_rows(self.blocks, self.type_id, self.embedding_dim, ids.reshape(-1))
        return rows.to(self.dtype).view(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.format}"
