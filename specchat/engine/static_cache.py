"""The torch decoder's KV cache: keys and values of every layer in two preallocated tensors
`[layers, B, Hkv, capacity, D]`, and the committed length both on the host and in a device tensor.

A forward writes its rows' keys and values into slots `[length, length + rows)` and reads the length from the
device, so it never changes the cache's bookkeeping and a CUDA graph of it replays at any length: the caller
moves the length afterwards (`advance` after a decode step or a prefill, `commit` with the verified rows kept).
"""

from __future__ import annotations

import torch


class StaticCache:
    def __init__(self, layers: int, kv_heads: int, head_dim: int, capacity: int, dtype: torch.dtype,
                 device: torch.device, *, batch: int = 1):  # fmt: skip
        shape = (layers, batch, kv_heads, capacity, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.capacity = capacity
        self.length = 0
        self.length_tensor = torch.zeros(1, dtype=torch.int32, device=device)  # what the kernels read

    def room(self, rows: int) -> None:
        """Raise unless a forward of `rows` rows fits after the committed slots."""
        if self.length + rows > self.capacity:
            raise RuntimeError(f"KV cache full: {self.length + rows} > {self.capacity} slots")

    def truncate(self, length: int) -> None:
        """Forget slots from `length` on."""
        self._set(min(length, self.length))

    def advance(self, rows: int) -> None:
        """Commit every row of the last forward (a decode step, a prefill)."""
        self.room(rows)
        self._set(self.length + rows)

    def commit(self, kept: torch.Tensor) -> None:
        """Commit the last forward's rows `kept` (ascending row indices, a root-to-node path), moved down in every
        layer to follow the prefix."""
        start, count = self.length, kept.numel()
        slots = start + kept.to(self.keys.device)
        self.keys[:, :, :, start : start + count] = self.keys[:, :, :, slots]
        self.values[:, :, :, start : start + count] = self.values[:, :, :, slots]
        self._set(start + count)

    def _set(self, length: int) -> None:
        self.length = length
        self.length_tensor.fill_(length)
