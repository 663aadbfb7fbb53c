"""The conversation as data: messages with their per-token origins, saved to and loaded from JSON.

A file holds the format tag, the session's settings and the messages. An assistant message keeps the ids
the engine committed, the text each token made printable and each token's origin, so a loaded chat shows
the same colours without a tokenizer round trip.
"""

from __future__ import annotations

import json
import os
import time
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


def default_chat_path() -> Path:
    """Where /save without a name writes: the user's data directory, one file per save."""
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "specchat" / "chats" / time.strftime("chat-%Y%m%d-%H%M%S.json")


def save_chat(path: Path, messages: list[Message], settings: dict) -> None:
    data = {"format": FORMAT, "settings": settings, "messages": [asdict(m) for m in messages]}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
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


FIELD_TYPES = {"role": str, "text": str, "token_ids": list, "pieces": list, "origins": list, "finish": str,
               "stats": dict}  # fmt: skip
ITEM_TYPES = {"token_ids": int, "pieces": str, "origins": str}


def _message(item, index: int) -> Message:
    """One message of a saved chat, its fields and their types checked; an answer without a finish is a
    finished one (a file written by hand or another tool)."""
    where = f"message {index + 1}"
    if not isinstance(item, dict):
        raise SpecchatError(f"{where} is not a message object")
    unknown = set(item) - set(FIELD_TYPES)
    if unknown:
        raise SpecchatError(f"{where}: unknown field {sorted(unknown)[0]!r}")
    for name, value in item.items():
        kind = FIELD_TYPES[name]
        if not isinstance(value, kind) and not (name == "finish" and value is None):
            raise SpecchatError(f"{where}: {name} must be a {_TYPE_NAMES[kind]}")
        if name in ITEM_TYPES and not all(json_is(each, ITEM_TYPES[name]) for each in value):
            raise SpecchatError(f"{where}: every entry of {name} must be a {_TYPE_NAMES[ITEM_TYPES[name]]}")
    if not all(isinstance(k, str) and json_is(v, float) for k, v in item.get("stats", {}).items()):
        raise SpecchatError(f"{where}: stats must map names to numbers")
    message = Message(**item)
    if message.role not in ROLES:
        raise SpecchatError(f"{where}: role must be one of {', '.join(ROLES)}")
    lengths = {len(message.token_ids), len(message.pieces), len(message.origins)}
    if len(lengths) != 1:
        raise SpecchatError(f"{where}: token_ids, pieces and origins must have one entry per token")
    if "".join(message.pieces) != message.text and message.pieces:
        raise SpecchatError(f"{where}: its pieces do not add up to its text")
    if message.role == "assistant" and message.finish is None:
        message.finish = "loaded"
    return message


_TYPE_NAMES = {str: "string", list: "list", dict: "object", int: "whole number", float: "number"}


def json_is(value, kind) -> bool:
    """JSON types: true / false are not numbers; a whole number is a number."""
    if isinstance(value, bool):
        return False
    return isinstance(value, (int, float)) if kind is float else isinstance(value, kind)
