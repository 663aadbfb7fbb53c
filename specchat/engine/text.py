"""Token ids -> streamed text, with stop strings, in time linear in the output length."""

from __future__ import annotations


class TextStream:
    """Incremental detokenizer that holds back text which may still become a stop string.

    Decoding only the tokens since the previous read offset keeps each step O(new tokens); comparing with
    the decode of the overlap keeps word-boundary spaces (SentencePiece) right, and a trailing U+FFFD means
    a multi-byte character is still incomplete, so its text waits for the next token.
    """

    def __init__(self, tokenizer, stop: tuple[str, ...] = ()):
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.text = ""  # all text decoded so far (stop string excluded once found)
        self.emitted = 0  # characters of `text` already handed out
        self.stopped = False

    def add(self, ids: list[int]) -> str:
        """Append tokens; return the text that is now safe to show (nothing once a stop string is found)."""
        if self.stopped:
            return ""
        self.ids.extend(ids)
        decode = self.tokenizer.decode
        before = decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=True)
        after = decode(self.ids[self.prefix_offset :], skip_special_tokens=True)
        if after.endswith("\ufffd"):
            return ""
        searched_from = max(0, len(self.text) - max((len(s) for s in self.stop), default=0))
        self.text += after[len(before) :]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        found = [i for i in (self.text.find(s, searched_from) for s in self.stop) if i >= 0]
        if found:
            self.text, self.stopped = self.text[: min(found)], True
        holdback = 0 if self.stopped else max((len(s) - 1 for s in self.stop), default=0)
        return self._take(len(self.text) - holdback)

    def flush(self) -> str:
        """The text held back for stop strings, once generation has ended."""
        return self._take(len(self.text))

    def _take(self, upto: int) -> str:
        upto = max(upto, self.emitted)
        chunk, self.emitted = self.text[self.emitted : upto], upto
        return chunk
