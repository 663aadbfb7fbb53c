"""What an answer is held to, as a user asks for it (`--format json`, `--schema`, `--grammar`; a request's
`response_format`, `grammar` or `structured_outputs`): free text, one JSON object, one a JSON Schema allows, a text a
GBNF grammar derives, or one a regular expression matches."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specchat.errors import SpecchatError


@dataclass(frozen=True)
class AnswerFormat:
    json: bool = False  # one JSON object (JSON mode)
    schema: dict | None = None  # ... one this JSON Schema allows (JSON mode too)
    grammar: str | None = None  # a GBNF grammar's text
    regex: str | None = None  # a regular expression the whole answer matches

    @property
    def free(self) -> bool:
        return not self.json and self.schema is None and self.grammar is None and self.regex is None

    def constraint(self, engine):
        """The engine's `Constraint` for this format (kept by the engine with its masks); None for free text."""
        if self.grammar is not None:
            return engine.grammar_constraint(self.grammar)
        if self.regex is not None:
            return engine.grammar_constraint(self.regex, regex=True)
        return None if self.free else engine.json_constraint(self.schema)

    def label(self) -> str:
        """How a report names it ("" for free text)."""
        if self.grammar is not None:
            return "a GBNF grammar"
        if self.regex is not None:
            return "a regular expression"
        return "" if self.free else "JSON mode" + (" (a JSON Schema)" if self.schema is not None else "")


def read_grammar(text: str | None, path: Path | None, option: str = "--grammar-file") -> str:
    """The GBNF grammar given as `text` or in the file `path` (named by `option` in errors), checked."""
    from specchat.constraints import Grammar, GrammarError

    where = "--grammar"
    if path is not None:
        where = f"{option} {path}"
        try:
            text = path.read_text()
        except OSError as error:
            raise SpecchatError(f"{option}: cannot read {path}: {error.strerror}") from None
        except UnicodeDecodeError:
            raise SpecchatError(f"{option}: {path} is not UTF-8 text") from None
    try:
        Grammar.from_gbnf(text)
    except GrammarError as error:
        raise SpecchatError(f"{where}: {error}") from None
    return text


def read_schema(path: Path, option: str = "--schema") -> dict:
    """The JSON Schema in `path` (named by `option` in errors), checked against the subset JSON mode holds a text
    to."""
    from specchat.constraints.json_schema import JsonSchema, SchemaError

    try:
        schema = json.loads(path.read_text())
    except OSError as error:
        raise SpecchatError(f"{option}: cannot read {path}: {error.strerror}") from None
    except ValueError as error:
        raise SpecchatError(f"{option}: {path} is not JSON: {error}") from None
    try:
        JsonSchema(schema)
    except SchemaError as error:
        raise SpecchatError(f"{option} {path}: {error}") from None
    return schema


def read_format(path: Path, option: str) -> AnswerFormat:
    """The format a file holds answers to: a JSON Schema (a `.json` file) or a GBNF grammar (any other)."""
    if path.suffix == ".json":
        return AnswerFormat(json=True, schema=read_schema(path, option))
    return AnswerFormat(grammar=read_grammar(None, path, option))
