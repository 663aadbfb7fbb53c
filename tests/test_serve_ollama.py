"""Ollama's API: its request bodies read as the OpenAI routes read theirs, and the official `ollama` client talking
to the real app over a small engine (no socket), against the OpenAI routes' answers to the same requests."""

from __future__ import annotations

import asyncio
import json

import httpx
import ollama
import pytest
from conftest import tiny_model
from test_tool_calls import OPEN_TAG, SWITCH_TOOLS, InProcessServer, tool_tokenizer  # noqa: F401 (a fixture)

from specchat.answer_format import AnswerFormat
from specchat.engine.events import StepEvent
from specchat.engine.generate import Engine
from specchat.engine.stats import GenerationStats
from specchat.fill_in_middle import Infill
from specchat.server.ollama import OllamaReply, ollama_request
from specchat.server.requests import RequestError
from specchat.tool_calls import tool_format

HI = [{"role": "user", "content": "Hi"}]


def test_a_generate_request_is_a_chat_turn_with_ollamas_options():
    request = ollama_request({"model": "m", "prompt": "Hi", "system": "Be brief.", "options": {
        "num_predict": 20, "temperature": 0.5, "top_k": 40, "top_p": 0.9, "min_p": 0.05, "seed": 7, "stop": ["END"],
        "repeat_penalty": 1.1, "num_ctx": 8192, "num_thread": 2}, "keep_alive": "5m"}, chat=False)  # fmt: skip
    assert request.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert request.sampling == {"temperature": 0.5, "top_k": 40, "top_p": 0.9, "min_p": 0.05, "seed": 7,
                                "penalty": 1.1}  # fmt: skip
    assert request.max_tokens == 20 and request.stop == ("END",) and request.reply == "ollama-generate"
    assert request.stream  # Ollama's default
    unlimited = ollama_request({"prompt": "Hi", "options": {"num_predict": -1}, "stream": False}, chat=False)
    assert unlimited.max_tokens is None and not unlimited.stream
    raw = ollama_request({"prompt": "def f(", "raw": True}, chat=False)
    assert raw.prompt == "def f(" and raw.messages is None and raw.max_tokens is None
    assert ollama_request({"prompt": "def f(", "suffix": "\n"}, chat=False).infill == Infill("def f(", "\n")


def test_a_chat_request_keeps_its_calls_and_format():
    calls = [{"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]
    request = ollama_request({"messages": [*HI, {"role": "assistant", "content": "", "tool_calls": calls},
                                           {"role": "tool", "content": "sunny", "tool_name": "get_weather"}],
                              "tools": SWITCH_TOOLS}, chat=True)  # fmt: skip
    assert request.messages[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Oslo"}}
    assert request.messages[2] == {"role": "tool", "content": "sunny"} and request.reply == "ollama-chat"
    assert len(request.tools.functions) == len(SWITCH_TOOLS)
    assert ollama_request({"messages": HI, "format": "json"}, chat=True).format == AnswerFormat(json=True)
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}}
    held = ollama_request({"messages": HI, "format": schema}, chat=True).format
    assert held == AnswerFormat(json=True, schema=schema)
    assert ollama_request({"messages": HI, "logprobs": True, "top_logprobs": 3}, chat=True).logprobs == 3


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": HI, "format": "yaml"}, "format"),
    ({"messages": HI, "think": True}, "think"),
    ({"messages": [{"role": "user", "content": "?", "images": ["aGk="]}]}, "images"),
    ({"messages": HI, "options": {"temperature": "hot"}}, "temperature"),
    ({"messages": HI, "options": []}, "options"),
    ({"messages": HI, "options": {"num_predict": 0}}, "num_predict"),
    ({"prompt": "Hi", "template": "{{ .Prompt }}"}, "template"),
    ({"prompt": "Hi", "context": [1, 2, 3]}, "context"),
])  # fmt: skip
def test_what_cannot_be_done_is_refused_by_name(body, param):
    with pytest.raises(RequestError) as refused:
        ollama_request(body, chat="messages" in body)
    assert refused.value.param == param


def test_a_call_goes_back_whole_with_its_arguments_an_object(tool_tokenizer):  # noqa: F811 (the fixture)
    reply = OllamaReply("m", "none", chat=True, tools=tool_format(tool_tokenizer))
    call = f'{OPEN_TAG}\n{{"name": "lights", "arguments": {{"on": true}}}}\n</tool_call>'
    line = json.loads(reply.chunk(StepEvent([1, 2], ["target"] * 2, call, "eos", GenerationStats(new_tokens=2))))
    assert line["message"] == {"role": "assistant", "content": "",
                               "tool_calls": [{"function": {"name": "lights", "arguments": {"on": True}}}]}
    assert not line["done"] and json.loads(reply.finish_chunk())["done_reason"] == "stop"


