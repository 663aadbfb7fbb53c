"""Prompt lookup: propose what followed earlier occurrences of the context's last 3, 2 or 1 tokens.

Training-free; strong wherever the output copies from the prompt or from itself (code edits, summaries,
quotes). The index maps every k-gram (k <= 3) to the positions where it ends and grows by O(1) per committed
token, so proposing never scans the context.
"""

from __future__ import annotations

from collections import defaultdict

from specchat.drafters.base import DraftsAlone
from specchat.engine.tree import DraftTree


class NgramDrafter(DraftsAlone):
    kind = "ngram"

    def __init__(self, *, max_ngram: int = 3, matches_per_ngram: int = 4):
        self.max_ngram = max_ngram
        self.matches_per_ngram = matches_per_ngram
        self.ids: list[int] = []
        self.index: dict[tuple[int, ...], list[int]] = defaultdict(list)  # k-gram -> positions of its last token

    def prefill(self, ids: list[int], hidden=None, reused: int = 0) -> None:
        self.ids, self.index = [], defaultdict(list)
        self.commit(ids)

    def commit(self, tokens: list[int], hidden=None) -> None:
        for token in tokens:
            self.ids.append(token)
            end = len(self.ids) - 1
            for k in range(1, min(self.max_ngram, end + 1) + 1):
                self.index[tuple(self.ids[end - k + 1 : end + 1])].append(end)

    def propose(self, budget: int, sampling=None, generator=None) -> DraftTree:
        """Continuations of the longest matching suffix first, most recent occurrence first."""
        n = len(self.ids)
        chains = []
        for k in range(min(self.max_ngram, n), 0, -1):
            ends = self.index.get(tuple(self.ids[n - k :]), [])
            recent = [end for end in reversed(ends) if end < n - 1][: self.matches_per_ngram]
            chains += [self.ids[end + 1 : end + 1 + budget] for end in recent]
        return DraftTree.from_chains(chains, self.kind, budget)


def build(target, checkpoint) -> NgramDrafter:
    """The registry's factory: n-gram lookup reads neither the target nor a checkpoint."""
    return NgramDrafter()
