"""The message box: Enter (or Ctrl+J) sends; Shift+Enter, or a backslash before Enter, starts a new line; pasted
text keeps its lines (code is what a coder model is asked about); up on the first line and down on the last walk
through what was sent before (like a shell)."""

from __future__ import annotations

from typing import ClassVar

from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widgets import TextArea

# Shift+Enter reaches the app where the terminal reports it (the kitty keyboard protocol: kitty, WezTerm, foot,
# Ghostty, iTerm2); elsewhere it arrives as Enter, and a backslash before Enter is the way every terminal has.
NEW_LINE_KEYS = ("shift+enter", "alt+enter")


class ChatInput(TextArea):
    BINDINGS: ClassVar[list[Binding]] = [
        Binding("up", "history_or_up(-1)", "previous", show=False),
        Binding("down", "history_or_up(1)", "next", show=False),
        # Ctrl+J sends, as in readline; it is also what an Enter typed before the app started arrives as (the
        # terminal was still turning carriage returns into line feeds)
        Binding("ctrl+j", "submit", "send", show=False),
    ]

    class Submitted(Message):
        """The message box's text, sent by Enter."""

        def __init__(self, value: str) -> None:
            super().__init__()
            self.value = value

    def __init__(self, **kwargs):
        super().__init__(placeholder="Message, or /help   (Shift+Enter or \\ then Enter: a new line)",
                         soft_wrap=True, highlight_cursor_line=False, **kwargs)  # fmt: skip
        self.sent: list[str] = []
        self._cursor = 0  # index into history; len(history) = the text being typed
        self._draft = ""  # what was being typed before walking the history

    @property
    def value(self) -> str:
        return self.text

    @value.setter
    def value(self, text: str) -> None:
        """Replace the text, the cursor after it."""
        self.load_text(text)
        self.move_cursor(self.document.end)

    async def _on_key(self, event: events.Key) -> None:
        if event.key not in ("enter", *NEW_LINE_KEYS):
            return await super()._on_key(event)
        event.stop()
        event.prevent_default()
        row, column = self.cursor_location
        if event.key in NEW_LINE_KEYS:
            self.insert("\n")
        elif self.selection.is_empty and column > 0 and self.document[row][column - 1] == "\\":
            self.replace("\n", (row, column - 1), (row, column))  # the backslash becomes the line break
        else:
            await self.action_submit()

    async def action_submit(self) -> None:
        self.post_message(self.Submitted(self.text))

    def remember(self, line: str) -> None:
        if line and (not self.sent or self.sent[-1] != line):
            self.sent.append(line)
        self._cursor, self._draft = len(self.sent), ""

    def action_history_or_up(self, step: int) -> None:
        """Up on the first line (down on the last) walks the history; elsewhere the cursor moves a line."""
        row = self.cursor_location[0]
        if (step < 0 and row > 0) or (step > 0 and row < self.document.line_count - 1):
            return self.action_cursor_up() if step < 0 else self.action_cursor_down()
        cursor = min(max(self._cursor + step, 0), len(self.sent))
        if cursor == self._cursor:
            return None
        if self._cursor == len(self.sent):
            self._draft = self.text
        self._cursor = cursor
        self.value = self.sent[cursor] if cursor < len(self.sent) else self._draft
        return None
