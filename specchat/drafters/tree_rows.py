"""A draft tree's rows as a drafter grows it, one depth per draft forward (LongSpec's layer, a draft model's).

Each forward runs the newest rows; they attend to what the drafter keeps of the context, then to their
ancestors' rows and themselves. This keeps which rows each row sees and, per draft layer, the keys and values
every forward wrote, in row order, so that a forward reads them in one `torch.cat` with the context's.
"""

from __future__ import annotations

import torch

from specchat.engine.tree import ROOT


class TreeRows:
    def __init__(self, layers: int = 1):
        self.ancestry: list[list[int]] = []  # per row: the rows it sees, its ancestors' in order, itself last
        self.keys: list[list[torch.Tensor]] = [[] for _ in range(layers)]  # per layer: [kv_heads, rows, D] chunks
        self.values: list[list[torch.Tensor]] = [[] for _ in range(layers)]

    def add(self, parents: list[int]) -> list[int]:
        """Rows for new nodes below these parent rows (ROOT: the tree's root, when it is not itself a row);
        returns their rows."""
        first = len(self.ancestry)
        for parent in parents:
            self.ancestry.append(([] if parent == ROOT else self.ancestry[parent]) + [len(self.ancestry)])
        return list(range(first, len(self.ancestry)))

    def depth(self, row: int) -> int:
        return len(self.ancestry[row])

    def seen(self, rows: list[int]) -> torch.Tensor:
        """[rows, all rows so far]: True where a row sees a row (its ancestors and itself)."""
        mask = torch.zeros(len(rows), len(self.ancestry), dtype=torch.bool)
        for i, row in enumerate(rows):
            mask[i, self.ancestry[row]] = True
        return mask

    def write(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """The newest rows' keys and values, one [kv_heads, rows, D] tensor per layer."""
        for layer, (k, v) in enumerate(zip(keys, values, strict=True)):
            self.keys[layer].append(k)
            self.values[layer].append(v)
