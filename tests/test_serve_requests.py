"""Request bodies checked before anything is queued: each bad field is a 4xx naming it (no server, no model)."""

import json

import pytest

from specchat.answer_format import AnswerFormat
from specchat.fill_in_middle import Infill
from specchat.server.requests import (
    RequestError,
    chat_request,
    detokenize_request,
    text_request,
    tokenize_request,
)  # fmt: skip

HI = [{"role": "user", "content": "Hi"}]


def test_a_plain_chat_request_takes_the_model_defaults():
    request = chat_request({"model": "m", "messages": HI})
    assert request.messages == HI and request.sampling == {} and request.max_tokens is None
    assert request.stop == () and not request.stream


def test_fields_map_onto_the_engine_settings():
    request = chat_request({
        "messages": [{"role": "developer", "content": "Be brief."},
                     {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
        "temperature": 0.7, "top_p": 0.9, "top_k": -1, "min_p": 0.05, "seed": 3, "repetition_penalty": 1.1,
        "max_completion_tokens": 20, "stop": "END", "stream": True, "stream_options": {"include_usage": True},
        "n": 1, "frequency_penalty": 0.5, "presence_penalty": 0.0, "logprobs": False, "tool_choice": "none",
        "logit_bias": {"7": -100, "3": 2.5},
        "response_format": {"type": "text"}, "user": "someone", "some_client_extension": {"x": 1},
    })  # fmt: skip
    assert request.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "ab"}]
    assert request.sampling == {"temperature": 0.7, "top_p": 0.9, "top_k": 0, "min_p": 0.05, "seed": 3, "penalty": 1.1,
                                "frequency_penalty": 0.5, "presence_penalty": 0.0,
                                "logit_bias": ((3, 2.5), (7, -100.0))}  # fmt: skip
    assert request.max_tokens == 20 and request.stop == ("END",) and request.stream and request.include_usage


def test_response_format_json_object_asks_for_json_mode_on_both_endpoints():
    assert chat_request({"messages": HI, "response_format": {"type": "json_object"}}).format == AnswerFormat(json=True)
    assert text_request({"prompt": "{", "response_format": {"type": "json_object"}}).format.json
    assert chat_request({"messages": HI, "response_format": {"type": "text"}}).format.free
    assert text_request({"prompt": "x"}).format.free
    grammar = 'root ::= "yes" | "no"'
    assert text_request({"prompt": "x", "grammar": grammar}).format == AnswerFormat(grammar=grammar)
    assert chat_request({"messages": HI, "grammar": ""}).format.free  # llama-server's default
    assert chat_request({"messages": HI, "grammar": grammar, "response_format": {"type": "text"}}).format.grammar
    assert text_request({"prompt": "x", "ignore_eos": True}).ignore_eos and not text_request({"prompt": "x"}).ignore_eos
    at_start = text_request({"prompt": "", "suffix": "\n    return x\n"})  # a completion at a file's start
    assert at_start.infill == Infill("", "\n    return x\n")


def test_vllm_structured_outputs_hold_the_answer():
    """`structured_outputs` (vLLM's since 0.12), the `guided_*` fields before it and SGLang's `regex` / `ebnf`: a
    choice is the regular expression of its strings, each escaped."""
    person = {"type": "object", "properties": {"age": {"type": "integer"}}}
    for body, held in [
        ({"structured_outputs": {"choice": ["yes", "no (1+1)"]}}, AnswerFormat(regex=r"yes|no\ \(1\+1\)")),
        ({"guided_choice": ["a.b"]}, AnswerFormat(regex=r"a\.b")),
        ({"structured_outputs": {"regex": r"\d+"}}, AnswerFormat(regex=r"\d+")),
        ({"structured_outputs": {"json": person}}, AnswerFormat(json=True, schema=person)),
        ({"guided_json": json.dumps(person)}, AnswerFormat(json=True, schema=person)),
        ({"structured_outputs": {"grammar": 'root ::= "a"'}}, AnswerFormat(grammar='root ::= "a"')),
        ({"guided_grammar": 'root ::= "a"'}, AnswerFormat(grammar='root ::= "a"')),
        ({"regex": r"\d+"}, AnswerFormat(regex=r"\d+")),  # SGLang's
        ({"ebnf": 'root ::= "a"'}, AnswerFormat(grammar='root ::= "a"')),
    ]:
        assert chat_request({"messages": HI, **body}).format == held
        assert text_request({"prompt": "x", **body}).format == held


