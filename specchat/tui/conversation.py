"""The scrolling conversation: message views and inline notes, kept anchored to the newest line."""

from __future__ import annotations

from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from specchat.tui.message_view import MessageView
from specchat.tui.transcript import Message


class Note(Static):
    """A line from the app itself: command results, errors, loading progress."""


class Conversation(VerticalScroll, can_focus=True):
    def on_mount(self) -> None:
        self.anchor()

    def add_message(self, message: Message, *, speaker: str, plain: bool = False) -> MessageView:
        view = MessageView(message, speaker=speaker)
        view.plain = plain
        self.mount(view)
        return view

    def add_note(self, text: str | Text, *, error: bool = False) -> Note:
        note = Note(text, classes="error" if error else "")
        self.mount(note)
        return note

    def set_plain(self, plain: bool) -> None:
        for view in self.query(MessageView):
            view.plain = plain

    def clear(self) -> None:
        self.remove_children()
