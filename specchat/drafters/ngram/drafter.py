"""Prompt lookup: propose what followed earlier occurrences of the context's last tokens.

Training-free; strong wherever the output copies from the prompt or from itself (code edits, summaries,
quotes). How far the context's end matches an earlier occurrence says how likely the copy goes on (MATCH_RATES:
a long match is all but certain to go on, a short one mostly does not). So a step whose last COPY_MATCH tokens
occurred before drafts as a kind of its own, "copy": the adaptive budget learns its acceptance apart from the
short matches' and sizes its trees for that acceptance, not for an average with matches that are mostly wrong.

The index maps every k-gram (k <= 3, and k = COPY_MATCH) to the positions where it ends and grows by O(1) per
committed token, so proposing never scans the context.

Given a table of the target's own answers (`ngram:DIR`, written by `specchat train ngram`; `answer_store.py`),
the lookup also proposes what the target wrote after the context's last tokens in other answers, as nodes of
their own kind (ANSWERS, which the budget counts apart).

Every node is scored by its chance to be accepted (MATCH_RATES for the context's matches, the counts of the
answers' k-grams for theirs), so a tree holds the most likely of all the chains' nodes, and the engine keeps as
many as pay for their verification.
"""

from __future__ import annotations

from collections import defaultdict

from specchat.drafters import NGRAM
from specchat.drafters.ngram.answer_store import AnswerStore, Guess
from specchat.engine.events import ANSWERS, COPY
from specchat.engine.tree import DraftTree

COPY_MATCH = 8
# (least match length, how often the token after it was the target's next one), measured on 160 of the 1.5B's
# held-out greedy answers (the most recent occurrence of the longest match). A match of L tokens whose
# next token was right is one of L + 1, so a chain's next token is right at that one's rate (after 1, 2: 0.49, 0.64).
MATCH_RATES = ((16, 0.97), (8, 0.82), (4, 0.72), (3, 0.61), (2, 0.46), (1, 0.21))
LONGEST_MATCH = 32  # matches are measured up to this many tokens: the copy is then all but certain
RECENT = 16  # occurrences of a k-gram looked at, the most recent first


class NgramDrafter:
    kind = NGRAM
    scores_nodes = True
    feature_layers = None  # reads no target states

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

    def propose(self, budget: int, sampling=None, least_chance: float = 0.0, noise=None) -> DraftTree:
        """The `budget` most likely nodes of a copy's continuations, or else of those of the k-grams (k = 3..1)
        that end the context, most recent occurrences first, and of the answer store's chain; each node scored
        by its chance to be accepted: a context chain's tokens by MATCH_RATES, the store's by its counts."""
        paths: dict[tuple[int, ...], tuple[float, str]] = {}
        copies = self.copy_sources()
        for end in copies:
            self._add_chain(paths, end, self._match_length(end), budget, COPY)
        if copies:
            return DraftTree.best(paths, budget)
        n = len(self.ids)
        for k in range(min(self.max_ngram, n), 0, -1):
            ends = self.index.get(tuple(self.ids[n - k :]), [])
            for end in [end for end in reversed(ends) if end < n - 1][: self.matches_per_ngram]:
                self._add_chain(paths, end, self._match_length(end, k, COPY_MATCH), budget, self.kind)
        path, score = (), 1.0
        for guess in self.store.chain(self.ids, budget) if self.store is not None else ():
            path, score = (*path, guess.token), score * self.store.chance(guess)
            _keep(paths, path, score, ANSWERS)
        return DraftTree.best(paths, budget)

    def _add_chain(self, paths: dict, end: int, matched: int, budget: int, origin: str) -> None:
        """The tokens after position `end`, where `matched` tokens equal the context's last ones: each token
        found right makes the match one longer."""
        path, score = (), 1.0
        for offset, token in enumerate(self.ids[end + 1 : end + 1 + budget]):
            path, score = (*path, token), score * match_rate(matched + offset)
            _keep(paths, path, score, origin)

    def _match_length(self, end: int, known: int = COPY_MATCH, longest: int = LONGEST_MATCH) -> int:
        """How many tokens up to `end` equal the context's last ones, `known` of them known to, at most `longest`."""
        ids, last = self.ids, len(self.ids) - 1
        length = known
        while length < longest and end - length >= 0 and ids[end - length] == ids[last - length]:
            length += 1
        return length


def match_rate(matched: int) -> float:
    """How often the token after a match of `matched` tokens is the target's next one (MATCH_RATES)."""
    return next(rate for least, rate in MATCH_RATES if matched >= least)


def _keep(paths: dict, path: tuple[int, ...], score: float, origin: str) -> None:
    """Score `path`, or keep its score where another chain gave it a higher one."""
    if score > paths.get(path, (-1.0, origin))[0]:
        paths[path] = (score, origin)


def build(target, checkpoint) -> NgramDrafter:
    """The registry's factory: lookup in the context, and in the answers of `checkpoint` where one is given (a
    profile's, or `ngram:DIR`)."""
    return NgramDrafter(store=AnswerStore.load(checkpoint) if checkpoint is not None else None)
