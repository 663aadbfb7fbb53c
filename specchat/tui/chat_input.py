"""The message line: Enter (or Ctrl+J) sends, up/down walk through what was sent before (like a shell)."""

from __future__ import annotations

from typing import ClassVar

from textual.binding import Binding
from textual.widgets import Input


class ChatInput(Input):
    BINDINGS: ClassVar[list[Binding]] = [
        Binding("up", "history(-1)", "previous", show=False),
        Binding("down", "history(1)", "next", show=False),
        # Ctrl+J sends, as in readline; it is also what an Enter typed before the app started arrives as (the
        # terminal was still turning carriage returns into line feeds)
        Binding("ctrl+j", "submit", "send", show=False),
    ]

    def __init__(self, **kwargs):
        super().__init__(placeholder="Message, or /help", select_on_focus=False, **kwargs)
        self.history: list[str] = []
        self._cursor = 0  # index into history; len(history) = the line being typed
        self._draft = ""  # what was being typed before walking the history

    def remember(self, line: str) -> None:
        if line and (not self.history or self.history[-1] != line):
            self.history.append(line)
        self._cursor, self._draft = len(self.history), ""

    def action_history(self, step: int) -> None:
        cursor = min(max(self._cursor + step, 0), len(self.history))
        if cursor == self._cursor:
            return
        if self._cursor == len(self.history):
            self._draft = self.value
        self._cursor = cursor
        self.value = self.history[cursor] if cursor < len(self.history) else self._draft
        self.cursor_position = len(self.value)
