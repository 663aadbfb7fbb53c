"""One message of the conversation: the user's text, or an answer coloured token by token by origin.

An answer's body grows incrementally (only the tokens added since the last refresh are appended), so a
long answer costs little per update. In plain mode a finished answer is rendered as Markdown instead. A
header names the speaker; under a finished answer, a dim line gives its figures.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.markdown import Markdown
from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from specchat.tui.colours import coloured
from specchat.tui.transcript import Message

FINISH_NOTES = {"eos": "", "stop": "stop string", "length": "token limit", "context": "the context is full",
                "stopped": "stopped (Esc)", "loaded": ""}  # fmt: skip


class MessageView(Static):
    plain = reactive(False)  # Markdown instead of colours

    def __init__(self, message: Message, *, speaker: str):
        super().__init__(classes=message.role)
        self.message = message
        self.speaker = speaker
        self.body = Text()  # the answer so far, coloured by origin
        self._shown = 0  # tokens already appended to `body`

    def on_mount(self) -> None:
        self.refresh_message()

    def watch_plain(self) -> None:
        if self.is_mounted:
            self.refresh_message()

    def refresh_message(self) -> None:
        """Show what `message` holds now (new tokens, its finish, its figures)."""
        message = self.message
        header = Text(self.speaker, style="bold")
        if message.role == "user":
            self.update(Text.assemble(header, "\n", message.text))
            return
        coloured(message.pieces[self._shown :], message.origins[self._shown :], self.body)
        self._shown = len(message.pieces)
        footer = Text(footer_line(message), style="dim italic")
        if message.pieces:
            body: RenderableType = self.body
        else:  # nothing streamed yet, or a loaded answer without per-token data
            body = Text(message.text) if message.text else Text("…", style="dim")
        if self.plain and message.finish is not None:
            body = Markdown(message.text)
        self.update(Group(header, body, footer) if footer else Group(header, body))
        self.set_class(message.finish is None, "streaming")


def footer_line(message: Message) -> str:
    if message.finish is None:
        return "answering… (Esc stops)"
    stats = message.stats
    parts = [FINISH_NOTES.get(message.finish, message.finish)]
    if "tokens" in stats:
        parts.append(f"{stats['tokens']} tok · {stats['tokens_per_second']:.1f} tok/s · τ {stats['tau']:.2f}")
    if "speedup" in stats:
        parts.append(f"{stats['speedup']:.2f}x AR")
    return " · ".join(part for part in parts if part)
