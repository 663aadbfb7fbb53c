"""TokenSwift's n-gram continuations on the device, looked up by a token the device holds.

The draft forward's token is the first of the 4-grams TokenSwift reuses, and it stays on the device until the
target verifies the tree: the lookup must run there too. The host table (`ngram_table.py`) stays the record; its
changed first tokens are copied here before each lookup (`update`: a few rows a step, asynchronously), into one
row of `top` continuations and counts per first token, found through a slot per token id. The lookup itself is
the same few tensor ops whatever the table holds, so a CUDA graph can replay it.
"""

from __future__ import annotations

import torch

from specchat.drafters.tokenswift.ngram_table import NgramTable
from specchat.engine.host_data import to_device


class DeviceNgrams:
    def __init__(self, table: NgramTable, device: torch.device, *, tokens: int = 1, rows: int = 1):
        """Room from the start for token ids below `tokens` (a vocabulary) and `rows` first tokens: the tensors grow
        (doubling) past them, and a graph that read them is captured again."""
        self.table = table
        self.slot_of: dict[int, int] = {}  # first token -> its row
        # [token ids] each token's row, -1 none; [rows, top, n - 1] the continuations, [rows, top] their counts, 0
        # past the last; reallocated only to grow (`storage`)
        self.slots = torch.full((max(tokens, 1),), -1, dtype=torch.long, device=device)
        self.grams = torch.zeros(max(rows, 1), table.top, table.n - 1, dtype=torch.long, device=device)
        self.counts = torch.zeros(max(rows, 1), table.top, dtype=torch.float64, device=device)
        table.changed = set(table.best)

    @property
    def storage(self) -> tuple[torch.Tensor, ...]:
        """The tensors a lookup reads: a graph that captured one replays it while they stay the same tensors."""
        return self.slots, self.grams, self.counts

    def lookup(self, first: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The continuations [top, n - 1] of the token `first` ([1] long, on the device) and their counts [top]
        (0: none), most frequent first, as of the last `update`. Tensor ops alone, the same whatever the table
        holds."""
        known = first < self.slots.shape[0]
        slot = torch.where(known, self.slots[first.clamp(max=self.slots.shape[0] - 1)], -1)
        row = slot.clamp(min=0)
        return self.grams[row][0], self.counts[row][0] * (slot >= 0)

    def follow(self, table: NgramTable) -> None:
        """Mirror `table` from now on (a new text's) in the same tensors: a graph that read them stays valid."""
        self.table, self.slot_of = table, {}
        self.slots.fill_(-1)
        table.changed = set(table.best)

    def update(self) -> None:
        """Copy the rows of the first tokens whose continuations changed since the last update."""
        changed = sorted(self.table.changed)
        self.table.changed = set()
        if not changed:
            return
        new = [first for first in changed if first not in self.slot_of]
        for first in new:
            self.slot_of[first] = len(self.slot_of)
        self._grow(max(changed) + 1, len(self.slot_of))
        if new:
            self.slots[to_device(new, self.slots.device)] = to_device([self.slot_of[f] for f in new], self.slots.device)
        top, n = self.table.top, self.table.n
        grams, counts = [], []
        for first in changed:
            best = self.table.best[first]
            grams.append([list(gram[1:]) for gram in best] + [[0] * (n - 1)] * (top - len(best)))
            counts.append([self.table.counts[gram] for gram in best] + [0] * (top - len(best)))
        rows = to_device([self.slot_of[first] for first in changed], self.grams.device)
        self.grams[rows] = to_device(grams, self.grams.device, torch.long)
        self.counts[rows] = to_device(counts, self.counts.device, torch.float64)

    def _grow(self, tokens: int, rows: int) -> None:
        """Room for token ids below `tokens` and for `rows` rows (doubling, so growing is rare)."""
        if tokens > self.slots.shape[0]:
            more = max(tokens, 2 * self.slots.shape[0]) - self.slots.shape[0]
            self.slots = torch.cat([self.slots, self.slots.new_full((more,), -1)])
        if rows > self.grams.shape[0]:
            more = max(rows, 2 * self.grams.shape[0]) - self.grams.shape[0]
            self.grams = torch.cat([self.grams, self.grams.new_zeros(more, *self.grams.shape[1:])])
            self.counts = torch.cat([self.counts, self.counts.new_zeros(more, self.counts.shape[1])])
