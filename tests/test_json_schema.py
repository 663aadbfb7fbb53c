"""JSON mode under a JSON Schema: the text is one value the schema allows, and speculation keeps it exactly what
the constrained target decodes.

- the automaton takes every value `json.dumps` writes of instances of a Pydantic-like schema (nested objects
  through `$ref`, optional properties, `anyOf` with null, enums, type lists) and each proper prefix as incomplete;
  it refuses each kind of violation (order, a missing required or an unknown property, wrong types, an integer's
  fraction, a value outside an enum); schemas outside the subset are refused naming the keyword, or left free in a
  lenient schema; anyOf alternatives that begin alike (a union of states), maps and free values, top-level numbers;
  padding and the canonical layout;
- a state's mask under a schema is exactly the tokens the automaton takes whole (real tokenizer);
- random trees under a schema give constrained autoregressive decoding's tokens; the embedded model writes a
  valid instance, the same with a drafter, through `specchat run --schema` and the server's `json_schema`.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import tiny_model
from drafters_for_tests import RandomTreeDrafter
from test_cli import assert_one_line_error, specchat, specchat_in_process

from specchat.constraints import JsonSchema, SchemaError
from specchat.constraints.token_masks import TokenMasks, Vocabulary, feed_bytes, vocabulary_bytes
from specchat.engine.generate import Engine
from specchat.engine.prompt import encode_prompt
from specchat.server.requests import RequestError, chat_request

PERSON = {
    "$defs": {"Pet": {"type": "object", "title": "Pet", "required": ["kind"], "properties": {
        "kind": {"enum": ["cat", "dog", 7, None]}, "age": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "friend": {"$ref": "#/$defs/Pet"}}}},
    "type": "object", "title": "Person", "required": ["name", "age", "pets", "nick"],
    "properties": {"name": {"type": "string", "description": "a name"}, "age": {"type": "integer"},
                   "pets": {"type": "array", "items": {"$ref": "#/$defs/Pet"}}, "nick": {"type": ["string", "null"]},
                   "score": {"type": "number"}, "ok": {"type": "boolean"},
                   "born": {"type": "string", "format": "date"}},
}  # fmt: skip
VALID = [
    {"name": "Ann", "age": 31, "pets": [], "nick": None},
    {"name": 'q"\\é', "age": -4, "pets": [{"kind": "cat", "age": None}, {"kind": 7, "friend": {"kind": None}}],
     "nick": "A", "score": 2.5e-3, "ok": True, "born": "2000-01-01"},
    {"name": "", "age": 0, "pets": [{"kind": "dog", "age": 12}], "nick": "", "ok": False},
]  # fmt: skip
INVALID = [
    {"age": 31, "name": "Ann", "pets": [], "nick": None},  # order
    {"name": "Ann", "pets": [], "nick": None},  # a required property missing
    {"name": "Ann", "age": 31, "pets": [], "nick": None, "extra": 1},  # an unknown property
    {"name": "Ann", "age": 31.5, "pets": [], "nick": None},  # an integer's fraction
    {"name": "Ann", "age": 31, "pets": [{"kind": "cow"}], "nick": None},  # outside the enum
    {"name": "Ann", "age": 31, "pets": [{"kind": "cat", "age": "3"}], "nick": None},  # anyOf: neither
    {"name": 5, "age": 31, "pets": [], "nick": None},
    {"name": "Ann", "age": 31, "pets": {}, "nick": None},
    {"name": "Ann", "age": 31, "pets": [], "nick": 3},
    {"name": "Ann", "age": 31, "pets": [], "nick": None, "ok": "yes"},
]


def _feed(schema: JsonSchema, text: bytes):
    return feed_bytes(schema, schema.start, text)


def test_the_automaton_takes_instances_and_refuses_violations():
    schema = JsonSchema(PERSON)
    for value in VALID:
        for style in ({}, {"indent": 2}, {"separators": (",", ":")}, {"ensure_ascii": False}):
            text = json.dumps(value, **style).encode()
            assert schema.complete(_feed(schema, text)), text
            for cut in range(len(text)):
                state = _feed(schema, text[:cut])
                assert state is not None and not schema.complete(state), (text, cut)
    for value in INVALID:
        state = _feed(schema, json.dumps(value).encode())
        assert state is None or not schema.complete(state), value


@pytest.mark.parametrize(("schema", "words"), [
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}}, "schema.properties.a: 'pattern'"),
    ({"type": "array", "items": {"type": "integer"}, "maxItems": 3}, "'maxItems'"),
    ({"allOf": [{"type": "string"}]}, "'allOf' is not supported"),
    ({"not": {"type": "string"}}, "'not' is not supported"),
    ({"$ref": "#/$defs/Missing"}, "not a definition"),
    ({"type": "object", "properties": {}, "required": ["a"]}, "required names 'a'"),
    ({"type": "object", "properties": {"a": {}}, "additionalProperties": True}, "additionalProperties must be false"),
    (False, "must be a JSON object"),
    ({"type": "date"}, "type 'date' is not supported"),
    ([1], "must be a JSON object"),
])  # fmt: skip
def test_schemas_outside_the_subset_are_refused_by_name(schema, words):
    with pytest.raises(SchemaError, match=words.replace("(", r"\(")):
        JsonSchema(schema)


TOOLS = {"anyOf": [  # alternatives told apart only by their names: a union of states until the name's bytes differ
    {"type": "object", "required": ["name", "arguments"], "properties": {
        "name": {"const": "get"},
        "arguments": {"type": "object", "required": ["x"], "properties": {"x": {"type": "integer"}}}}},
    {"type": "object", "required": ["name", "arguments"], "properties": {
        "name": {"const": "get_weather"}, "arguments": {"type": "object", "additionalProperties": {"type": "string"}}}},
]}  # fmt: skip


@pytest.mark.parametrize(("schema", "valid", "invalid"), [
    (TOOLS, [{"name": "get", "arguments": {"x": 3}}, {"name": "get_weather", "arguments": {"city": "Oslo", "a": ""}},
             {"name": "get_weather", "arguments": {}}],
     [{"name": "get", "arguments": {"city": "Oslo"}}, {"name": "get_weather", "arguments": {"x": 3}},
      {"name": "get_w", "arguments": {}}, {"name": "get", "arguments": {}}]),
    ({"anyOf": [{"type": "integer"}, {"type": "number"}, {"type": "array", "items": {"type": "integer"}},
                {"type": "array", "items": {"type": "string"}}]},
     [3, -2.5e3, [1, 2], ["a"], []], ["3", [1, "a"], [1.5], None]),
    ({}, [{"a": [1, {"b": None}, "x\u00e9"], "c": True}, [], "s", -0.5, None, False], []),
    ({"type": "object"}, [{}, {"k": [1, {"b": None}]}, {"a": 1, "a2": "x"}], [[], "x", 3]),
    ({"type": "object", "additionalProperties": {"type": "integer"}}, [{"a": 1, "b\"c": -2}, {}],
     [{"a": "x"}, {"a": 1.5}]),
    ({"type": "object", "additionalProperties": False}, [{}], [{"a": 1}]),
    ({"type": "array"}, [[1, "x", [None]], []], [{}]),
    ({"type": "integer"}, [0, 12, -7], [1.5, "1"]),
    ({"$defs": {"A": {"anyOf": [{"$ref": "#/$defs/A"}, {"type": "null"}]}}, "$ref": "#/$defs/A"}, [None], [0]),
])  # fmt: skip
def test_unions_free_values_and_top_level_numbers(schema, valid, invalid):
    automaton = JsonSchema(schema)
    for value in valid:
        for style in ({}, {"indent": 1}, {"separators": (",", ":")}):
            text = json.dumps(value, **style).encode()
            assert automaton.complete(_feed(automaton, text)), text
            for cut in range(len(text)):  # a proper prefix is whole only where it is a number that may go on
                state = _feed(automaton, text[:cut])
                assert state is not None, (text, cut)
                assert not automaton.complete(state) or isinstance(json.loads(text[:cut]), (int, float)), (text, cut)
    for value in invalid:
        state = _feed(automaton, json.dumps(value).encode())
        assert state is None or not automaton.complete(state), value


def test_lenient_schemas_padding_and_the_canonical_layout():
    schema = {"type": "object", "required": ["n"], "properties": {
        "n": {"type": "integer", "minimum": 1}, "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
        "odd": {"allOf": [{"type": "string"}]}}}  # fmt: skip
    with pytest.raises(SchemaError, match="'minimum'"):
        JsonSchema(schema)
    lenient = JsonSchema(schema, lenient=True)
    for value in ({"n": 0}, {"n": 5, "tags": ["a", "b", "c"], "odd": [1, {"x": None}]}):
        assert lenient.complete(_feed(lenient, json.dumps(value).encode())), value
    for value in ({"n": "5"}, {"n": 5, "tags": [1]}, {"tags": []}):
        state = _feed(lenient, json.dumps(value).encode())
        assert state is None or not lenient.complete(state), value
    padded = JsonSchema(TOOLS, padded=True)
    text = b'\n{"name": "get",\n "arguments": {"x": 3}}\n'
    assert padded.complete(_feed(padded, text))
    for wrong in (text[1:], text[:-1], b"\n " + text[1:], text + b"\n"):
        state = _feed(padded, wrong)
        assert state is None or not padded.complete(state), wrong
    canonical = JsonSchema(PERSON, canonical=True)
    for value in VALID:
        assert canonical.complete(_feed(canonical, json.dumps(value).encode()))
        for style in ({"indent": 1}, {"separators": (",", ":")}):
            assert _feed(canonical, json.dumps(value, **style).encode()) is None


PERSON_PREFIXES = [
    b"", b"{", b'{"na', b'{"name": "A', b'{"name": "A", ', b'{"name": "A", "age": 3',
    b'{"name": "A", "age": 3, "pets": [',
    b'{"name": "A", "age": 3, "pets": [{"kind": ', b'{"name": "A", "age": 3, "pets": [{"kind": 7',
    b'{"name": "A", "age": 3, "pets": [], "nick": null', b'{"name": "A", "age": 3, "pets": [], "nick": null, "ok": t',
]  # fmt: skip
TOOL_PREFIXES = [b"", b"\n", b'\n{"name": "get', b'\n{"name": "get_w', b'\n{"name": "get", "arguments": {"x": 1',
                 b'\n{"name": "get_weather", "arguments": {"k', b'\n{"name": "get_weather", "arguments": {}}',
                 b'\n{"name": "get_weather", "arguments": {}}\n']  # fmt: skip


@pytest.mark.parametrize(("schema", "options", "prefixes"), [
    (PERSON, {}, PERSON_PREFIXES), (TOOLS, {"padded": True}, TOOL_PREFIXES),
    (TOOLS, {"padded": True, "canonical": True}, TOOL_PREFIXES),
    ({"type": "integer"}, {}, [b"", b"-", b"12"]),
])  # fmt: skip
def test_a_schema_state_mask_is_every_token_the_automaton_takes(schema, options, prefixes, tokenizer, default_model):
    pieces = vocabulary_bytes(tokenizer)
    size = default_model.model.config.vocab_size
    automaton = JsonSchema(schema, **options)
    end = 2
    masks = TokenMasks(Vocabulary(pieces, size), automaton, frozenset({end}))
    for prefix in prefixes:
        state = _feed(automaton, prefix)
        expected = np.array([i < size and piece is not None and feed_bytes(automaton, state, piece) is not None
                             for i, piece in enumerate(pieces)] + [False] * (size - len(pieces)))  # fmt: skip
        expected[end] = automaton.complete(state)
        assert (masks.allowed(state).numpy() == expected).all(), prefix
        assert masks.allowed(state).any()


VOCAB = 1024
SMALL = {"type": "object", "required": ["a", "b"], "properties": {
    "a": {"type": "array", "items": {"type": "string"}}, "b": {"type": "integer"},
    "c": {"enum": [True, "x"]}}}  # fmt: skip


@pytest.mark.parametrize(("family", "seed", "budget"), [("llama", 2, 4), ("qwen2", 3, 16)])
def test_random_trees_under_a_schema_equal_constrained_decoding(family, seed, budget, tokenizer):
    model = tiny_model(family, vocab_size=VOCAB, seed=seed)
    prompt = torch.randint(3, VOCAB, (12,), generator=torch.Generator().manual_seed(seed)).tolist()
    engine = Engine(model, tokenizer, max_len=256)
    alone = [t for e in engine.generate(prompt, max_new_tokens=80, constraint=engine.json_constraint(SMALL))
             for t in e.tokens]  # fmt: skip
    assert len(set(alone)) > 5
    drafter = RandomTreeDrafter(vocab_size=VOCAB, seed=seed, reference=prompt + alone, p_correct=0.7)
    engine = Engine(model, tokenizer, max_len=256, drafter=drafter, draft_budget=budget)
    drafted = [t for e in engine.generate(prompt, max_new_tokens=80, constraint=engine.json_constraint(SMALL))
               for t in e.tokens]  # fmt: skip
    assert drafted == alone


@pytest.mark.slow
def test_the_embedded_model_writes_an_instance_with_and_without_a_drafter(default_model):
    from specchat.session import Session

    ids = encode_prompt(default_model.tokenizer, "Describe a person who has two pets.")
    answers = []
    for drafter in ("none", "ngram"):
        engine = Session.over(default_model, max_len=512, drafter=drafter).engine
        events = list(engine.generate(ids, max_new_tokens=100, constraint=engine.json_constraint(PERSON)))
        text = "".join(event.text for event in events).encode()
        if events[-1].finish_reason == "eos":
            assert JsonSchema(PERSON).complete(_feed(JsonSchema(PERSON), text))
        assert _feed(JsonSchema(PERSON), text) is not None
        answers.append([t for event in events for t in event.tokens])
    assert answers[0] == answers[1]


@pytest.mark.slow
def test_run_schema(tmp_path):
    path = tmp_path / "schema.json"
    path.write_text(json.dumps({"type": "object", "required": ["colour", "sweet"], "properties": {
        "colour": {"enum": ["red", "green", "yellow"]}, "sweet": {"type": "boolean"}}}))  # fmt: skip
    result = specchat("run", "Describe a ripe banana.", "--schema", str(path), "--json", "-n", "40", "--temperature",
                      "0", warm=True)  # fmt: skip
    report = json.loads(result.stdout)
    value = json.loads(report["text"])
    assert report["finish_reason"] == "eos" and value["colour"] in ("red", "green", "yellow")
    assert set(value) == {"colour", "sweet"} and isinstance(value["sweet"], bool)


def test_run_refuses_a_bad_schema_file_in_one_line(tmp_path, monkeypatch, capfd):
    (tmp_path / "bad.json").write_text('{"type": "string", "minLength": 2}')
    (tmp_path / "broken.json").write_text("{")
    for name, words in [("bad.json", "'minLength'"), ("broken.json", "is not JSON"), ("none.json", "cannot read")]:
        result = specchat_in_process(monkeypatch, capfd, "run", "hi", "--schema", str(tmp_path / name))
        assert_one_line_error(result, "--schema", words)


def test_the_server_checks_a_json_schema_before_queueing():
    hi = [{"role": "user", "content": "Hi"}]
    wanted = chat_request({"messages": hi, "response_format": {"type": "json_schema", "json_schema": {
        "name": "person", "strict": True, "schema": PERSON}}})  # fmt: skip
    assert wanted.format.json and wanted.format.schema == PERSON
    with pytest.raises(RequestError, match="'pattern'") as caught:
        chat_request({"messages": hi, "response_format": {"type": "json_schema", "json_schema": {
            "schema": {"type": "string", "pattern": "a+"}}}})  # fmt: skip
    assert caught.value.param == "response_format"
    with pytest.raises(RequestError, match="json_schema must be a JSON object"):
        chat_request({"messages": hi, "response_format": {"type": "json_schema"}})


def test_the_engine_keeps_a_schema_constraint_and_its_masks(default_model):
    engine = Engine(default_model.model, default_model.tokenizer, max_len=64)
    same = json.loads(json.dumps(SMALL))
    assert engine.json_constraint(SMALL) is engine.json_constraint(same)
    assert engine.json_constraint(SMALL) is not engine.json_constraint()
    assert engine.json_constraint(SMALL).vocabulary is engine.json_constraint().vocabulary
