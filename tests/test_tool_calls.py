"""Tool calls: the answer's calls are held to their tools' schemas while they are written, read back into OpenAI's
`tool_calls`, and speculation keeps the answer exactly the constrained target's.

- the readers split any chunking of an answer into the same text and calls; tags that may still be coming wait;
  a call a length limit cut stays text;
- `call_schema` keeps each tool's `$defs` apart; the constraint's mask in every state is exactly the tokens it
  advances on (required, none, after a call, in a call's JSON);
- a random model under `tool_choice: required` writes a call of a listed tool with valid arguments, the same
  tokens with random draft trees, greedy and sampled;
- the server (in process, through the official `openai` client): calls in the message and in the stream,
  `finish_reason: tool_calls`, a named tool, tool results in the conversation, bad tools refused in one line, a
  model whose template cannot take tools refused.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import openai
import pytest
from conftest import tiny_model
from drafters_for_tests import RandomTreeDrafter
from starlette.testclient import TestClient

from specchat.constraints import JsonSchema, vocabulary_bytes
from specchat.constraints.token_masks import feed_bytes
from specchat.constraints.tool_call_text import CALL
from specchat.engine.generate import Engine
from specchat.engine.prompt import encode_chat
from specchat.engine.sampling_config import SamplingConfig
from specchat.server.app import Served, create_app
from specchat.server.worker import EngineWorker
from specchat.tool_calls import CLOSE_TAG, OPEN_TAG, TaggedCalls, WholeAnswerCall, call_schema, tool_format

# A chat template in the Hermes convention (as Qwen's): tools listed in the prompt, calls between tags.
TEMPLATE = """{%- if tools %}<|im_start|>system
You may call these functions:
<tools>{% for tool in tools %}
{{ tool | tojson }}{% endfor %}
</tools>
Call one as <tool_call>{"name": ..., "arguments": {...}}</tool_call>.<|im_end|>
{% endif %}{% for message in messages %}{% if message.role == "tool" %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% elif message.tool_calls %}<|im_start|>assistant{% for call in message.tool_calls %}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
# Llama 3's convention: the tools in the prompt, the call the whole answer with its arguments as "parameters".
LLAMA_TEMPLATE = """{%- if tools %}<|im_start|>system
Given the following functions, please respond with a JSON for a function call with its proper arguments.
Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}<|im_end|>
{% endif %}{% for message in messages %}{% if message.role == "tool" %}<|im_start|>ipython
{{ message.content }}<|im_end|>
{% elif message.tool_calls %}{% set call = message.tool_calls[0].function %}<|im_start|>assistant
{"name": "{{ call.name }}", "parameters": {{ call.arguments | tojson }}}<|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
WEATHER = {"name": "get_weather", "description": "The weather in a city", "parameters": {
    "type": "object", "required": ["city"], "properties": {
        "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer"}}}}
TIME = {"name": "get_time", "parameters": {"type": "object", "required": ["zone"], "properties": {
    "zone": {"type": "string", "minLength": 3}}}}  # minLength: outside the subset, so left free (not strict)
FUNCTIONS = [WEATHER, TIME]
TOOLS = [{"type": "function", "function": function} for function in FUNCTIONS]
# Tools without free text or numbers in their calls, so that a random model's calls close (it would write a
# string or a number's digits for ever).
SWITCHES = [
    {"name": "set_unit", "parameters": {"type": "object", "required": ["unit"], "properties": {
        "unit": {"enum": ["celsius", "fahrenheit"]}, "loud": {"type": "boolean"}}}},
    {"name": "lights", "parameters": {"type": "object", "required": ["on"], "properties": {"on": {"type": "boolean"}}}},
]  # fmt: skip
SWITCH_TOOLS = [{"type": "function", "function": function} for function in SWITCHES]
LONG = 1000  # tokens: a random model pads a call with whitespace, up to 64 bytes between each two of its tokens
VOCAB = 49160  # the default tokenizer's 49152, the two tags, room


@pytest.fixture(scope="module")
def tool_tokenizer(hf_tokenizer):
    """The default model's tokenizer with the tags as tokens of their own and a template that lists tools."""
    tools = copy.deepcopy(hf_tokenizer)
    tools.add_tokens([OPEN_TAG, CLOSE_TAG])
    tools.chat_template = TEMPLATE
    return tools


