"""TokenSwift's token reuse: how often each 4-gram of the text occurred, and the most frequent ways to go on
from a token.

Phrases recur in a long text, so the most frequent 4-grams that start with the token a drafter is about to
propose are good extra branches. A 4-gram enters the table once its last token is `lag` tokens old (the
contextual penalty's window: what is newer is penalised, so rarely chosen again); TokenSwift preloads the
prompt the same way. Each first token keeps its `top` most frequent continuations in order, updated when
a count grows (counts only grow, so a continuation outside the list enters it as soon as it beats the
list's last), so adding a token and asking for continuations both cost O(top), whatever the text's length.
"""

from __future__ import annotations

from collections import deque

N = 4  # TokenSwift's n: the first token and the 3 the heads would draft after it
TOP = 20  # continuations kept per first token: TokenSwift's k


class NgramTable:
    def __init__(self, *, lag: int = 1024, n: int = N, top: int = TOP):
        self.lag, self.n, self.top = lag, n, top
        self.counts: dict[tuple[int, ...], int] = {}  # 4-gram -> occurrences
        self.best: dict[int, list[tuple[int, ...]]] = {}  # first token -> its most frequent 4-grams, by count
        self.recent: deque[int] = deque(maxlen=lag + n)  # the tokens not yet old enough, and the n - 1 before
        self.length = 0  # tokens added
        # first tokens whose continuations changed since a reader (`DeviceNgrams`) last took them; None: no reader
        self.changed: set[int] | None = None

    def add(self, tokens: list[int]) -> None:
        """Append tokens to the text; the 4-grams that became `lag` tokens old enter the table."""
        for token in tokens:
            self.recent.append(token)
            self.length += 1
            end = self.length - self.lag  # the 4-gram ending at this many tokens is old enough now
            if end >= self.n:
                start = len(self.recent) - 1 - self.lag - self.n + 1
                self._count(tuple(self.recent[start + i] for i in range(self.n)))

    def continuations(self, first: int) -> list[tuple[int, ...]]:
        """The most frequent n - 1 tokens after `first`, most frequent first."""
        return [gram[1:] for gram in self.best.get(first, ())]

    def _count(self, gram: tuple[int, ...]) -> None:
        count = self.counts.get(gram, 0) + 1
        self.counts[gram] = count
        best = self.best.setdefault(gram[0], [])
        if gram in best:
            best.remove(gram)
        elif len(best) >= self.top:
            if self.counts[best[-1]] >= count:
                return
            best.pop()
        if self.changed is not None:
            self.changed.add(gram[0])
        at = len(best)
        while at and self.counts[best[at - 1]] < count:
            at -= 1
        best.insert(at, gram)
