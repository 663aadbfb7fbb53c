"""The protocol every drafter implements: the engine drives it, it never sees the target's internals."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # no torch for option checks that only need the drafters' names
    from specchat.engine.tree import DraftTree


class Drafter(Protocol):
    kind: str  # the origin recorded for tokens it proposes ("ngram", "model", "heads", ...)

    def prefill(self, ids: list[int]) -> None:
        """Start over on the committed ids of a new request (prompt included)."""

    def propose(self, budget: int) -> DraftTree:
        """A tree of at most `budget` nodes below the last committed id (possibly empty)."""

    def commit(self, tokens: list[int]) -> None:
        """Tokens the engine committed since the last call (accepted drafts and the target's own)."""
