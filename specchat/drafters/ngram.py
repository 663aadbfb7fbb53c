"""Prompt lookup: propose what followed earlier occurrences of the context's last tokens.

Training-free; strong wherever the output copies from the prompt or from itself (code edits, summaries,
quotes). How far the context's end matches an earlier occurrence says how likely the copy goes on. On the
1.5B's own answers (2026-11-27, the training answers' first 800 records), the token after a match of 3 tokens
was the target's next one 62% of the time, after 8-11 tokens 80%, after 16-31 91% and after 32 or more 99%.
So a step whose last COPY_MATCH tokens occurred before drafts as a kind of its own, "copy": the adaptive budget
learns its acceptance apart from the short matches' and sizes its trees for that acceptance, not for an average
with matches that are mostly wrong (chat answers: 16-22% of n-gram nodes accepted).

The index maps every k-gram (k <= 3, and k = COPY_MATCH) to the positions where it ends and grows by O(1) per
committed token, so proposing never scans the context.

Given a table of the target's own answers (`ngram:DIR`, written by `specchat train ngram`; `answer_store.py`),
the lookup also proposes what the target wrote after the context's last tokens in other answers, as nodes of
their own kind (ANSWERS, which the budget counts apart): that chain first where it matched more of the
context's end than any earlier occurrence in the context did, else after the context's chains.
"""

from __future__ import annotations

from collections import defaultdict

from specchat.drafters.answer_store import AnswerStore, Guess
from specchat.engine.events import ANSWERS, COPY
from specchat.engine.tree import DraftTree, TreeBuilder

COPY_MATCH = 8
LONGEST_MATCH = 32  # matches are measured up to this many tokens: the copy is then all but certain
RECENT = 16  # occurrences of a k-gram looked at, the most recent first


class NgramDrafter:
    kind = "ngram"

    def __init__(self, *, max_ngram: int = 3, matches_per_ngram: int = 4, store: AnswerStore | None = None):
        self.max_ngram = max_ngram
        self.matches_per_ngram = matches_per_ngram
        self.store = store
        self.ids: list[int] = []
        self.index: dict[tuple[int, ...], list[int]] = defaultdict(list)  # k-gram -> positions of its last token
        self._copies: tuple[int, list[int]] | None = None  # (len(ids), copy sources) of the last lookup
        self._guess: tuple[int, Guess | None] | None = None  # (len(ids), the store's guess) likewise

    def prefill(self, ids: list[int], hidden=None, reused: int = 0) -> None:
        self.ids, self.index, self._copies, self._guess = [], defaultdict(list), None, None
        self.commit(ids)

    def commit(self, tokens: list[int], hidden=None) -> None:
        for token in tokens:
            self.ids.append(token)
            end = len(self.ids) - 1
            for k in (*range(1, self.max_ngram + 1), COPY_MATCH):
                if k <= end + 1:
                    self.index[tuple(self.ids[end - k + 1 : end + 1])].append(end)

    def next_kinds(self) -> frozenset[str]:
        if self.copy_sources():
            return frozenset({COPY})
        return frozenset({self.kind, ANSWERS}) if self._answer() is not None else frozenset({self.kind})

    def copy_sources(self) -> list[int]:
        """Where the context's last COPY_MATCH tokens occurred before (the positions of their last token), the
        longest match first (measured up to LONGEST_MATCH), the most recent among equals."""
        n = len(self.ids)
        if self._copies is None or self._copies[0] != n:
            ends = self.index.get(tuple(self.ids[n - COPY_MATCH :]), []) if n > COPY_MATCH else []
            recent = [end for end in reversed(ends) if end < n - 1][:RECENT]
            self._copies = (n, sorted(recent, key=lambda end: -self._match_length(end)))
        return self._copies[1]

    def _answer(self) -> Guess | None:
        """The answer store's guess after the context (None without a store, or where it knows no k-gram)."""
        n = len(self.ids)
        if self._guess is None or self._guess[0] != n:
            self._guess = (n, self.store.guess(self.ids) if self.store is not None else None)
        return self._guess[1]

    def propose(self, budget: int, sampling=None, generator=None) -> DraftTree:
        """A copy's continuations, or else those of the longest matching k-gram (k = 3..1), most recent
        occurrence first, and the answer store's chain: first where it matched more of the context's end."""
        copies = self.copy_sources()
        if copies:
            return DraftTree.from_chains([self.ids[end + 1 : end + 1 + budget] for end in copies], COPY, budget)
        n = len(self.ids)
        chains, matched = [], 0
        for k in range(min(self.max_ngram, n), 0, -1):
            ends = self.index.get(tuple(self.ids[n - k :]), [])
            recent = [end for end in reversed(ends) if end < n - 1][: self.matches_per_ngram]
            chains += [(self.ids[end + 1 : end + 1 + budget], self.kind) for end in recent]
            if recent and not matched:
                matched = self._match_length(recent[0], k, COPY_MATCH)
        if (answer := self._answer()) is not None:
            answered = ([guess.token for guess in self.store.chain(self.ids, budget)], ANSWERS)
            chains = [answered, *chains] if answer.order > matched else [*chains, answered]
        builder = TreeBuilder()
        for chain, origin in chains:
            builder.add_chain(chain, origin, budget=budget)
        return builder.build()

    def _match_length(self, end: int, known: int = COPY_MATCH, longest: int = LONGEST_MATCH) -> int:
        """How many tokens up to `end` equal the context's last ones, `known` of them known to, at most `longest`."""
        ids, last = self.ids, len(self.ids) - 1
        length = known
        while length < longest and end - length >= 0 and ids[end - length] == ids[last - length]:
            length += 1
        return length


def build(target, checkpoint) -> NgramDrafter:
    """The registry's factory: lookup in the context, and in the answers of `checkpoint` where one is given (a
    profile's, or `ngram:DIR`)."""
    return NgramDrafter(store=AnswerStore.load(checkpoint) if checkpoint is not None else None)
