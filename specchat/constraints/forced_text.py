"""What a byte automaton leaves no choice about, spelled in a model's ids: the draft the engine verifies where a
constraint forces the text (`Constraint.forced`).

The bytes come one at a time while exactly one byte may come and the text may not end there; the tokenizer
spells them as it spells any text, which is how a model trained on its tokenizations writes them. Only the ids
that spell a prefix of the bytes are kept, and the end (a closing tag) is added where the text is then whole and
nothing else may follow. Each state's ids are kept: a constraint meets the same states again and again.
"""

from __future__ import annotations

from specchat.constraints.token_masks import Vocabulary


def forced_bytes(syntax, state: tuple, limit: int = 256) -> tuple[bytes, tuple]:
    """The bytes `syntax` leaves no choice about from `state` (at most `limit`: one at a time while exactly one byte
    may come and the text may not end), and the state after them."""
    out = bytearray()
    while len(out) < limit and not syntax.complete(state):
        taken = [(byte, after) for byte in range(256) if (after := syntax.feed(state, byte)) is not None]
        if len(taken) != 1:
            break
        out.append(taken[0][0])
        state = taken[0][1]
    return bytes(out), state


class ForcedIds:
    """`syntax`'s forced text from a state as `vocabulary`'s ids (`encode`: text -> ids), then `end_id` (None: no
    end is forced) where the text is whole."""

    def __init__(self, vocabulary: Vocabulary, syntax, encode, end_id: int | None = None):
        self.vocabulary, self.syntax, self.encode, self.end_id = vocabulary, syntax, encode, end_id
        self._kept: dict[tuple, list[int]] = {}

    def __call__(self, state: tuple) -> list[int]:
        if state not in self._kept:
            data, after = forced_bytes(self.syntax, state)
            ids, spelled = [], b""
            for token in self.encode(data.decode("utf-8", errors="ignore")):
                piece = self.vocabulary.pieces[token] if token < self.vocabulary.size else None  # a model's own
                if not piece or not data.startswith(spelled + piece):
                    break
                ids.append(token)
                spelled += piece
            whole = spelled == data and self.syntax.complete(after)
            if self.end_id is not None and whole and all(self.syntax.feed(after, b) is None for b in range(256)):
                ids.append(self.end_id)
            self._kept[state] = ids
        return self._kept[state]
