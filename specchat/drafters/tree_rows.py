"""A draft tree's rows as a drafter grows it, one depth per draft forward (LongSpec's layer, a draft model's).

Each forward runs the newest rows; they attend to what the drafter keeps of the context, then to their
ancestors' rows and themselves. This keeps which rows each row sees and, per draft layer, the keys and values
every forward wrote, in row order, so that a forward reads them in one `torch.cat` with the context's.

Which rows a row sees is a matrix on the drafter's device, grown from parent rows that may be a device tensor
(a beam's choice): a drafter never reads its choices back to the host to build the next depth's mask, so on a
GPU its depths queue one after another without waiting for the device.
"""

from __future__ import annotations

import torch

from specchat.engine.tree import ROOT


class TreeRows:
    def __init__(self, layers: int = 1, device: torch.device | str = "cpu"):
        self.visible = torch.zeros(0, 0, dtype=torch.bool, device=device)  # [rows, rows]: row i sees row j
        self.keys: list[list[torch.Tensor]] = [[] for _ in range(layers)]  # per layer: [kv_heads, rows, D] chunks
        self.values: list[list[torch.Tensor]] = [[] for _ in range(layers)]

    def __len__(self) -> int:
        return self.visible.shape[0]

    def add(self, parents: list[int] | torch.Tensor) -> range:
        """Rows for new nodes below these parent rows: a list (ROOT: the tree's root, when it is not itself a row),
        or a tensor of rows on the device; returns their rows."""
        first, count, device = len(self), len(parents), self.visible.device
        if isinstance(parents, torch.Tensor):
            seen = self.visible[parents]
        else:  # rows picked one by one: no list of host ints copied to the device
            nothing = torch.zeros(first, dtype=torch.bool, device=device)
            seen = torch.stack([nothing if parent == ROOT else self.visible[parent] for parent in parents])
        own = torch.eye(count, dtype=torch.bool, device=device)
        above = torch.zeros(first, count, dtype=torch.bool, device=device)
        self.visible = torch.cat([torch.cat([self.visible, above], dim=1), torch.cat([seen, own], dim=1)])
        return range(first, first + count)

    def seen(self, rows: range) -> torch.Tensor:
        """[rows, all rows so far]: True where a row sees a row (its ancestors and itself)."""
        return self.visible[rows.start : rows.stop]

    def write(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """The newest rows' keys and values, one [kv_heads, rows, D] tensor per layer."""
        for layer, (k, v) in enumerate(zip(keys, values, strict=True)):
            self.keys[layer].append(k)
            self.values[layer].append(v)
