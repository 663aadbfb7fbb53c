"""Token ids -> streamed text, with stop strings, at a cost per step that does not grow with the output."""

from __future__ import annotations


class TextStream:
    """Incremental detokenizer that holds back text which may still become a stop string.

    Only the tokens since the previous read offset are decoded again, with the tokens of the step before
    (the `window`): comparing with the decode of that overlap keeps word-boundary spaces (SentencePiece)
    right, and a trailing U+FFFD means a multi-byte character is still incomplete, so its text waits for the
    next token. Text already handed out is not kept, so a 100K-token book streams in flat time per token.
    """

    def __init__(self, tokenizer, stop: tuple[str, ...] = (), *, window: list[int] | None = None, read: int = 0,
                 unmatched: int = 0):  # fmt: skip
        """`unmatched`: tokens added before stop strings are looked for (vLLM's `min_tokens`)."""
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.unmatched = unmatched
        self.window: list[int] = list(window or [])  # ids from the prefix offset on
        self.read = read  # window[:read] is text already
        self.pending = ""  # decoded text not handed out yet: a possible start of a stop string
        self.stopped = False

    def add(self, ids: list[int]) -> str:
        """Append tokens; return the text that is now safe to show (nothing once a stop string is found)."""
        if self.stopped:
            return ""
        self.window.extend(ids)
        self.unmatched -= len(ids)
        decode = self.tokenizer.decode
        before = decode(self.window[: self.read], skip_special_tokens=True)
        after = decode(self.window, skip_special_tokens=True)
        if after.endswith("\ufffd"):
            return ""
        self.pending += after[len(before) :]
        self.window = self.window[self.read :]
        self.read = len(self.window)
        found = [i for i in (self.pending.find(s) for s in self.stop) if i >= 0] if self.unmatched <= 0 else []
        if found:
            self.pending, self.stopped = self.pending[: min(found)], True
        holdback = 0 if self.stopped else max((len(s) - 1 for s in self.stop), default=0)
        return self._take(len(self.pending) - holdback)

    def flush(self) -> str:
        """The text held back for stop strings, once generation has ended."""
        return self._take(len(self.pending))

    def state(self) -> dict:
        """What a stream without stop strings needs to go on in another process (`TextStream(tok, **state)`)."""
        return {"window": list(self.window), "read": self.read}

    def _take(self, upto: int) -> str:
        upto = max(upto, 0)
        chunk, self.pending = self.pending[:upto], self.pending[upto:]
        return chunk