def test_the_reader_splits_any_chunking_into_the_same_text_and_calls():
    answer = f'Let me look.\n{OPEN_TAG}\n{{"name": "get_weather", "arguments": {{"city": "Oslo"}}}}\n{CLOSE_TAG}\n' \
             f'{OPEN_TAG}{{"name": "get_time", "arguments": {{}}}}{CLOSE_TAG}\n'  # fmt: skip
    for size in (1, 2, 3, 7, len(answer)):
        reader, text = TaggedCalls(), ""
        for at in range(0, len(answer), size):
            got, _ = reader.feed(answer[at : at + size])
            assert OPEN_TAG[:2] not in got  # a tag never leaks out, whole or in part
            text += got
        text += reader.finish()[0]
        assert text.strip() == "Let me look."
        assert [(call.name, json.loads(call.arguments)) for call in reader.calls] == [
            ("get_weather", {"city": "Oslo"}), ("get_time", {})]  # fmt: skip
    reader = TaggedCalls()
    assert reader.feed(f"a < b {OPEN_TAG}not json{CLOSE_TAG} c") == (f"a < b {OPEN_TAG}not json{CLOSE_TAG} c", [])
    reader = TaggedCalls()
    assert reader.feed(f'x {OPEN_TAG}{{"name": "get') == ("x ", [])
    assert reader.finish() == (f'{OPEN_TAG}{{"name": "get', [])  # cut by a length limit: the call stays text
    whole = '{"name": "get_weather", "parameters": {"city": "Oslo"}}'  # Llama 3's call: the whole answer
    for answer, is_call in ((whole, True), (" Sunny, " + whole, False), ('{"a": 1}', False), (whole[:-1], False)):
        reader, text = WholeAnswerCall(), ""
        for at in range(0, len(answer), 5):
            text += reader.feed(answer[at : at + 5])[0]
        rest, calls = reader.finish()
        if is_call:
            assert text + rest == "" and [(c.name, json.loads(c.arguments)) for c in calls] == [
                ("get_weather", {"city": "Oslo"})]  # fmt: skip
        else:
            assert text + rest == answer and calls == []


@pytest.fixture(scope="module")
def llama_tokenizer(tokenizer):
    """The default model's tokenizer with a template in Llama 3's convention."""
    llama = copy.deepcopy(tokenizer)
    llama.chat_template = LLAMA_TEMPLATE
    return llama


def test_the_template_says_how_calls_are_written(tool_tokenizer, llama_tokenizer, tokenizer):
    tagged, whole = tool_format(tool_tokenizer), tool_format(llama_tokenizer)
    assert tagged.tagged and tagged.arguments == "arguments" and tool_tokenizer.decode([tagged.open_id]) == OPEN_TAG
    assert not whole.tagged and whole.arguments == "parameters"
    assert tool_format(tokenizer) is None  # SmolLM2's template lists no tools


