"""A standalone draft model's keys and values: every committed position's, stored before RoPE, and the working
cache its forwards read, a selection of them rotated at compact positions.

SpecExtend's draft reads only part of a long context: sinks and recent tokens, or the chunks the target
attends to most (`cache_policy.py`). Because keys are stored before RoPE, a selection is rotated at
positions 0, 1, ... in order, so the draft sees a short contiguous text and stays within the positions it was
trained on. A selection changes every few steps; in between, new positions are appended at the next compact
positions.
"""

from __future__ import annotations

import torch

from specchat.drafters.draft_layers import rotate


class WorkingCache:
    def __init__(self, layers: int, kv_heads: int, head_dim: int, capacity: int, working: int, *,
                 dtype: torch.dtype, device: torch.device, rotaries: list, ropes: list[int] | None = None):  # fmt: skip
        """`capacity` positions stored (the target's cache), `working` slots read; `rotaries[r](x, positions
        [1, q]) -> cos, sin` are the draft's RoPEs, `ropes[i]` the one layer i rotates by (default: the first)."""
        stored, read = (layers, kv_heads, capacity, head_dim), (layers, kv_heads, working, head_dim)
        self.stored_keys = torch.zeros(stored, dtype=dtype, device=device)  # at true positions, before RoPE
        self.stored_values = torch.zeros(stored, dtype=dtype, device=device)
        self.keys = torch.zeros(read, dtype=dtype, device=device)  # the selection, rotated at 0, 1, ...
        self.values = torch.zeros(read, dtype=dtype, device=device)
        self.rotaries, self.ropes = rotaries, ropes or [0] * layers
        self.length = 0  # positions stored
        self.positions = torch.zeros(0, dtype=torch.long, device=device)  # true position of each working slot

    @property
    def size(self) -> int:
        """Working slots in use: the next compact position."""
        return len(self.positions)

    def truncate(self, length: int) -> None:
        """Forget the positions from `length` on; the selection is emptied (the next `select` rebuilds it)."""
        self.length = min(self.length, length)
        self.positions = self.positions[:0]

    def select(self, positions: torch.Tensor) -> None:
        """Make the stored `positions` (increasing) the working cache, rotated at compact positions 0, 1, ..."""
        positions = positions.to(self.keys.device)
        count = len(positions)
        keys = self.stored_keys[:, :, positions]
        compact = torch.arange(count, device=keys.device)
        for rope in sorted(set(self.ropes)):
            layers = [i for i, r in enumerate(self.ropes) if r == rope]
            self.keys[layers, :, :count] = rotate(keys[layers], *self.tables(compact, keys, rope))
        self.values[:, :, :count] = self.stored_values[:, :, positions]
        self.positions = positions

    def append(self, keys: torch.Tensor, values: torch.Tensor, rotated: torch.Tensor) -> None:
        """Store the next positions' keys [layers, kv_heads, q, D] (before RoPE) and values, and add them to the
        working cache with `rotated`, the same keys rotated at their compact positions."""
        count = keys.shape[2]
        start, slot = self.length, self.size
        if start + count > self.stored_keys.shape[2] or slot + count > self.keys.shape[2]:
            raise RuntimeError(f"the draft's cache is full ({start + count} positions, {slot + count} working slots)")
        self.stored_keys[:, :, start : start + count] = keys
        self.stored_values[:, :, start : start + count] = values
        self.keys[:, :, slot : slot + count] = rotated
        self.values[:, :, slot : slot + count] = values
        self.length += count
        self.positions = torch.cat([self.positions, torch.arange(start, start + count, device=self.positions.device)])

    def tables(self, compact: torch.Tensor, like: torch.Tensor, rope: int = 0):
        """cos, sin [q, D] of the compact positions `compact` [q] by RoPE `rope`, in `like`'s dtype."""
        cos, sin = self.rotaries[rope](like, compact[None])
        return cos[0].to(like.dtype), sin[0].to(like.dtype)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.stored_keys, self.stored_values, self.keys, self.values))