@pytest.fixture(scope="module")
def server(tokenizer):
    server = InProcessServer(Engine(tiny_model("llama", seed=3), tokenizer, max_len=1024), tokenizer)
    yield server
    server.close()


def _client(server) -> ollama.AsyncClient:
    return ollama.AsyncClient(host="http://testserver", transport=httpx.ASGITransport(app=server.http.app))


def test_the_ollama_client_chats_and_generates_what_the_openai_routes_answer(server):
    openai = server.client

    async def talk():
        client = _client(server)
        whole = await client.chat("tiny", messages=HI, options={"temperature": 0, "num_predict": 12})
        parts = [part async for part in await client.chat("tiny", messages=HI, stream=True,
                                                          options={"temperature": 0, "num_predict": 12})]  # fmt: skip
        made = await client.generate("tiny:latest", "Hi", system="Be brief.", options={"temperature": 0,
                                                                                       "num_predict": 12})
        raw = await client.generate("tiny", "Once upon", raw=True, options={"temperature": 0, "num_predict": 12})
        scored = await client.chat("tiny", messages=HI, logprobs=True, top_logprobs=2,
                                   options={"temperature": 0, "num_predict": 5})  # fmt: skip
        loaded, stopped = await client.generate("tiny"), await client.chat("tiny", keep_alive=0)
        return whole, parts, made, raw, scored, loaded, stopped

    whole, parts, made, raw, scored, loaded, stopped = asyncio.run(talk())
    expected = openai.chat.completions.create(model="tiny", messages=HI, temperature=0, max_tokens=12)
    assert whole.message.content == expected.choices[0].message.content and whole.done_reason == "length"
    assert whole.eval_count == 12 and whole.prompt_eval_count == expected.usage.prompt_tokens
    assert whole.total_duration >= whole.eval_duration > 0 and whole.load_duration == 0
    assert "".join(part.message.content for part in parts) == whole.message.content
    assert [part.done for part in parts] == [False] * (len(parts) - 1) + [True] and parts[-1].eval_count == 12
    stamps = [part.created_at for part in parts]  # each object's own time, as Ollama's
    assert stamps == sorted(stamps) and stamps[0] < stamps[-1]
    system = [{"role": "system", "content": "Be brief."}, *HI]
    assert made.response == openai.chat.completions.create(model="tiny", messages=system, temperature=0,
                                                           max_tokens=12).choices[0].message.content  # fmt: skip
    assert raw.response == openai.completions.create(model="tiny", prompt="Once upon", temperature=0,
                                                     max_tokens=12).choices[0].text  # fmt: skip
    assert len(scored.logprobs) == 5 and all(len(each.top_logprobs) == 2 for each in scored.logprobs)
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""
    assert stopped.done_reason == "unload" and stopped.message.content == ""  # `ollama stop`


def test_the_model_is_listed_shown_and_errors_are_ollamas(server):
    async def ask():
        client = _client(server)
        listed, running, shown = await client.list(), await client.ps(), await client.show("tiny")
        errors = []
        for call in (client.chat("gpt-4", messages=HI), client.generate("tiny", "x", suffix="y"),
                     client.chat("tiny", messages=HI, options={"top_p": 3})):  # fmt: skip
            with pytest.raises(ollama.ResponseError) as failed:
                await call
            errors.append((failed.value.status_code, failed.value.error))
        version = (await httpx.AsyncClient(transport=httpx.ASGITransport(app=server.http.app),
                                           base_url="http://testserver").get("/api/version")).json()  # fmt: skip
        return listed, running, shown, errors, version

    listed, running, shown, errors, version = asyncio.run(ask())
    [model] = listed.models
    assert model.model == "tiny" and model.size > 0 and model.details.family == "llama"
    assert len(model.digest) == 64 and model.digest == running.models[0].digest  # `ollama list` shows its ID
    dense = server.worker.served.engine.model  # its parameters' own count: the shapes' sum must match it
    assert model.details.format == "safetensors"
    assert model.details.parameter_size == f"{sum(p.numel() for p in dense.parameters()) / 1e6:.0f}M"
    capacity = server.worker.served.engine.capacity  # the prompt and answer's room, below max_len by a tree's
    assert running.models[0].context_length == capacity
    assert shown.modelinfo["llama.context_length"] == capacity and "completion" in shown.capabilities
    assert shown.template == server.worker.served.tokenizer.chat_template
    assert [status for status, _ in errors] == [404, 400, 400]
    assert "'gpt-4' is not served here" in errors[0][1] and "fill-in-the-middle" in errors[1][1]
    assert "top_p" in errors[2][1] and version["version"]
    assert server.http.head("/").status_code == 200 and "running" in server.http.get("/").text  # the CLI's heartbeat
    unknown = server.http.post("/api/pull", json={"model": "tiny"})
    assert unknown.status_code == 404 and unknown.json() == {"error": "POST /api/pull: Not Found"}