def test_logprobs_count_the_alternatives_asked_for():
    assert chat_request({"messages": HI}).logprobs is None
    assert chat_request({"messages": HI, "logprobs": True}).logprobs == 0
    assert chat_request({"messages": HI, "logprobs": True, "top_logprobs": 20}).logprobs == 20
    assert chat_request({"messages": HI, "logprobs": False, "top_logprobs": 0}).logprobs is None
    assert text_request({"prompt": "x", "logprobs": 0}).logprobs == 0
    assert text_request({"prompt": "x", "logprobs": 5}).logprobs == 5


def test_completions_take_text_or_token_ids_and_default_to_16_tokens():
    assert text_request({"prompt": "Once"}).prompt == "Once"
    assert text_request({"prompt": ["Once"]}).max_tokens == 16
    assert text_request({"prompt": [1, 2, 3], "max_tokens": None}).prompt == [1, 2, 3]
    assert text_request({"prompt": [[5, 6]], "max_tokens": 4}).max_tokens == 4


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ([], None, "JSON object"),
        ({}, "messages", "required"),
        ({"messages": []}, "messages", "non-empty"),
        ({"messages": "Hi"}, "messages", "non-empty list"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "one of"),
        ({"messages": [{"role": "function", "content": "x"}]}, "messages[0].role", "one of"),
        ({"messages": [*HI, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]},
                       {"role": "tool", "content": "x"}]}, "messages[1].tool_calls[0].function.arguments", "not JSON"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "string"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
         "messages[0].content[0]", "only text"),
        ({"messages": [*HI, {"role": "assistant", "content": "x"}]}, "messages[1].role", "last message"),
        ({"messages": HI, "model": 7}, "model", "string"),
        ({"messages": HI, "temperature": "hot"}, "temperature", "number"),
        ({"messages": HI, "temperature": True}, "temperature", "number"),
        ({"messages": HI, "temperature": 2.5}, "temperature", "[0, 2]"),
        ({"messages": HI, "temperature": -1}, "temperature", "[0, 2]"),
        ({"messages": HI, "top_p": 0}, "top_p", "(0, 1]"),
        ({"messages": HI, "min_p": 1}, "min_p", "[0, 1)"),
        ({"messages": HI, "top_k": -2}, "top_k", "-1 or 0"),
        ({"messages": HI, "top_k": 1.5}, "top_k", "integer"),
        ({"messages": HI, "seed": -1}, "seed", "between"),
        ({"messages": HI, "repetition_penalty": 0}, "repetition_penalty", "(0, 10]"),
        ({"messages": HI, "max_tokens": -5}, "max_tokens", "at least 1"),
        ({"messages": HI, "max_tokens": 0}, "max_tokens", "at least 1"),
        ({"messages": HI, "max_tokens": "10"}, "max_tokens", "integer"),
        ({"messages": HI, "max_tokens": 5, "max_completion_tokens": 5}, "max_completion_tokens", "not both"),
        ({"messages": HI, "n": 17}, "n", "between 1 and 16"),
        ({"messages": HI, "tools": [{"type": "function"}]}, "tools[0].function", "JSON object"),
        ({"messages": HI, "tools": {"f": {}}}, "tools", "a list"),
        ({"messages": HI, "tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"messages": HI, "logprobs": "yes"}, "logprobs", "boolean"),
        ({"messages": HI, "top_logprobs": 3}, "top_logprobs", "needs logprobs: true"),
        ({"messages": HI, "logprobs": True, "top_logprobs": 21}, "top_logprobs", "between 0 and 20"),
        ({"messages": HI, "frequency_penalty": 2.5}, "frequency_penalty", "[-2, 2]"),
        ({"messages": HI, "presence_penalty": -3}, "presence_penalty", "[-2, 2]"),
        ({"messages": HI, "logit_bias": {"a": 10}}, "logit_bias", "token ids"),
        ({"messages": HI, "logit_bias": {"5": 101}}, "logit_bias", "-100 to 100"),
        ({"messages": HI, "logit_bias": [5, 1]}, "logit_bias", "token ids"),
        ({"messages": HI, "response_format": {"type": "grammar"}}, "response_format", "'json_object' or 'json_schema'"),
        ({"messages": HI, "response_format": {"type": "json_schema"}}, "response_format.json_schema", "JSON object"),
        ({"messages": HI, "grammar": "root ::= x"}, "grammar", "rule 'x' is used but not defined"),
        ({"messages": HI, "grammar": ["root"]}, "grammar", "a string"),
        ({"messages": HI, "grammar": 'root ::= "a"', "response_format": {"type": "json_object"}}, "grammar",
         "give one of response_format, grammar"),
        ({"messages": HI, "structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs",
         "one of choice, regex, json, grammar"),
        ({"messages": HI, "structured_outputs": {"regex": "(?=a)"}}, "structured_outputs.regex", "lookarounds"),
        ({"messages": HI, "structured_outputs": {"choice": []}}, "structured_outputs.choice", "non-empty strings"),
        ({"messages": HI, "structured_outputs": {"json": "{"}}, "structured_outputs.json", "a JSON Schema"),
        ({"messages": HI, "guided_regex": r"a\1"}, "guided_regex", "backreferences"),
        ({"messages": HI, "ignore_eos": "yes"}, "ignore_eos", "boolean"),
        ({"messages": HI, "ignore_eos": True, "grammar": 'root ::= "a"'}, "ignore_eos", "a held text must end"),
        ({"messages": HI, "ignore_eos": True, "tools": [{"type": "function", "function": {"name": "f"}}]},
         "ignore_eos", "a call must end"),
        ({"messages": HI, "grammar": 'root ::= "a"', "tools": [{"type": "function", "function": {"name": "f"}}]},
         "grammar", "grammar and tools together"),
        ({"messages": HI, "stop": 5}, "stop", "string"),
        ({"messages": HI, "stop": ["a"] * 17}, "stop", "at most"),
        ({"messages": HI, "stream": "yes"}, "stream", "boolean"),
        ({"messages": HI, "stream_options": {"include_usage": True}}, "stream_options", "only allowed"),
        ({"messages": HI, "stream": True, "stream_options": {"include_usage": 1}}, "stream_options.include_usage",
         "boolean"),
    ],
)  # fmt: skip
def test_bad_chat_requests_name_their_field(body, param, words):
    with pytest.raises(RequestError) as caught:
        chat_request(body)
    error = caught.value
    assert error.status == 400 and error.param == param and words in error.message
    assert error.body()["error"] == {"message": error.message, "type": "invalid_request_error", "param": param,
                                     "code": None}  # fmt: skip


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({}, "prompt", "required"),
        ({"prompt": ""}, "prompt", "empty"),
        ({"prompt": ["a", "b"]}, "prompt", "one prompt"),
        ({"prompt": [1, -2]}, "prompt", ">= 0"),
        ({"prompt": {"text": "a"}}, "prompt", "string or a list of token ids"),
        ({"prompt": "a", "echo": "yes"}, "echo", "boolean"),
        ({"prompt": "a", "max_tokens": 0}, "max_tokens", "at least 1"),
        ({"prompt": "a", "max_tokens": -1, "echo": True}, "max_tokens", "at least 0"),
        ({"prompt": "a", "suffix": 5}, "suffix", "a string"),
        ({"prompt": "a", "suffix": "b", "echo": True}, "suffix", "echo and suffix"),
        ({"prompt": [1, 2], "suffix": "b"}, "prompt", "a string where a suffix is given"),
        ({"prompt": "a", "best_of": 3}, "best_of", "best_of"),
        ({"prompt": "a", "logprobs": 6}, "logprobs", "between 0 and 5"),
        ({"prompt": "a", "logprobs": True}, "logprobs", "integer"),
        ({"prompt": "a", "response_format": "json"}, "response_format", "object"),
        ({"prompt": "a", "response_format": {"type": "regex"}}, "response_format", "'json_object'"),
    ],
)
def test_bad_completion_requests_name_their_field(body, param, words):
    with pytest.raises(RequestError) as caught:
        text_request(body)
    assert caught.value.status == 400 and caught.value.param == param and words in caught.value.message


@pytest.mark.parametrize("call, body, param", [
    (tokenize_request, {}, "prompt"),
    (tokenize_request, {"content": 5}, "content"),
    (tokenize_request, {"content": "a", "with_pieces": "yes"}, "with_pieces"),
    (tokenize_request, {"prompt": "a", "add_special_tokens": 1}, "add_special_tokens"),
    (tokenize_request, {"messages": []}, "messages"),
    (detokenize_request, {"tokens": "abc"}, "tokens"),
    (detokenize_request, {"tokens": [1, -2]}, "tokens"),
])  # fmt: skip
def test_bad_tokenize_requests_name_their_field(call, body, param):
    with pytest.raises(RequestError) as caught:
        call(body)
    assert caught.value.status == 400 and caught.value.param == param
