"""An answer that may call tools, as a `Constraint`: free text, in which every call the model opens with its
template's tag is one JSON value the calls' schema allows (laid out as the template writes one: a newline each side,
`json.dumps`'s separators), closed by the closing tag.

The tags are single tokens (Qwen's and Hermes' `<tool_call>` and `</tool_call>`), so a call begins exactly where
the model chooses the opening tag, and the text outside calls is never constrained. Once a call has closed only
whitespace, another call (`parallel`) or the end may follow, so the answer parses into its text and its calls.
`choice` is OpenAI's `tool_choice`: "auto" (the model decides), "required" (a call first) or "none" (the opening
tag is never chosen).

What the layout leaves no choice about (a named call's whole opening up to its first free value, a property's
name, the closing brackets and tag) is `forced`: the engine proposes it as a draft, so a call costs a verification
for each run of forced text instead of a step for each of its tokens.
"""

from __future__ import annotations

import torch

from specchat.constraints.forced_text import ForcedIds
from specchat.constraints.json_syntax import MAX_WHITESPACE, WHITESPACE
from specchat.constraints.token_masks import TokenMasks, Vocabulary, feed_bytes

TEXT, FIRST, CALL, AFTER = range(4)  # a state: (where, the call's JSON state in CALL, whitespace bytes in AFTER)
CHOICES = ("auto", "required", "none")


class ToolCallText:
    """`call_syntax`: one call's JSON (a JsonSchema, padded and canonical); `encode`: text -> the model's ids."""

    def __init__(self, vocabulary: Vocabulary, call_syntax, open_id: int, close_id: int, end_ids: frozenset[int],
                 encode, *, choice: str = "auto", parallel: bool = True):  # fmt: skip
        if choice not in CHOICES:
            raise ValueError(f"tool choice {choice!r}: one of {', '.join(CHOICES)}")
        self.vocabulary, self.syntax = vocabulary, call_syntax
        self._forced = ForcedIds(vocabulary, call_syntax, encode, close_id)
        self.open_id, self.close_id, self.end_ids, self.parallel = open_id, close_id, end_ids, parallel
        self.start = (FIRST if choice == "required" else TEXT, None, 0)
        self.masks = TokenMasks(vocabulary, call_syntax, frozenset({close_id}))
        self._text = torch.ones(vocabulary.size, dtype=torch.bool)
        self._text[[close_id] + ([open_id] if choice == "none" else [])] = False
        self._first = torch.zeros(vocabulary.size, dtype=torch.bool)
        self._first[open_id] = True
        # the whitespace-only tokens' lengths (the others': past any cap), for what may follow a call
        self._blank = torch.full((vocabulary.size,), MAX_WHITESPACE + 1, dtype=torch.int32)
        for token, piece in enumerate(vocabulary.pieces[: vocabulary.size]):
            if piece and all(byte in WHITESPACE for byte in piece):
                self._blank[token] = len(piece)
        self._after = torch.zeros(vocabulary.size, dtype=torch.bool)
        self._after[sorted(end_ids) + ([open_id] if parallel else [])] = True

    def allowed(self, state: tuple) -> torch.Tensor:
        where, call, spaces = state
        if where == TEXT:
            return self._text
        if where == FIRST:
            return self._first
        if where == CALL:
            return self.masks.allowed(call)
        return self._after | (self._blank <= MAX_WHITESPACE - spaces)

    def advance(self, state: tuple, token: int) -> tuple | None:
        where, call, spaces = state
        if where == CALL:
            if token == self.close_id:
                return (AFTER, None, 0) if self.syntax.complete(call) else None
            piece = self.vocabulary.pieces[token] if token < len(self.vocabulary.pieces) else None
            after = feed_bytes(self.syntax, call, piece) if piece else None
            return None if after is None else (CALL, after, 0)
        if not self.allowed(state)[token]:
            return None
        if token == self.open_id:
            return (CALL, self.syntax.start, 0)
        if where == AFTER and token not in self.end_ids:
            return (AFTER, None, spaces + int(self._blank[token]))
        return state

    def forced(self, state: tuple) -> list[int]:
        """The ids that must come next from `state`, as the tokenizer spells the text they make: a required call's
        opening tag, then in a call the bytes its syntax leaves no choice about and, once it is whole, the closing
        tag; none in free text or after a call."""
        where, call, _ = state
        if where == FIRST:
            return [self.open_id, *self._forced(self.syntax.start)]
        return self._forced(call) if where == CALL else []
