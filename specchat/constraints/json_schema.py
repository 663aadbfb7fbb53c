"""A JSON Schema as a byte automaton: JSON's syntax (json_syntax.py) narrowed to the values a schema allows.

The subset structured-output clients send (OpenAI's strict schemas, Pydantic's models): `type` object (its
`properties` written in their order, each one in `required` present, the others optional, no other property),
array (`items`), string, integer, number, boolean, null, or a list of them; `enum` and `const`; `anyOf` / `oneOf`
of schemas whose values begin differently (Pydantic's `Optional[X]`: X or null), so that a value's first byte
picks its schema; `$ref` into `$defs` / `definitions`. Annotations (`title`, `description`, `default`,
`format`, ...) are ignored; any other keyword is refused by name (`SchemaError`), since the text could not be
held to it. A state is a hashable tuple as in
json_syntax: (mode, frames of open containers, whitespace bytes in a row, extra).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from specchat.constraints.json_syntax import (
    AFTER, COLON, DIGITS, DONE, ESCAPE, ESCAPES, FIRST_ITEM, FIRST_KEY, HEX, INTEGER, KEY, LITERAL, MAX_WHITESPACE,
    MINUS, NUMBER_ENDS, NUMBER_MODES, STRING, UNICODE, VALUE, WHITESPACE, ZERO, number_mode,
)  # fmt: skip

ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$schema", "$id", "$comment", "$defs",
                         "definitions", "strict", "deprecated", "readOnly", "writeOnly", "format"})  # fmt: skip
KEYWORDS = {
    "object": {"type", "properties", "required", "additionalProperties"},
    "array": {"type", "items"},
    "string": {"type"}, "integer": {"type"}, "number": {"type"}, "boolean": {"type"}, "null": {"type"},
}  # fmt: skip
# Modes are json_syntax's (TOP aside: a schema's text begins in VALUE); in a number `extra` says integers only, in
# UNICODE the hex digits read, in LITERAL the candidates (see `_literal`).


class SchemaError(ValueError):
    """A schema outside the subset, with the keyword or place at fault."""


@dataclass(frozen=True)
class Node:
    """One schema of the compiled tree: `kind` is a JSON type or "enum" (its `literals` as JSON bytes)."""

    kind: str
    properties: tuple[tuple[bytes, int, bool], ...] = ()  # object: (the name as a JSON string, node, required)
    items: int = -1  # array: the items' node
    literals: tuple[bytes, ...] = ()  # enum
    alternatives: tuple[int, ...] = ()  # any: the nodes of anyOf / oneOf / a list of types


class JsonSchema:
    """The automaton of one schema; `feed`, `complete` and `in_string` as json_syntax's."""

    def __init__(self, schema: object):
        self.nodes: list[Node] = []
        self._refs: dict[str, int] = {}
        self._root = schema
        root = self._compile(schema, "schema")
        for node in self.nodes:  # every reference resolved: each value's first byte must pick one alternative
            starts = [self._first_bytes(alternative, set()) for alternative in node.alternatives]
            if any(a & b for i, a in enumerate(starts) for b in starts[i + 1 :]):
                raise SchemaError("anyOf: two alternatives' values can begin alike (a value's first byte must pick one)")
        self.start = (VALUE, (), 0, root)

    # -- compiling ---------------------------------------------------------------------------------------------

    def _compile(self, schema: object, where: str) -> int:
        if not isinstance(schema, dict):
            raise SchemaError(f"{where} must be a JSON object")
        if "$ref" in schema:
            return self._reference(schema["$ref"], where)
        either = next((keyword for keyword in ("anyOf", "oneOf") if keyword in schema), None)
        if either is not None:
            self._check(schema, {either}, where)
            if not isinstance(schema[either], list) or not schema[either]:
                raise SchemaError(f"{where}: {either} must be a non-empty list")
            alternatives = [self._compile(each, f"{where}.{either}[{i}]") for i, each in enumerate(schema[either])]
            return self._add(Node("any", alternatives=tuple(alternatives)))
        if isinstance(schema.get("type"), list) and schema["type"]:
            kinds = schema["type"]
            self._check(schema, set().union(*(KEYWORDS.get(kind, set()) for kind in kinds)), where)
            alternatives = [self._compile({key: value for key, value in schema.items()
                                           if key in KEYWORDS.get(kind, ()) or key in ANNOTATIONS} | {"type": kind},
                                          where) for kind in kinds]  # fmt: skip
            return self._add(Node("any", alternatives=tuple(alternatives)))
        if "const" in schema or "enum" in schema:
            values = [schema["const"]] if "const" in schema else schema["enum"]
            if not isinstance(values, list) or not values:
                raise SchemaError(f"{where}: enum must be a non-empty list")
            self._check(schema, {"type", "enum", "const"}, where)
            literals = tuple(dict.fromkeys(json.dumps(value, ensure_ascii=False).encode() for value in values))
            return self._add(Node("enum", literals=literals))
        kind = schema.get("type")
        if not isinstance(kind, str) or kind not in KEYWORDS:
            other = sorted(set(schema) - ANNOTATIONS - {"type"})
            if "type" not in schema and other:
                raise SchemaError(f"{where}: {other[0]!r} is not supported")
            raise SchemaError(f"{where}: type {kind!r} is not supported; one of {', '.join(KEYWORDS)}")
        self._check(schema, KEYWORDS[kind], where)
        if kind in ("boolean", "null"):
            return self._add(Node("enum", literals=(b"true", b"false") if kind == "boolean" else (b"null",)))
        if kind == "array":
            if "items" not in schema:
                raise SchemaError(f"{where}: an array needs items")
            index = self._add(Node("array"))
            self.nodes[index] = Node("array", items=self._compile(schema["items"], f"{where}.items"))
            return index
        if kind != "object":
            return self._add(Node(kind))
        if schema.get("additionalProperties", False) not in (False, None):
            raise SchemaError(f"{where}: additionalProperties must be false (only the listed properties are written)")
        properties = schema.get("properties", {})
        required = schema.get("required", [])
        if not isinstance(properties, dict) or not isinstance(required, list):
            raise SchemaError(f"{where}: properties must be an object and required a list")
        unknown = sorted(set(required) - set(properties))
        if unknown:
            raise SchemaError(f"{where}: required names {unknown[0]!r}, which is not among its properties")
        index = self._add(Node("object"))
        compiled = tuple((json.dumps(name, ensure_ascii=False).encode(),
                          self._compile(value, f"{where}.properties.{name}"), name in required)
                         for name, value in properties.items())  # fmt: skip
        self.nodes[index] = Node("object", properties=compiled)
        return index

    def _reference(self, ref: object, where: str) -> int:
        if ref in self._refs:
            return self._refs[ref]
        prefix = next((p for p in ("#/$defs/", "#/definitions/") if isinstance(ref, str) and ref.startswith(p)), None)
        table = self._root.get(prefix[2:-1], {}) if prefix and isinstance(self._root, dict) else {}
        if prefix is None or ref[len(prefix) :] not in table:
            raise SchemaError(f"{where}: $ref {ref!r} is not a definition of the schema ($defs or definitions)")
        # resolved once: a recursive definition refers to the node being compiled
        self._refs[ref] = len(self.nodes)
        self.nodes.append(Node("null"))
        compiled = self._compile(table[ref[len(prefix) :]], ref)
        self.nodes[self._refs[ref]] = self.nodes[compiled]
        return self._refs[ref]

    def _first_bytes(self, index: int, seen: set[int]) -> set[int]:
        """The bytes a value of node `index` may begin with."""
        node = self.nodes[index]
        if node.kind == "any":
            seen = seen | {index}
            return set().union(*(self._first_bytes(each, seen) for each in node.alternatives if each not in seen))
        if node.kind == "enum":
            return {literal[0] for literal in node.literals}
        firsts = {"object": b"{", "array": b"[", "string": b'"', "integer": b"-0123456789", "number": b"-0123456789"}
        return set(firsts[node.kind])

    def _check(self, schema: dict, allowed: set[str], where: str) -> None:
        unknown = sorted(set(schema) - allowed - ANNOTATIONS)
        if unknown:
            raise SchemaError(f"{where}: {unknown[0]!r} is not supported here")

    def _add(self, node: Node) -> int:
        self.nodes.append(node)
        return len(self.nodes) - 1

    # -- the automaton -------------------------------------------------------------------------------------------

    def complete(self, state) -> bool:
        return state[0] == DONE

    def in_string(self, state) -> bool:
        return state[0] == STRING

    def feed(self, state, byte: int):
        mode, frames, spaces, extra = state
        if mode == STRING:
            if byte == 0x22:
                return self._after_value(frames)
            if byte == 0x5C:
                return (ESCAPE, frames, 0, None)
            return state if byte >= 0x20 else None
        if mode == ESCAPE:
            if byte == ord("u"):
                return (UNICODE, frames, 0, 0)
            return (STRING, frames, 0, None) if byte in ESCAPES else None
        if mode == UNICODE:
            if byte not in HEX:
                return None
            return (STRING, frames, 0, None) if extra == 3 else (UNICODE, frames, 0, extra + 1)
        if mode == LITERAL:
            return self._literal(frames, extra, byte)
        if mode in NUMBER_MODES:
            after = number_mode(mode, byte, extra)
            if after is not None:
                return (after, frames, 0, extra)
            return self.feed(self._after_value(frames), byte) if mode in NUMBER_ENDS else None
        if byte in WHITESPACE:  # between tokens, once the value has begun (as json_syntax)
            begun = mode != DONE and (frames or mode != VALUE)
            return (mode, frames, spaces + 1, extra) if begun and spaces < MAX_WHITESPACE else None
        if mode == VALUE:
            return self._value(frames, extra, byte)
        if mode == FIRST_ITEM:
            if byte == ord("]"):
                return self._after_value(frames[:-1])
            return self._value(frames, self.nodes[frames[-1][1]].items, byte)
        if mode in (FIRST_KEY, KEY):
            _, node, index = frames[-1]
            if byte == ord("}") and mode == FIRST_KEY and self._may_close(node, index):
                return self._after_value(frames[:-1])
            keys = self._next_keys(node, index)
            return self._literal(frames, (keys, 0, True), byte) if keys else None
        if mode == COLON:
            return (VALUE, frames, 0, extra) if byte == ord(":") else None
        if mode == AFTER:
            kind, node, index = frames[-1]
            if kind == "[":
                if byte == ord(","):
                    return (VALUE, frames, 0, self.nodes[node].items)
                return self._after_value(frames[:-1]) if byte == ord("]") else None
            if byte == ord(","):
                return (KEY, frames, 0, None) if self._next_keys(node, index) else None
            return self._after_value(frames[:-1]) if byte == ord("}") and self._may_close(node, index) else None
        return None  # DONE

    def _value(self, frames: tuple, node_index: int, byte: int):
        """The state after the first byte of a value of node `node_index`."""
        node = self.nodes[node_index]
        if node.kind == "any":  # the alternatives begin differently: at most one takes the byte
            return next((s for s in (self._value(frames, each, byte) for each in node.alternatives) if s), None)
        if node.kind == "enum":
            return self._literal(frames, (tuple((literal, -1) for literal in node.literals), 0, False), byte)
        if node.kind == "string":
            return (STRING, frames, 0, None) if byte == 0x22 else None
        if node.kind == "object":
            return (FIRST_KEY, (*frames, ("{", node_index, 0)), 0, None) if byte == ord("{") else None
        if node.kind == "array":
            return (FIRST_ITEM, (*frames, ("[", node_index, 0)), 0, None) if byte == ord("[") else None
        integers = node.kind == "integer"
        if byte == ord("-"):
            return (MINUS, frames, 0, integers)
        if byte in DIGITS:
            return (ZERO if byte == ord("0") else INTEGER, frames, 0, integers)
        return None

    def _literal(self, frames: tuple, extra: tuple, byte: int):
        """A byte of one of several literals (an enum's values, or an object's next keys): `extra` holds the
        candidates (bytes, the property a key stands for), the bytes matched and whether they are keys."""
        candidates, matched, keys = extra
        going = tuple(c for c in candidates if len(c[0]) > matched and c[0][matched] == byte)
        if going:
            ended = [c for c in going if len(c[0]) == matched + 1]
            if ended and len(going) == 1:  # the literal is whole, and nothing longer could go on
                return self._after_literal(frames, ended[0], keys)
            return (LITERAL, frames, 0, (going, matched + 1, keys))
        whole = [c for c in candidates if len(c[0]) == matched]
        if whole:  # a shorter literal ended (an enum of 1 and 10): the byte follows it
            after = self._after_literal(frames, whole[0], keys)
            return self.feed(after, byte)
        return None

    def _after_literal(self, frames: tuple, candidate: tuple, keys: bool):
        if not keys:
            return self._after_value(frames)
        _, node, _ = frames[-1]
        index = candidate[1]
        return (COLON, (*frames[:-1], ("{", node, index + 1)), 0, self.nodes[node].properties[index][1])

    def _next_keys(self, node: int, index: int) -> tuple:
        """The properties that may come next from property `index` on: up to the first required one."""
        keys = []
        for i, (name, _, required) in enumerate(self.nodes[node].properties[index:], start=index):
            keys.append((name, i))
            if required:
                break
        return tuple(keys)

    def _may_close(self, node: int, index: int) -> bool:
        return not any(required for _, _, required in self.nodes[node].properties[index:])

    def _after_value(self, frames: tuple):
        return (AFTER, frames, 0, None) if frames else (DONE, (), 0, None)
