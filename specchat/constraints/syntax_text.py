"""A byte syntax over a model's ids, as a `Constraint` the engine masks its rows with: JSON mode (one JSON object,
OpenAI's `response_format: {"type": "json_object"}`, ollama's `format: "json"`), one a JSON Schema allows
(`{"type": "json_schema"}`), or a text a GBNF grammar derives; then the end."""

from __future__ import annotations

import torch

from specchat.constraints.forced_text import ForcedIds
from specchat.constraints.token_masks import TokenMasks, Vocabulary, feed_bytes


class SyntaxText:
    """`syntax` (json_syntax, a JsonSchema or a Grammar) over `vocabulary`'s ids; `end_ids` (the model's EOS ids)
    may come only once the text is whole. With `encode` (text -> ids) what the syntax forces is drafted: worth it
    where the syntax leaves no choice about whitespace (a Llama 3 tool call's canonical layout, a grammar's
    literals)."""

    def __init__(self, vocabulary: Vocabulary, syntax, end_ids: frozenset[int], encode=None):
        self.vocabulary, self.syntax, self.end_ids = vocabulary, syntax, end_ids
        self.start = syntax.start
        self.masks = TokenMasks(vocabulary, syntax, end_ids)
        self._forced = ForcedIds(vocabulary, syntax, encode) if encode is not None else None

    def allowed(self, state: tuple) -> torch.Tensor:
        return self.masks.allowed(state)

    def advance(self, state: tuple, token: int) -> tuple | None:
        if token in self.end_ids:
            return state if self.syntax.complete(state) else None
        pieces = self.vocabulary.pieces
        piece = pieces[token] if token < len(pieces) else None
        return feed_bytes(self.syntax, state, piece) if piece else None

    def forced(self, state: tuple) -> list[int]:
        """None without `encode`: JSON mode's optional whitespace leaves a choice nearly everywhere, and the n-gram
        drafter already proposes the keys an answer repeats."""
        return self._forced(state) if self._forced is not None else []
