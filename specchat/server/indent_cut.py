"""Where an editor's completion ends by its indentation (llama-server's `n_indent`): at the first line after the
first that is indented less than the cursor's column, which belongs to the code around the completion, not to it.
"""

from __future__ import annotations


class IndentCut:
    """Fed an answer's text piece by piece, keeps what comes before the first content of a later line indented by
    fewer than `indent` spaces or tabs (the line's own indentation stays, as llama-server keeps it)."""

    def __init__(self, indent: int):
        self.indent = indent
        self.column: int | None = None  # the current line's indentation so far; None: the first line, or content seen

    def feed(self, text: str) -> tuple[str, bool]:
        """The part of `text` the answer keeps, and whether the answer ends there."""
        for at, char in enumerate(text):
            if char == "\n":
                self.column = 0
            elif self.column is not None:
                if char in " \t":
                    self.column += 1
                elif self.column < self.indent:
                    return text[:at], True
                else:
                    self.column = None
        return text, False
