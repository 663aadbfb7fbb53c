"""The conversation as data: messages with their per-token origins, saved to and loaded from JSON.

A file holds the format tag, the session's settings and the messages. An assistant message keeps the ids
the engine committed, the text each token made printable and each token's origin, so a loaded chat shows
the same colours without a tokenizer round trip.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specchat.errors import SpecchatError

FORMAT = "specchat-chat/1"
ROLES = ("user", "assistant")


@dataclass
class Message:
    role: str  # "user" | "assistant"
    text: str = ""  # what is shown; for an answer, the concatenation of `pieces`
    token_ids: list[int] = field(default_factory=list)  # answer: the committed ids, in order
    pieces: list[str] = field(default_factory=list)  # answer: the text each token made printable (may be "")
    origins: list[str] = field(default_factory=list)  # answer: per token, "target" or the drafter kind
    finish: str | None = None  # answer: eos | stop | length | stopped (Esc) | error; None while streaming
    stats: dict[str, float] = field(default_factory=dict)  # answer: its figures (tokens/s, tau, ...)

    def extend(self, token_ids: list[int], origins: list[str], pieces: list[str]) -> None:
        self.token_ids += token_ids
        self.origins += origins
        self.pieces += pieces
        self.text += "".join(pieces)


def save_chat(path: Path, messages: list[Message], settings: dict) -> None:
    data = {"format": FORMAT, "settings": settings, "messages": [asdict(m) for m in messages]}
    try:
        path.write_text(json.dumps(data, ensure_ascii=False, indent=1))
    except OSError as error:
        raise SpecchatError(f"could not save to {path}: {error.strerror or error}") from None


def load_chat(path: Path) -> tuple[list[Message], dict]:
    """Messages and settings from a file written by `save_chat`; anything else is a one-line error."""
    try:
        data = json.loads(path.read_text())
    except OSError as error:
        raise SpecchatError(f"could not read {path}: {error.strerror or error}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise SpecchatError(f"{path} is not JSON: {error}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SpecchatError(f'{path} is not a saved specchat chat (no "format": "{FORMAT}")')
    if not isinstance(data.get("settings"), dict) or not isinstance(data.get("messages"), list):
        raise SpecchatError(f'{path}: a saved chat needs "settings" (object) and "messages" (list)')
    return [_message(item, i) for i, item in enumerate(data["messages"])], data["settings"]


def _message(item, index: int) -> Message:
    where = f"message {index + 1}"
    if not isinstance(item, dict) or set(item) - {f for f in Message.__dataclass_fields__}:
        raise SpecchatError(f"{where} is not a message object")
    try:
        message = Message(**item)
    except TypeError as error:
        raise SpecchatError(f"{where}: {error}") from None
    if message.role not in ROLES or not isinstance(message.text, str):
        raise SpecchatError(f"{where}: role must be one of {', '.join(ROLES)} and text a string")
    lengths = {len(message.token_ids), len(message.pieces), len(message.origins)}
    if len(lengths) != 1:
        raise SpecchatError(f"{where}: token_ids, pieces and origins must have one entry per token")
    if "".join(message.pieces) != message.text and message.pieces:
        raise SpecchatError(f"{where}: its pieces do not add up to its text")
    return message