def test_each_tool_keeps_its_own_definitions():
    item = {"type": "object", "required": ["id"], "properties": {"id": {"type": "integer"}}}
    other = {"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}}
    functions = [
        {"name": "a", "parameters": {"$defs": {"Item": item}, "type": "object", "required": ["x"],
                                     "properties": {"x": {"$ref": "#/$defs/Item"}}}},
        {"name": "b", "parameters": {"definitions": {"Item": other}, "type": "object", "required": ["x"],
                                     "properties": {"x": {"$ref": "#/definitions/Item"}}}},
    ]  # fmt: skip
    schema = JsonSchema(call_schema(functions))
    for text, valid in (('{"name": "a", "arguments": {"x": {"id": 1}}}', True),
                        ('{"name": "b", "arguments": {"x": {"id": "1"}}}', True),
                        ('{"name": "a", "arguments": {"x": {"id": "1"}}}', False),
                        ('{"name": "b", "arguments": {"x": {"id": 1}}}', False)):  # fmt: skip
        state = feed_bytes(schema, schema.start, text.encode())
        assert (state is not None and schema.complete(state)) == valid, text


def _engine(tool_tokenizer, seed: int = 0, **options) -> Engine:
    return Engine(tiny_model("llama", vocab_size=VOCAB, seed=seed), tool_tokenizer, max_len=2048, **options)


def _prompt(tool_tokenizer, text: str = "What is the weather in Oslo?") -> list[int]:
    return encode_chat(tool_tokenizer, [{"role": "user", "content": text}], TOOLS)


@pytest.mark.parametrize("choice", ["auto", "required", "none"])
def test_the_mask_is_exactly_the_tokens_the_constraint_advances_on(choice, tool_tokenizer):
    engine = _engine(tool_tokenizer)
    tags = tool_format(tool_tokenizer)
    constraint = engine.tool_call_constraint(FUNCTIONS, tags, choice=choice, parallel=choice != "none")
    pieces = vocabulary_bytes(tool_tokenizer)
    states = [constraint.start]
    calls = ['\n{"name": "get_', '\n{"name": "get_weather", "arguments": {"city": "Oslo"}}',
             '\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n']  # fmt: skip
    closed = [tags.open_id, *tool_tokenizer.encode('\n{"name": "get_time", "arguments": {"zone": "x"}}\n'),
              tags.close_id, *tool_tokenizer.encode("\n")]  # fmt: skip
    for text in ([tags.open_id], *([tags.open_id, *tool_tokenizer.encode(call)] for call in calls), closed):
        state = constraint.start if choice != "auto" else (0, None, 0)
        for token in text:
            state = state and constraint.advance(state, token)
        if state is not None:
            states.append(state)
    assert len(states) == (1 if choice == "none" else 6)
    for state in states:
        allowed = constraint.allowed(state).numpy()
        advances = np.array([constraint.advance(state, token) is not None for token in range(VOCAB)])
        assert (allowed == advances).all(), state
        if state[0] == CALL:  # the JSON's own tokens: every byte of them taken
            schema = constraint.syntax
            for token in np.flatnonzero(allowed[: len(pieces)]):
                assert token == tags.close_id or feed_bytes(schema, state[1], pieces[token]) is not None
    if choice == "required":
        assert constraint.allowed(constraint.start).sum() == 1
    if choice == "none":
        assert not constraint.allowed(constraint.start)[tags.open_id]


def _answer(engine: Engine, ids: list[int], constraint, **options) -> list[int]:
    return [token for event in engine.generate(ids, max_new_tokens=LONG, constraint=constraint, **options)
            for token in event.tokens]  # fmt: skip


@pytest.mark.parametrize(("seed", "sampled"), [(0, False), (1, True)])
def test_a_required_call_is_valid_and_drafting_keeps_it_exact(seed, sampled, tool_tokenizer):
    engine = _engine(tool_tokenizer, seed)
    tags = tool_format(tool_tokenizer)
    ids = _prompt(tool_tokenizer)
    options = {"sampling": SamplingConfig(temperature=1.0, seed=seed)} if sampled else {}
    alone = _answer(engine, ids, engine.tool_call_constraint(SWITCHES, tags, choice="required"), **options)
    reader = TaggedCalls()
    reader.feed(tool_tokenizer.decode(alone, skip_special_tokens=True))
    assert alone[0] == tags.open_id and reader.calls, tool_tokenizer.decode(alone)
    for call in reader.calls:
        arguments = json.loads(call.arguments)
        function = {function["name"]: function for function in SWITCHES}[call.name]
        assert set(function["parameters"]["required"]) <= set(arguments) <= set(function["parameters"]["properties"])
    drafter = RandomTreeDrafter(vocab_size=VOCAB, seed=seed, reference=ids + alone, p_correct=0.7)
    drafted = _engine(tool_tokenizer, seed, drafter=drafter, draft_budget=12)
    assert _answer(drafted, ids, drafted.tool_call_constraint(SWITCHES, tags, choice="required"), **options) == alone


def test_what_a_call_leaves_no_choice_about_is_verified_as_one_draft(tool_tokenizer):
    """A named call's opening up to its first value, then its closing, are forced: proposed as chains (origin
    "forced") whatever the drafter, and the tokens are the target's own (a random model spells the text its own
    way, so here a chain is accepted only as far as its spelling agrees)."""
    tags = tool_format(tool_tokenizer)
    engine = _engine(tool_tokenizer)
    lights = [SWITCHES[1]]
    constraint = engine.tool_call_constraint(lights, tags, choice="required", parallel=False)
    opening = constraint.forced(constraint.start)
    assert opening[0] == tags.open_id
    assert tool_tokenizer.decode(opening[1:]) == '\n{"name": "lights", "arguments": {"on": '
    state = constraint.start
    for token in [*opening, *tool_tokenizer.encode("true")]:
        state = constraint.advance(state, token)
    closing = constraint.forced(state)
    assert tool_tokenizer.decode(closing[:-1]) == "}}\n" and closing[-1] == tags.close_id
    ids = _prompt(tool_tokenizer)
    alone = _answer(engine, ids, constraint)
    drafted = _engine(tool_tokenizer, drafter=RandomTreeDrafter(vocab_size=VOCAB, seed=0), draft_budget=4)
    events = list(drafted.generate(ids, max_new_tokens=LONG, constraint=drafted.tool_call_constraint(
        lights, tags, choice="required", parallel=False)))  # fmt: skip
    assert [token for event in events for token in event.tokens] == alone
    origins = [origin for event in events for origin in event.origins]
    assert "forced" in origins


@pytest.mark.parametrize("seed", [0, 3])
def test_a_required_whole_answer_call_is_valid_and_exact(seed, llama_tokenizer):
    """Llama 3's form: the answer is the call, in the canonical layout, then the end; drafted the same."""
    form = tool_format(llama_tokenizer)
    engine = _engine(llama_tokenizer, seed)
    ids = _prompt(llama_tokenizer)
    alone = _answer(engine, ids, engine.tool_call_constraint(SWITCHES, form, choice="required"))
    reader = WholeAnswerCall()
    reader.feed(llama_tokenizer.decode(alone, skip_special_tokens=True))
    [call] = reader.finish()[1]
    function = {function["name"]: function for function in SWITCHES}[call.name]
    assert set(function["parameters"]["required"]) <= set(json.loads(call.arguments))
    drafter = RandomTreeDrafter(vocab_size=VOCAB, seed=seed, reference=ids + alone, p_correct=0.7)
    drafted = _engine(llama_tokenizer, seed, drafter=drafter, draft_budget=12)
    events = list(drafted.generate(ids, max_new_tokens=LONG, constraint=drafted.tool_call_constraint(
        SWITCHES, form, choice="required")))  # fmt: skip
    assert [token for event in events for token in event.tokens] == alone
    assert "forced" in [origin for event in events for origin in event.origins]
    with pytest.raises(ValueError, match="only where one is required"):
        engine.tool_call_constraint(SWITCHES, form, choice="auto")


class InProcessServer:
    """The server's app over an engine of ours, served to the official client without a socket."""

    def __init__(self, engine: Engine, tokenizer):
        served = Served(engine, tokenizer, "tiny", frozenset(), "none", {})
        self.worker = EngineWorker(lambda: served, max_queue=4)
        self.worker.start()
        self.worker.ready.wait()
        self.http = TestClient(create_app(self.worker, api_key=None, max_body_bytes=1 << 20))
        self.client = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=self.http,
                                    max_retries=0)  # fmt: skip

    def close(self) -> None:
        self.worker.stop()
        self.worker.join(10)


