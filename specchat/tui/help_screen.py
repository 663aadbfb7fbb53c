"""F1 and /help: what each overlay number means, the commands and the keys."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from specchat.tui.colours import legend
from specchat.tui.commands import COMMANDS
from specchat.tui.figures import EXPLANATIONS

KEYS = {
    "Enter": "send the message or command",
    "Shift+Enter, \\ Enter": "a new line in the message (Shift+Enter where the terminal reports it); pasted text "
    "keeps its lines",
    "Esc": "stop the answer (keeps what was written); when idle, leave the input to scroll (typing returns)",
    "Up / Down": "earlier messages (on the input's first / last line)",
    "F1": "this help",
    "F2": "show or hide the acceptance overlay",
    "Ctrl+T": "colours / plain Markdown",
    "Ctrl+P": "command palette",
    "Ctrl+Q": "quit",
}


def help_text() -> Text:
    text = Text()
    text.append("The overlay\n", "bold underline")
    for name, meaning in EXPLANATIONS.items():
        text.append(f"{name}: ", "bold").append(f"{meaning}\n")
    text.append("\n").append(legend()).append("\n\n")
    width = max(len(name) for name in (*(spec.usage for spec in COMMANDS), *KEYS)) + 2  # a gap after the longest
    text.append("Commands\n", "bold underline")
    for spec in COMMANDS:
        text.append(f"{spec.usage:<{width}}", "bold").append(f"{spec.help}\n")
    text.append("\nKeys\n", "bold underline")
    for key, meaning in KEYS.items():
        text.append(f"{key:<{width}}", "bold").append(f"{meaning}\n")
    return text


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[Binding]] = [Binding("escape,q,f1", "dismiss", "close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static(help_text())

    def on_mount(self) -> None:
        self.query_one("#help").border_title = "help (Esc closes)"
