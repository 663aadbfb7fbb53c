"""Earlier texts' cached prefixes kept beside the target's cache, as llama-server's slots and vLLM's prefix cache
keep theirs: a client that comes back (an editor, a chat web UI, an agent resending its conversation) finds its
keys and values even after other clients' requests took the cache.

When a request is about to overwrite the cache's text, that text's keys and values are copied here; a request
whose prompt shares a longer prefix with a kept text than with the cache gets it copied back. Kept by recency
within a byte budget. Used only where reuse is exact (`Engine.exact_reuse`): a kept prefix is then bitwise what
prefilling it again would compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specchat.engine.cache import TreeCache

MIN_TOKENS = 64  # shorter texts are not worth a copy: prefilling them again takes about as long


@dataclass
class KeptPrefix:
    ids: list[int]  # the text whose keys and values these are, position by position
    layers: list[tuple[torch.Tensor, ...]]  # `TreeCache.copy`

    @property
    def bytes(self) -> int:
        return sum(part.numel() * part.element_size() for parts in self.layers for part in parts)


class PrefixStore:
    def __init__(self, budget_bytes: int):
        self.budget = budget_bytes
        self.kept: list[KeptPrefix] = []  # most recently used last

    def reuse(self, prompt: list[int], current: list[int], shared: int, cache: TreeCache) -> int:
        """How much of `prompt` the cache holds once this returns: the `shared` positions its text `current`
        shares with it, or more, restored from a kept text. `current` is kept first if it is about to be
        overwritten."""
        best, longer = self._longest(prompt, cache)
        if shared < len(current):
            self._keep(current, cache, spare=best if longer > shared else None)
        if longer <= shared:
            return shared
        cache.restore(best.layers, longer)
        self.kept.remove(best)
        self.kept.append(best)
        return longer

    def _keep(self, ids: list[int], cache: TreeCache, spare: KeptPrefix | None) -> None:
        """Copy the cache's text `ids` (its committed slots), unless it is short or a kept copy restores it already;
        drop the kept texts the copy restores (those it begins with: all of them, but where a sliding window's layers
        hold only their last positions); then drop the least recently used beyond the budget, but `spare`."""
        if len(ids) < MIN_TOKENS or any(prefix.ids[: len(ids)] == ids and cache.restorable(prefix.layers, len(ids))
                                        for prefix in self.kept):  # fmt: skip
            return
        kept = KeptPrefix(ids, cache.copy(len(ids)))
        self.kept = [prefix for prefix in self.kept if prefix is spare or ids[: len(prefix.ids)] != prefix.ids
                     or not cache.restorable(kept.layers, len(prefix.ids))]  # fmt: skip
        self.kept.append(kept)
        while sum(prefix.bytes for prefix in self.kept) > self.budget:
            oldest = next((prefix for prefix in self.kept if prefix is not spare), None)
            if oldest is None:
                break
            self.kept.remove(oldest)

    def _longest(self, prompt: list[int], cache: TreeCache) -> tuple[KeptPrefix | None, int]:
        """The kept text sharing the longest prefix with `prompt` that its copy restores (a sliding window's layers
        hold only their last positions), and that prefix's length (the prompt's last token excluded: its logits are
        what the prefill is for)."""
        best, shared = None, 0
        for prefix in self.kept:
            n = _common(prefix.ids, prompt[:-1])
            if n > shared and cache.restorable(prefix.layers, n):
                best, shared = prefix, n
        return best, shared


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