@pytest.fixture(scope="module")
def tool_server(tool_tokenizer):
    server = InProcessServer(_engine(tool_tokenizer), tool_tokenizer)
    yield server
    server.close()


MESSAGES = [{"role": "user", "content": "What is the weather in Oslo?"}]


def test_the_server_answers_calls_whole_and_streamed(tool_server):
    client = tool_server.client
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=SWITCH_TOOLS, tool_choice="required",
                                           temperature=0, max_tokens=LONG, parallel_tool_calls=False)  # fmt: skip
    [choice] = reply.choices
    calls = choice.message.tool_calls
    assert choice.finish_reason == "tool_calls" and len(calls) == 1 and choice.message.content is None
    assert all(call.function.name in ("set_unit", "lights") and call.id.startswith("call_") for call in calls)
    assert all(isinstance(json.loads(call.function.arguments), dict) for call in calls)
    stream = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=SWITCH_TOOLS,
                                            tool_choice="required", temperature=0, max_tokens=LONG,
                                            parallel_tool_calls=False, stream=True)  # fmt: skip
    streamed, finish = {}, None
    for chunk in stream:
        for delta in chunk.choices[0].delta.tool_calls or []:
            streamed[delta.index] = (delta.function.name, delta.function.arguments)
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert [streamed[i] for i in sorted(streamed)] == [(call.function.name, call.function.arguments) for call in calls]
    lights = {"type": "function", "function": {"name": "lights"}}
    named = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=SWITCH_TOOLS, temperature=0,
                                           max_tokens=LONG, parallel_tool_calls=False, tool_choice=lights)
    assert {call.function.name for call in named.choices[0].message.tool_calls} == {"lights"}


