"""Syntaxes a generated text can be held to (the engine's `Constraint`): JSON mode, plain or under a JSON Schema;
a GBNF grammar; an answer that may call tools."""

from specchat.constraints.grammar import Grammar
from specchat.constraints.json_schema import JsonSchema, SchemaError
from specchat.constraints.rules import GrammarError
from specchat.constraints.syntax_text import SyntaxText
from specchat.constraints.token_masks import Vocabulary, vocabulary_bytes
from specchat.constraints.tool_call_text import ToolCallText

__all__ = ["Grammar", "GrammarError", "JsonSchema", "SchemaError", "SyntaxText", "ToolCallText", "Vocabulary",
           "vocabulary_bytes"]
