"""Syntaxes a generated text can be held to (the engine's `Constraint`): JSON mode, plain or under a JSON Schema."""

from specchat.constraints.json_object import JsonText
from specchat.constraints.json_schema import JsonSchema, SchemaError
from specchat.constraints.token_masks import Vocabulary, vocabulary_bytes

__all__ = ["JsonSchema", "JsonText", "SchemaError", "Vocabulary", "vocabulary_bytes"]
