"""A JSON Schema as a byte automaton: JSON's syntax (json_syntax.py) narrowed to the values a schema allows.

The subset structured-output clients send (OpenAI's strict schemas, Pydantic's models, tools' parameters):
`type` object (its `properties` written in their order, each one in `required` present, the others optional, no
other property; without `properties`, a map: any keys, values under `additionalProperties`), array (`items`;
without them any values), string, integer, number, boolean, null, or a list of them; `enum` and `const`; `anyOf` /
`oneOf` (held as anyOf: a value two alternatives allow is allowed); `$ref` into `$defs` / `definitions`; `{}`,
any JSON value. Annotations (`title`, `description`, `default`, `format`, ...) are ignored; any other keyword is
refused by name (`SchemaError`), since the text could not be held to it, unless the schema is `lenient` (a tool's
parameters when the tool is not strict): it is then ignored, and a schema that cannot be compiled allows any value.

A state is a hashable tuple as in json_syntax: (mode, frames of open containers, whitespace bytes in a row, extra).
Where alternatives of an anyOf begin alike (objects told apart by a later property, an integer or a number), the
state is their union (`UNION`, the members' states in `extra`) until the bytes leave one. Where one byte must come
(a separator's space in the canonical layout, a padded value's newlines) it is `EXPECT`ed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from specchat.constraints.json_syntax import (
    AFTER,
    COLON,
    DIGITS,
    DONE,
    FIRST_ITEM,
    FIRST_KEY,
    INTEGER,
    KEY,
    LITERAL,
    MAX_WHITESPACE,
    MINUS,
    NUMBER_ENDS,
    NUMBER_MODES,
    STRING,
    STRING_MODES,
    STRING_STEADY,
    VALUE,
    WHITESPACE,
    ZERO,
    number_mode,
    split_spaces,
    string_feed,
)  # fmt: skip

ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$schema", "$id", "$comment", "$defs",
                         "definitions", "strict", "deprecated", "readOnly", "writeOnly", "format"})  # fmt: skip
KEYWORDS = {
    "object": {"type", "properties", "required", "additionalProperties"},
    "array": {"type", "items"},
    "string": {"type"}, "integer": {"type"}, "number": {"type"}, "boolean": {"type"}, "null": {"type"},
}  # fmt: skip
UNION, EXPECT = 20, 21  # past json_syntax's modes; EXPECT: one byte must come (`extra`: it, then the state after it)
FREE_KEYS = frozenset({"map", "json"})  # objects whose keys are any strings
JSON_LITERALS = ((b"true", -1), (b"false", -1), (b"null", -1))
# Modes are json_syntax's (TOP aside: a schema's text begins in VALUE); in a string `extra` says it is a map's key, in
# a number that only integers may be written, in UNICODE the hex digits read (+ 4 in a key), in LITERAL the
# candidates (see `_literal`).


class SchemaError(ValueError):
    """A schema outside the subset, with the keyword or place at fault."""


@dataclass(frozen=True)
class Node:
    """One schema of the compiled tree."""

    kind: str  # a JSON type, "enum", "any" (anyOf), "map" (an object of any keys) or "json" (any value)
    properties: tuple[tuple[bytes, int, bool], ...] = ()  # object: (the name as a JSON string, node, required)
    items: int = -1  # array: the items' node; map: the values'; json: itself
    literals: tuple[bytes, ...] = ()  # enum
    alternatives: tuple[int, ...] = ()  # any: the nodes of anyOf / oneOf / a list of types


class JsonSchema:
    """The automaton of one schema; `feed`, `complete`, `steady` and `split_spaces` as json_syntax's.
    `canonical`: whitespace exactly as `json.dumps` writes it (one space after each `,` and `:`, none elsewhere), so
    that the text leaves no choice but the values'; `padded`: one newline before and after the value (a tool call's
    JSON between its tags)."""

    def __init__(self, schema: object, *, lenient: bool = False, canonical: bool = False, padded: bool = False):
        self.nodes: list[Node] = []
        self._refs: dict[str, int] = {}
        self._root = schema
        self.lenient, self.canonical, self.padded = lenient, canonical, padded
        value = (VALUE, (), 0, self._compile(schema, "schema"))
        self.start = (EXPECT, (), 0, (0x0A, value)) if padded else value

    # -- compiling ---------------------------------------------------------------------------------------------

    def _compile(self, schema: object, where: str) -> int:
        if schema is True or isinstance(schema, dict) and not set(schema) - ANNOTATIONS:
            return self._any_value()
        try:
            return self._compile_node(schema, where)
        except SchemaError:
            if not self.lenient:
                raise
            return self._any_value()

    def _compile_node(self, schema: object, where: str) -> int:
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
            index = self._add(Node("array"))
            self.nodes[index] = Node("array", items=self._compile(schema.get("items", {}), f"{where}.items"))
            return index
        if kind != "object":
            return self._add(Node(kind))
        extra = schema.get("additionalProperties")
        if "properties" not in schema and not schema.get("required"):
            if extra is False:
                return self._add(Node("object"))  # {} alone
            index = self._add(Node("map"))
            values = extra if isinstance(extra, dict) else {}
            self.nodes[index] = Node("map", items=self._compile(values, f"{where}.additionalProperties"))
            return index
        if extra not in (False, None) and not self.lenient:
            raise SchemaError(f"{where}: additionalProperties must be false where properties are listed (only they "
                              "are written)")  # fmt: skip
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

    def _check(self, schema: dict, allowed: set[str], where: str) -> None:
        unknown = sorted(set(schema) - allowed - ANNOTATIONS)
        if unknown and not self.lenient:
            raise SchemaError(f"{where}: {unknown[0]!r} is not supported here")

    def _add(self, node: Node) -> int:
        self.nodes.append(node)
        return len(self.nodes) - 1

    def _any_value(self) -> int:
        return self._add(Node("json", items=len(self.nodes)))  # its arrays' items and its objects' values: any

    # -- the automaton -------------------------------------------------------------------------------------------

    def complete(self, state) -> bool:
        """Whether the text is one whole value: closed, or a number at the top (the end of the text ends it)."""
        mode, frames, _, extra = state
        if mode == UNION:
            return any(self.complete(member) for member in extra)
        return mode == DONE or mode in NUMBER_ENDS and not frames and not self.padded

    def steady(self, state) -> frozenset[int]:
        if state[0] == STRING or state[0] == UNION and all(member[0] == STRING for member in state[3]):
            return STRING_STEADY
        return frozenset()

    split_spaces = staticmethod(split_spaces)

    def feed(self, state, byte: int):
        mode, frames, spaces, extra = state
        if mode == UNION:
            return _union(self.feed(member, byte) for member in extra)
        if mode == EXPECT:
            return extra[1] if byte == extra[0] else None
        if mode == STRING and byte == 0x22:  # a map's key is followed by its value, another string by what follows
            return (COLON, frames, 0, self.nodes[frames[-1][1]].items) if extra else self._after_value(frames)
        if mode in STRING_MODES:
            return string_feed(state, byte)
        if mode == LITERAL:
            return self._literal(frames, extra, byte)
        if mode in NUMBER_MODES:
            after = number_mode(mode, byte, extra)
            if after is not None:
                return (after, frames, 0, extra)
            return self.feed(self._after_value(frames), byte) if mode in NUMBER_ENDS else None
        if byte in WHITESPACE:  # between tokens, once the value has begun (as json_syntax); canonical: only as EXPECTed
            begun = not self.canonical and mode != DONE and (frames or mode != VALUE)
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
            if self.nodes[node].kind in FREE_KEYS:
                return (STRING, frames, 0, True) if byte == 0x22 else None
            keys = self._next_keys(node, index)
            return self._literal(frames, (keys, 0, True), byte) if keys else None
        if mode == COLON:
            return self._separated((VALUE, frames, 0, extra)) if byte == ord(":") else None
        if mode == AFTER:
            kind, node, index = frames[-1]
            if kind == "[":
                if byte == ord(","):
                    return self._separated((VALUE, frames, 0, self.nodes[node].items))
                return self._after_value(frames[:-1]) if byte == ord("]") else None
            if byte == ord(","):
                more = self.nodes[node].kind in FREE_KEYS or self._next_keys(node, index)
                return self._separated((KEY, frames, 0, None)) if more else None
            return self._after_value(frames[:-1]) if byte == ord("}") and self._may_close(node, index) else None
        return None  # DONE

    def _value(self, frames: tuple, node_index: int, byte: int, expanding: frozenset[int] = frozenset()):
        """The state after the first byte of a value of node `node_index` (`expanding`: the anyOf nodes being
        expanded, which a recursive definition may reach again before any byte)."""
        node = self.nodes[node_index]
        if node.kind == "any":
            expanding = expanding | {node_index}
            return _union(self._value(frames, each, byte, expanding) for each in node.alternatives
                          if each not in expanding)  # fmt: skip
        if node.kind == "enum" or node.kind == "json" and byte in b"tfn":
            literals = JSON_LITERALS if node.kind == "json" else tuple((literal, -1) for literal in node.literals)
            return self._literal(frames, (literals, 0, False), byte)
        if byte == 0x22:
            return (STRING, frames, 0, False) if node.kind in ("string", "json") else None
        if byte in b"{[":
            kind, mode = ("object", FIRST_KEY) if byte == ord("{") else ("array", FIRST_ITEM)
            opens = node.kind == kind or node.kind == "json" or kind == "object" and node.kind == "map"
            return (mode, (*frames, (chr(byte), node_index, 0)), 0, None) if opens else None
        if node.kind not in ("integer", "number", "json"):
            return None
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
        if frames:
            return (AFTER, frames, 0, None)
        return (EXPECT, (), 0, (0x0A, (DONE, (), 0, None))) if self.padded else (DONE, (), 0, None)

    def _separated(self, state: tuple) -> tuple:
        """`state`, after a `,` or `:`: in the canonical layout behind the one space that follows them."""
        return (EXPECT, state[1], 0, (0x20, state)) if self.canonical else state


def _union(states) -> tuple | None:
    """One state for the states alternatives reached (None dropped, unions flattened, duplicates merged): None
    when none goes on, the state itself when one does, else their union."""
    members = set()
    for state in states:
        if state is not None:
            members.update(state[3] if state[0] == UNION else (state,))
    if len(members) <= 1:
        return members.pop() if members else None
    return (UNION, (), 0, frozenset(members))
