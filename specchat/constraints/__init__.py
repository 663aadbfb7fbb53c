"""Syntaxes a generated text can be held to (the engine's `Constraint`): JSON mode."""

from specchat.constraints.json_object import JsonObject

__all__ = ["JsonObject"]
