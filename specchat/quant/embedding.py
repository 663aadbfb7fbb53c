"""An embedding table kept as 8-bit codes with one scale per group of 32 (GGUF Q8_0); rows are dequantized
when looked up, so the table costs a quarter of its fp32 size."""

from __future__ import annotations

import torch
from torch import nn


class Int8Embedding(nn.Module):
    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, *, dtype: torch.dtype, format: str = "int8"):
        """`codes` [vocab, dim] int8; `scale` [vocab, dim // group]."""
        super().__init__()
        self.num_embeddings, self.embedding_dim = codes.shape
        self.format = format
        self.dtype = dtype
        self.register_buffer("codes", codes.to(torch.int8).contiguous())
        self.register_buffer("scale", scale.float().contiguous())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        groups = self.scale.shape[-1]
        codes = self.codes[ids].view(*ids.shape, groups, -1).float()
        return (codes * self.scale[ids][..., None]).view(*ids.shape, self.embedding_dim).to(self.dtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.format}"
