"""What an answer is held to, as a user asks for it (`--format json`, `--schema`, `--grammar`; a request's
`response_format`, `grammar` or `structured_outputs`): free text, one JSON object, one a JSON Schema allows, a text a
GBNF grammar derives, or one a regular expression matches."""

from __future__ import annotations

from dataclasses import dataclass


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
