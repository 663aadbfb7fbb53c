"""Syntaxes a generated text can be held to (the engine's `Constraint`): JSON mode, plain or under a JSON Schema;
an answer that may call tools."""

from specchat.constraints.json_object import JsonText
from specchat.constraints.json_schema import JsonSchema, SchemaError
from specchat.constraints.token_masks import Vocabulary, vocabulary_bytes
from specchat.constraints.tool_call_text import ToolCallText

__all__ = ["JsonSchema", "JsonText", "SchemaError", "ToolCallText", "Vocabulary", "vocabulary_bytes"]
