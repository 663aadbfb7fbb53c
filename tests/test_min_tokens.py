"""vLLM's `min_tokens` (SGLang's `min_new_tokens`) through the server: read and checked with the request, and
holding back the end of text and stop strings for that many tokens. Exactness under speculation:
tests/test_speculative.py."""

from __future__ import annotations

import pytest
from conftest import tiny_model
from test_tool_calls import InProcessServer

from specchat.engine.generate import Engine
from specchat.engine.text import TextStream
from specchat.server.requests import RequestError, chat_request, text_request

HI = [{"role": "user", "content": "Hi"}]


def test_a_stop_string_is_looked_for_once_the_tokens_held_are_out(tokenizer):
    ids = tokenizer.encode("one two one two")
    for unmatched, shown in ((0, "one"), (len(ids) - 1, "one two one")):
        stream = TextStream(tokenizer, (" two",), unmatched=unmatched)
        text = "".join(stream.add([token]) for token in ids if not stream.stopped)
        assert text == shown and stream.stopped


def test_the_request_names_it_and_bounds_it():
    assert chat_request({"messages": HI, "min_tokens": 5, "max_tokens": 9}).min_tokens == 5
    assert text_request({"prompt": "x", "min_new_tokens": 3}).min_tokens == 3
    assert chat_request({"messages": HI}).min_tokens == 0
    for body, param in (({"min_tokens": 10, "max_tokens": 9}, "min_tokens"), ({"min_tokens": -1}, "min_tokens"),
                        ({"min_new_tokens": 2, "response_format": {"type": "json_object"}}, "min_new_tokens")):
        with pytest.raises(RequestError) as refused:
            chat_request({"messages": HI, **body})
        assert refused.value.param == param


def test_the_server_holds_the_end_back(tokenizer):
    """A stop string the free answer meets at once ends it only after `min_tokens`; the answer is then the free
    answer's continuation, as `Engine.generate` gives it."""
    engine = Engine(tiny_model("llama", seed=3), tokenizer, max_len=512)
    server = InProcessServer(engine, tokenizer)
    try:
        free = server.client.completions.create(model="tiny", prompt="Once upon", temperature=0, max_tokens=12)
        stop = free.choices[0].text[:3]
        assert len(stop) == 3
        held = server.client.completions.create(model="tiny", prompt="Once upon", temperature=0, max_tokens=12,
                                                stop=[stop], extra_body={"min_tokens": 6})  # fmt: skip
    finally:
        server.close()
    assert held.usage.completion_tokens >= 6 and held.choices[0].text.startswith(free.choices[0].text[:1])
    events = Engine(tiny_model("llama", seed=3), tokenizer, max_len=512).generate(
        tokenizer.encode("Once upon"), max_new_tokens=12, stop=(stop,), min_tokens=6)  # fmt: skip
    assert held.choices[0].text == "".join(event.text for event in events)
