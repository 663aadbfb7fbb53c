"""TokenSwift's drafting cache: per layer and KV head, the first SINKS positions and the most important
others, up to a budget of B slots; verification always reads the engine's full cache.

A draft forward then reads B keys per layer instead of the whole context: at 100K tokens that is most of a
decode step's memory traffic saved. The slots are a compact copy of the engine's cache in a `TreeCache` of
B + 1 slots (the last one takes the drafted root's own keys, never committed), so the target's own forward
runs over it unchanged. Positions stay where RoPE put them: a key keeps its rotation, the query is rotated at
its true position, so attention over the copy is attention over those positions.

Importance (TokenSwift, section 3.3): the last query's q.k, summed over the query heads of each KV head's
group, per layer (every layer's query from one target forward of the root, `TargetView.layer_queries`). Selected slots
are ordered by importance, and each newly committed position overwrites the least important slot left; once new
positions have taken every non-sink slot, the next draft selects again (about every B - SINKS tokens), with the queries
of one target forward over the full cache.
"""

from __future__ import annotations

import torch

from specchat.engine.cache import TreeCache
from specchat.engine.host_data import to_device

SINKS = 16


class PartialKV:
    def __init__(self, target, budget: int):
        if budget <= SINKS:
            raise ValueError(f"a partial cache needs more than {SINKS} slots")
        self.target, self.budget = target, budget
        self.cache = TreeCache(target.config.num_hidden_layers, budget + 1)
        self.synced = 0  # positions of the engine's cache copied in
        self.overwrite: list[int] = []  # slots new positions take next, least important first
        self.selections = 0

    @property
    def length(self) -> int:
        """Positions of the engine's cache accounted for: copied in, or passed over by a selection."""
        return self.synced

    def truncate(self, length: int) -> None:
        """Forget the positions from `length` on. The slots hold a selection, not a prefix, so any cut empties
        them: the next `prepare` copies or selects afresh."""
        if length < self.synced:
            self.cache.truncate(0)
            self.synced, self.overwrite = 0, []

    def prepare(self, root: int) -> TreeCache:
        """The cache to draft from, brought up to the engine's committed prefix (`root` is the token after it)."""
        full, device = self.target.cache, self.target.device
        self.truncate(full.length)  # the engine went back (a new prompt sharing less): start again
        new = range(self.synced, full.length)
        if self.cache.length + len(new) <= self.budget and not self.overwrite:
            self._copy(torch.arange(self.synced, full.length, device=device), self.cache.length)  # all of it fits
        elif len(new) <= len(self.overwrite):
            slots, self.overwrite = self.overwrite[: len(new)], self.overwrite[len(new) :]
            self._write(to_device(list(new), device), to_device(slots, device))
        else:
            self._select(root)
        self.synced = full.length
        return self.cache

    def _copy(self, positions: torch.Tensor, start: int) -> None:
        """Positions (the same for every head) into slots start.. of every layer, and commit them."""
        count = len(positions)
        self._write(positions, torch.arange(start, start + count, device=positions.device))
        for layer in self.cache.layers:
            layer.length, layer.pending = start + count, 0

    def _write(self, positions: torch.Tensor, slots: torch.Tensor) -> None:
        """The engine's keys and values at `positions` into `slots` of every layer (both on the device)."""
        self.cache.allocate_like(self.target.cache)
        for mine, theirs in zip(self.cache.layers, self.target.cache.layers):
            mine.keys[0, :, slots], mine.values[0, :, slots] = theirs.read(positions)

    def _select(self, root: int) -> None:
        """Sinks + the (budget - SINKS) most important later positions per layer and KV head, by importance."""
        full = self.target.cache
        length = full.length
        queries = self.target.layer_queries(root, length)  # [layers, heads, D]
        keep = self.budget - SINKS
        self.cache.allocate_like(full)
        for layer, (mine, theirs, query) in enumerate(zip(self.cache.layers, full.layers, queries)):
            keys, values = theirs.read(slice(0, length))  # [kv_heads, L, D]
            scores = importance(query, keys[:, SINKS:])
            order = scores.topk(keep, dim=-1).indices + SINKS  # [kv_heads, keep], most important first
            sinks = torch.arange(SINKS, device=order.device).expand(order.shape[0], -1)
            index = torch.cat([sinks, order], dim=1)[:, :, None]
            mine.keys[0, :, : self.budget] = keys.gather(1, index.expand(-1, -1, keys.shape[-1]))
            mine.values[0, :, : self.budget] = values.gather(1, index.expand(-1, -1, values.shape[-1]))
            mine.length, mine.pending = self.budget, 0
        self.overwrite = list(range(self.budget - 1, SINKS - 1, -1))
        self.selections += 1



def importance(query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Per KV head, the q.k of every key summed over the query heads that share it.

    Args:
        query: [heads, D], post-RoPE
        keys: [kv_heads, L, D], post-RoPE
    Returns: [kv_heads, L] (fp32)
    """
    kv_heads = keys.shape[0]
    grouped = query.float().reshape(kv_heads, -1, query.shape[-1]).sum(dim=1)  # sum of q.k = (sum of q).k
    return torch.einsum("kd,kld->kl", grouped, keys.float())
