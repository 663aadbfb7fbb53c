"""Slash commands: their names, help and argument parsing. Parsing is pure; the app carries them out.

Every problem (unknown command, missing or bad value) is a `SpecchatError` whose one line the app shows
inline, so a typo never reaches the engine.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specchat.answer_format import AnswerFormat, read_format
from specchat.drafters import NAMES, parse_drafter
from specchat.engine.budget import MAX_BUDGET
from specchat.errors import SpecchatError


@dataclass(frozen=True)
class Command:
    name: str
    value: object  # the parsed argument (None when there is none)


@dataclass(frozen=True)
class CommandSpec:
    name: str
    usage: str  # how it is typed, e.g. "/temp X"
    help: str
    parse: Callable[[str], object]  # raw argument text -> value, or SpecchatError
    needs_idle: bool = False  # replaces the conversation: refused while an answer streams

    @property
    def takes_argument(self) -> bool:
        return " " in self.usage


def _none(name: str) -> Callable[[str], None]:
    def parse(text: str) -> None:
        if text:
            raise SpecchatError(f"/{name} takes no argument")

    return parse


def _temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise SpecchatError(f"/temp takes a number >= 0 (0 = greedy), not '{text}'") from None
    if not math.isfinite(value) or value < 0:
        raise SpecchatError(f"/temp takes a number >= 0 (0 = greedy), not '{text}'")
    return value


def _drafter(text: str) -> str:
    parse_drafter(text, "/drafter")
    return text


def _budget(text: str) -> int | None:
    if text == "auto":
        return None
    if not text.isdigit() or not 1 <= int(text) <= MAX_BUDGET:
        raise SpecchatError(f"/budget takes 1..{MAX_BUDGET} or auto, not '{text}'")
    return int(text)


def _format(text: str) -> AnswerFormat:
    if text in ("text", "json"):
        return AnswerFormat(json=text == "json")
    if not text:
        raise SpecchatError("/format takes text, json or a file: a JSON Schema (.json) or a GBNF grammar")
    return read_format(Path(text).expanduser(), "/format")


def _stop(text: str) -> tuple[str, ...]:
    try:
        strings = tuple(shlex.split(text))
    except ValueError as error:
        raise SpecchatError(f"/stop: {error} (quote a stop string that holds spaces)") from None
    if any(not each for each in strings):
        raise SpecchatError("/stop takes non-empty strings")
    return strings


def _optional_path(text: str) -> Path | None:
    return Path(text).expanduser() if text else None


def _path(text: str) -> Path:
    if not text:
        raise SpecchatError("/load needs a file: /load FILE")
    return Path(text).expanduser()


COMMANDS = (
    CommandSpec("system", "/system [TEXT]", "set the system prompt (none: the model's default)", lambda t: t or None),
    CommandSpec("temp", "/temp X", "sampling temperature (0 = greedy)", _temperature),
    CommandSpec("drafter", "/drafter NAME[:DIR]", f"the drafter: {' | '.join(NAMES)}", _drafter),
    CommandSpec("budget", "/budget N|auto", "most draft-tree nodes per step (auto: chosen per step)", _budget),
    CommandSpec("format", "/format text|json|FILE", "hold answers to JSON, a JSON Schema (FILE.json) or a GBNF "
                "grammar (FILE)", _format),
    CommandSpec("stop", '/stop [TEXT "TEXT 2" ...]', "end answers before these strings (none: at the end of the "
                "turn only)", _stop),
    CommandSpec("retry", "/retry", "answer the last message again (sampled: another answer)", _none("retry"),
                needs_idle=True),
    CommandSpec("clear", "/clear", "start a new conversation", _none("clear"), needs_idle=True),
    CommandSpec(
        "save", "/save [FILE]", "save messages, settings and token origins as JSON", _optional_path, needs_idle=True
    ),
    CommandSpec("load", "/load FILE", "load a saved chat", _path, needs_idle=True),
    CommandSpec("stats", "/stats", "the last answer's figures", _none("stats")),
    CommandSpec("help", "/help", "list the commands and keys", _none("help")),
    CommandSpec("quit", "/quit", "leave (Ctrl+Q too)", _none("quit")),
)
BY_NAME = {spec.name: spec for spec in COMMANDS}


def parse_command(line: str) -> Command:
    """'/temp 0.7' -> Command('temp', 0.7)."""
    name, _, argument = line.strip().removeprefix("/").partition(" ")
    spec = BY_NAME.get(name)
    if spec is None:
        raise SpecchatError(f"unknown command '/{name}'; /help lists them")
    return Command(name, spec.parse(argument.strip()))