def test_tool_results_go_back_to_the_model(tool_server, tool_tokenizer):
    """A conversation with the assistant's call and the tool's result renders through the template (the
    arguments as an object), and the answer may be text again."""
    messages = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12 degrees, rain"}]  # fmt: skip
    reply = tool_server.client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, temperature=0,
                                                       max_tokens=8, tool_choice="none")  # fmt: skip
    assert reply.choices[0].message.tool_calls is None and reply.choices[0].finish_reason in ("length", "stop")
    from specchat.server.requests import chat_request

    request = chat_request({"messages": messages, "tools": TOOLS})
    prompt = tool_tokenizer.decode(encode_chat(tool_tokenizer, request.messages, request.tools.template()))
    assert '{"name": "get_weather", "arguments": {"city": "Oslo"}}' in prompt and "12 degrees, rain" in prompt


@pytest.mark.parametrize(("fields", "param", "words"), [
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name", "letters"),
    ({"tools": [*TOOLS, TOOLS[0]]}, "tools[2].function.name", "two tools are named 'get_weather'"),
    ({"tools": [{"type": "function", "function": {**TIME, "strict": True}}]}, "tools[0].function.parameters",
     "'minLength'"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "naming"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "response_format", "together"),
    ({"functions": [WEATHER]}, "functions", "tools and tool_choice are"),
])  # fmt: skip
def test_bad_tools_are_refused_in_one_line(fields, param, words, tool_server):
    response = tool_server.http.post("/v1/chat/completions", json={"messages": MESSAGES, **fields})
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == param and words in error["message"], error
    assert "\n" not in error["message"]


def test_the_server_reads_a_whole_answer_call(llama_tokenizer):
    server = InProcessServer(_engine(llama_tokenizer), llama_tokenizer)
    try:
        for stream in (False, True):
            reply = server.client.chat.completions.create(model="tiny", messages=MESSAGES, tools=SWITCH_TOOLS,
                                                          tool_choice="required", temperature=0, max_tokens=LONG,
                                                          stream=stream)  # fmt: skip
            if stream:
                chunks = list(reply)
                calls = [call for chunk in chunks for call in chunk.choices[0].delta.tool_calls or []]
                finish = chunks[-1].choices[0].finish_reason
            else:
                calls, finish = reply.choices[0].message.tool_calls, reply.choices[0].finish_reason
            assert finish == "tool_calls" and len(calls) == 1 and calls[0].function.name in ("set_unit", "lights")
        free = server.client.chat.completions.create(model="tiny", messages=MESSAGES, tools=SWITCH_TOOLS,
                                                     temperature=0, max_tokens=8)  # fmt: skip
        assert free.choices[0].message.tool_calls is None and free.choices[0].message.content
    finally:
        server.close()


def test_a_model_whose_template_lists_no_tools_is_refused(tokenizer):
    server = InProcessServer(Engine(tiny_model("llama"), tokenizer, max_len=256), tokenizer)
    try:
        response = server.http.post("/v1/chat/completions", json={"messages": MESSAGES, "tools": TOOLS})
        assert response.status_code == 400 and "cannot call tools" in response.json()["error"]["message"]
    finally:
        server.close()
