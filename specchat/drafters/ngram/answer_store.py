"""The target's own answers as a lookup table: what the target wrote next after the context's last tokens.

Prompt lookup finds continuations in the context alone, so it has nothing to offer where an answer does not
copy (chat: "Here are three ...", "```python\\n", the closing "Let me know if ..."). A model writes such phrases
again and again, so its greedy answers to other prompts predict them, as REST's datastore does (He et al.,
2023); what it gives the 1.5B is in docs/training.md ("N-gram lookup in the target's own answers").

The table maps each k-gram of the answers (k in ORDERS) to the token that followed it most often, how often
and how often the k-gram occurred; lookup backs off from the longest order that occurred. The k-grams are kept
as 64-bit hashes in one sorted array per order (a collision only costs a wrong guess, which verification
rejects), built with numpy from the token file in about a second.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
from safetensors.numpy import load_file, save_file

from specchat.errors import SpecchatError

ORDERS = (12, 8, 6, 4, 3, 2, 1)  # the context lengths looked up, longest first
CONTEXT = 16  # prompt tokens kept before each answer: an answer's first tokens follow the chat template's end
FILE = "answers.safetensors"
_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # odd: the hash's base, as Fibonacci hashing's


class Guess(NamedTuple):
    token: int
    order: int  # how many of the context's last tokens matched
    count: int  # how often `token` followed them
    total: int  # how often they occurred with a next token


class _Order(NamedTuple):
    hashes: np.ndarray  # [k-grams] uint64, sorted
    tokens: np.ndarray  # [k-grams] int32: the most frequent next token
    counts: np.ndarray  # [k-grams] int32: its count
    totals: np.ndarray  # [k-grams] int32: the k-gram's occurrences


class AnswerStore:
    """Longest-match lookup over `tokens` (records end to end: record r is tokens[starts[r]:starts[r + 1]], whose
    tokens from `answer_starts[r]` on are the target's; only those are ever guessed)."""

    def __init__(self, tokens: np.ndarray, starts: np.ndarray, answer_starts: np.ndarray):
        self.tokens = tokens.astype(np.int64)
        self.starts, self.answer_starts = starts.astype(np.int64), answer_starts.astype(np.int64)
        record = np.repeat(np.arange(len(self.answer_starts)), np.diff(self.starts))
        first = self.starts[record]  # each position's record start
        guessed = np.nonzero(np.arange(len(self.tokens)) >= self.answer_starts[record])[0]
        self.orders = {k: self._order(k, guessed[guessed - k >= first[guessed]]) for k in ORDERS}

    def _order(self, k: int, positions: np.ndarray) -> _Order:
        """The table of k-grams ending just before `positions` and the tokens at them."""
        if not len(positions):
            nothing = np.zeros(0, dtype=np.int32)
            return _Order(np.zeros(0, dtype=np.uint64), nothing, nothing, nothing)
        hashes = np.zeros(len(positions), dtype=np.uint64)
        for back in range(1, k + 1):
            hashes = _mix(hashes, self.tokens[positions - back])
        nexts = self.tokens[positions]
        order = np.lexsort((nexts, hashes))
        hashes, nexts = hashes[order], nexts[order]
        pair_start = np.flatnonzero(np.r_[True, (hashes[1:] != hashes[:-1]) | (nexts[1:] != nexts[:-1])])
        pair_counts = np.diff(np.r_[pair_start, len(hashes)])
        pair_hashes, pair_nexts = hashes[pair_start], nexts[pair_start]
        best_first = np.lexsort((-pair_counts, pair_hashes))  # each k-gram's most frequent next token first
        pair_hashes, pair_nexts, pair_counts = pair_hashes[best_first], pair_nexts[best_first], pair_counts[best_first]
        gram_start = np.flatnonzero(np.r_[True, pair_hashes[1:] != pair_hashes[:-1]])
        totals = np.add.reduceat(pair_counts, gram_start)
        return _Order(pair_hashes[gram_start], pair_nexts[gram_start].astype(np.int32),
                      pair_counts[gram_start].astype(np.int32), totals.astype(np.int32))  # fmt: skip

    def guess(self, context: list[int]) -> Guess | None:
        """The token that most often followed the longest order of `context`'s end found in the answers."""
        value = np.uint64(0)
        hashes = {}
        for back in range(1, min(max(ORDERS), len(context)) + 1):
            value = _mix(value, np.int64(context[-back]))
            hashes[back] = value
        for k in ORDERS:
            if k not in hashes:
                continue
            table = self.orders[k]
            at = int(np.searchsorted(table.hashes, hashes[k]))
            if at < len(table.hashes) and table.hashes[at] == hashes[k]:
                return Guess(int(table.tokens[at]), k, int(table.counts[at]), int(table.totals[at]))
        return None

    def chain(self, context: list[int], length: int) -> list[Guess]:
        """Up to `length` guesses, each one's token appended to the context before the next."""
        context, guesses = list(context[-max(ORDERS) :]), []
        while len(guesses) < length and (guess := self.guess(context)) is not None:
            guesses.append(guess)
            context.append(guess.token)
        return guesses

    @staticmethod
    def chance(guess: Guess) -> float:
        """A guess's estimated chance to be right: its share of the k-gram's occurrences with one pseudo-occurrence
        added (on held-out answers a k-gram seen once was followed by the same token 62% of the time)."""
        return guess.count / (guess.total + 1)

    @classmethod
    def from_records(cls, records: list[tuple[list[int], list[int]]]) -> AnswerStore:
        """From (prompt ids, answer ids) pairs, each answer behind its prompt's last CONTEXT tokens."""
        parts, starts, answer_starts = [], [0], []
        for prompt, answer in records:
            head = list(prompt[-CONTEXT:])
            parts.append(np.asarray(head + list(answer), dtype=np.int64))
            answer_starts.append(starts[-1] + len(head))
            starts.append(starts[-1] + len(parts[-1]))
        tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        return cls(tokens, np.asarray(starts), np.asarray(answer_starts))

    def save(self, folder: Path) -> None:
        save_file({"tokens": self.tokens.astype(np.int32), "starts": self.starts.astype(np.int64),
                   "answer_starts": self.answer_starts.astype(np.int64)}, str(folder / FILE))  # fmt: skip

    @classmethod
    def load(cls, folder: Path) -> AnswerStore:
        if not (folder / FILE).is_file():
            raise SpecchatError(
                f"{folder} holds no answers for n-gram lookup ({FILE}; `specchat train ngram` writes it)"
            )
        arrays = load_file(str(folder / FILE))
        return cls(arrays["tokens"], arrays["starts"], arrays["answer_starts"])


def _mix(hashes, tokens):
    """The hash of a k-gram extended one token back: polynomial in the tokens (1 added, so 0 counts)."""
    with np.errstate(over="ignore"):
        return hashes * _MULTIPLIER + (np.asarray(tokens).astype(np.uint64) + np.uint64(1))
