"""Layers that compute on a GGUF tensor's own blocks (memory-mapped from the file, never dequantized whole;
repacked in tiles of 8 or 16 rows).

`GGUFLinear` multiplies by the blocks through the CPU decoder's kernels (kernels/cpu/gguf/): activations
are quantized to int8 per row, as llama.cpp does for these types, and each row's result is bitwise the same
whatever rows share the call. Several matrices of one input (q/k/v, gate/up) stack into one layer that
multiplies them in one call, whatever their block types. `GGUFEmbedding` dequantizes only the rows it looks up.
"""

from __future__ import annotations

import torch
from torch import nn

from specchat.errors import SpecchatError
from specchat.kernels.cpu.cpu_decoder import cpu_decoder
from specchat.quant.gguf_types import BLOCK_TYPES, held_rows
from specchat.quant.quantized_linear import QuantizedLinear


def block_kernels():
    """The CPU decoder's module, whose kernels are the only ones that multiply by GGUF blocks: where it cannot be built,
    a GGUF model cannot run, which is said in one line."""
    try:
        return cpu_decoder()
    except RuntimeError as error:
        raise SpecchatError(f"{error}; GGUF blocks run on its kernels, built with the machine's C++ compiler into "
                            "torch's extension cache ($TORCH_EXTENSIONS_DIR)") from None  # fmt: skip


class GGUFLinear(QuantizedLinear):
    def __init__(self, blocks: torch.Tensor, type_id: int, in_features: int, *, dtype: torch.dtype,
                 bias: torch.Tensor | None = None):  # fmt: skip
        """`blocks` [out, bytes per row] uint8, as the file stores them, repacked in tiles of 8 rows (a copy in
        memory) when their rows come in eights."""
        super().__init__()
        kind = BLOCK_TYPES[type_id]
        if blocks.shape[1] != kind.row_bytes(in_features):
            raise ValueError(f"{kind.name} blocks of {blocks.shape[1]} bytes per row do not hold {in_features} values")
        blocks, unit_rows = block_kernels().gguf_tile(blocks, type_id, in_features)
        self._hold([blocks], [type_id], [unit_rows], in_features, None if bias is None else bias.to(dtype))

    @classmethod
    def stacked(cls, layers: list[GGUFLinear], bias: torch.Tensor | None) -> GGUFLinear | None:
        """One layer over all of `layers`' matrices (the same blocks, not copies), outputs side by side."""
        if len({layer.in_features for layer in layers}) != 1:
            return None
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        matrices = [matrix for each in layers for matrix in each.matrices]
        types = [type_id for each in layers for type_id in each.type_ids]
        units = [unit_rows for each in layers for unit_rows in each.unit_rows]
        layer._hold(matrices, types, units, layers[0].in_features, bias)
        return layer

    def _hold(self, matrices: list[torch.Tensor], type_ids: list[int], unit_rows: list[int], in_features: int,
              bias) -> None:  # fmt: skip
        """Matrices held in units of `unit_rows` rows each: 1, the file's blocks; 8 or 16, repacked in tiles."""
        self.type_ids, self.unit_rows, self.in_features = type_ids, unit_rows, in_features
        self.out_features = sum(held_rows(matrix, units) for matrix, units in zip(matrices, unit_rows))
        names = (BLOCK_TYPES[t].name for t in type_ids)
        self.format = "+".join(dict.fromkeys(names))  # "q4_k", "q4_k+q6_k"
        for i, matrix in enumerate(matrices):
            self.register_buffer(f"blocks_{i}", matrix, persistent=False)
        self.register_buffer("bias", bias, persistent=False)

    @property
    def matrices(self) -> list[torch.Tensor]:
        return [getattr(self, f"blocks_{i}") for i in range(len(self.type_ids))]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        terms = 2 if x.dtype == torch.float32 else 1  # fp32 activations in two int8 terms, as the CPU decoder's
        out = cpu_decoder().gguf_matmul(flat, self.matrices, self.type_ids, self.unit_rows, self.in_features, "best",
                                        terms)
        out = out.to(x.dtype)
        if self.bias is not None:
            out += self.bias
        return out.view(*x.shape[:-1], self.out_features)

    def dequantize(self) -> torch.Tensor:
        """The weight matrix [out, in] in float32 (tests and small models only: it is the whole matrix)."""
        return self.dequantize_rows(torch.arange(self.out_features))

    def dequantize_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Rows `rows` of the weight matrix [len(rows), in] in float32, each unpacked from its matrix's blocks."""
        out, first = torch.empty(len(rows), self.in_features), 0
        for matrix, type_id, units in zip(self.matrices, self.type_ids, self.unit_rows):
            count = held_rows(matrix, units)
            inside = ((rows >= first) & (rows < first + count)).nonzero().flatten()
            if len(inside):
                out[inside] = cpu_decoder().gguf_rows(matrix, type_id, units, self.in_features, rows[inside] - first)
            first += count
        return out

    def native(self, decoder):
        return decoder.gguf_linear(self.matrices, self.type_ids, self.unit_rows, self.in_features, self.bias)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, {self.format}"


class GGUFEmbedding(nn.Module):
    """Rows of a GGUF matrix, dequantized in fp32 and times `scale` (Gemma's sqrt(hidden)), then rounded once."""

    def __init__(self, blocks: torch.Tensor, type_id: int, embedding_dim: int, *, dtype: torch.dtype,
                 scale: float = 1.0):  # fmt: skip
        super().__init__()
        self.type_id, self.embedding_dim, self.num_embeddings = type_id, embedding_dim, blocks.shape[0]
        self.format, self.dtype, self.scale = BLOCK_TYPES[type_id].name, dtype, scale
        self.register_buffer("blocks", blocks, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = cpu_decoder().gguf_rows(self.blocks, self.type_id, 1, self.embedding_dim, ids.reshape(-1))
        if self.scale != 1.0:
            rows = rows * self.scale
        return rows.to(self.dtype).view(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.format}"
