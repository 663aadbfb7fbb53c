"""JSON mode: the text is one JSON object, then the end (OpenAI's `response_format: {"type": "json_object"}`,
ollama's `format: "json"`), as a `Constraint` the engine masks its rows with."""

from __future__ import annotations

import torch

from specchat.constraints import json_syntax
from specchat.constraints.token_masks import TokenMasks, vocabulary_bytes


class JsonObject:
    """JSON syntax over a tokenizer's ids (`vocab_size` of them in the model's logits); `end_ids` (the model's EOS
    ids) may come only once the object is closed, and then alone."""

    start = json_syntax.START

    def __init__(self, tokenizer, vocab_size: int, end_ids: frozenset[int]):
        self.pieces = vocabulary_bytes(tokenizer)
        self.end_ids = end_ids
        self.masks = TokenMasks(self.pieces, vocab_size, end_ids)

    def allowed(self, state: json_syntax.State) -> torch.Tensor:
        return self.masks.allowed(state)

    def advance(self, state: json_syntax.State, token: int) -> json_syntax.State | None:
        if token in self.end_ids:
            return state if json_syntax.complete(state) else None
        piece = self.pieces[token] if token < len(self.pieces) else None
        return json_syntax.feed_bytes(state, piece) if piece else None
