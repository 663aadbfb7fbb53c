"""Fill in the middle: a code model's markers found by name, its prompt in prefix-suffix-middle order (other files
first, in the repository format where the model has one), the server's `suffix`, llama-server's `/infill` and
`/completion` (whole and streamed, in its own shape, cut by time or by indentation as editors ask), `run --suffix`,
and the bench's `fim` set; a model without markers is refused in one line."""

from __future__ import annotations

import copy
import dataclasses
import json

import openai
import pytest
from conftest import tiny_model
from test_cli import assert_one_line_error, specchat, specchat_in_process
from test_tool_calls import InProcessServer

from specchat.bench.prompts import infill_prompts, load_prompt_sets, prompt_ids
from specchat.engine.generate import Engine
from specchat.errors import SpecchatError
from specchat.fill_in_middle import Infill, fim_markers
from specchat.server.indent_cut import IndentCut

QWEN_MARKERS = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]
QWEN_REPOSITORY = ["<|repo_name|>", "<|file_sep|>"]


@pytest.fixture(scope="module")
def coder_tokenizer(hf_tokenizer):
    """The default model's tokenizer with Qwen 2.5 Coder's markers as special tokens."""
    coder = copy.deepcopy(hf_tokenizer)
    coder.add_special_tokens({"additional_special_tokens": QWEN_MARKERS + QWEN_REPOSITORY})
    return coder


@pytest.fixture(scope="module")
def coder_server(coder_tokenizer):
    engine = Engine(tiny_model("llama", vocab_size=len(coder_tokenizer), seed=1), coder_tokenizer, max_len=512)
    server = InProcessServer(engine, coder_tokenizer)
    yield server, engine
    server.close()


def _alone(engine: Engine, ids: list[int], n: int) -> str:
    tokens = [token for event in engine.generate(ids, max_new_tokens=n) for token in event.tokens]
    return engine.tokenizer.decode(tokens, skip_special_tokens=True)


def test_the_prompt_is_prefix_suffix_middle_between_the_markers(coder_tokenizer, tokenizer):
    markers = fim_markers(coder_tokenizer)
    assert [coder_tokenizer.convert_ids_to_tokens(i) for i in (markers.prefix, markers.suffix, markers.middle)] == \
        QWEN_MARKERS  # fmt: skip
    prefix, suffix = "def add(a, b):\n    ", "\n\nprint(add(1, 2))\n"
    ids = markers.prompt(coder_tokenizer, Infill(prefix, suffix))
    assert coder_tokenizer.decode(ids) == f"<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>"
    files = (("util.py", "def mul(a, b):\n    return a * b\n"),)
    ids = markers.prompt(coder_tokenizer, Infill(prefix, suffix, files, "return"))
    assert coder_tokenizer.decode(ids) == (f"<|repo_name|>project\n<|file_sep|>util.py\n{files[0][1]}<|file_sep|>"
                                           f"file\n<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>return")
    bare = dataclasses.replace(markers, repository=None, file=None)  # a model without the repository format
    assert coder_tokenizer.decode(bare.prompt(coder_tokenizer, Infill(prefix, suffix, files))).startswith(
        f"\n\n--- snippet ---\n\n{files[0][1]}<|fim_prefix|>")
    assert fim_markers(tokenizer) is None  # SmolLM2 has none


def test_the_server_fills_in_a_suffix_and_refuses_it_without_markers(coder_server, coder_tokenizer, tokenizer):
    server, engine = coder_server
    reply = server.client.completions.create(model="tiny", prompt="x = [1, 2", suffix="]\nprint(x)\n",
                                             max_tokens=12, temperature=0)  # fmt: skip
    ids = fim_markers(coder_tokenizer).prompt(coder_tokenizer, Infill("x = [1, 2", "]\nprint(x)\n"))
    assert reply.choices[0].text == _alone(engine, ids, 12)
    assert reply.usage.prompt_tokens == len(ids)
    plain = InProcessServer(Engine(tiny_model("llama", seed=1), tokenizer, max_len=512), tokenizer)
    try:
        with pytest.raises(openai.BadRequestError, match="no fill-in-the-middle tokens"):
            plain.client.completions.create(model="tiny", prompt="x = 1", suffix="\n", max_tokens=4)
    finally:
        plain.close()


def test_llama_server_s_infill_and_completion_whole_and_streamed(coder_server, coder_tokenizer):
    """/infill as llama.vscode sends it (other files, the middle's start, n_predict, llama-server's sampling names),
    answered in llama-server's shape; /completion alike; a stream's events add up to the whole answer; past
    `t_max_predict_ms`, an answer ends once a line has ended."""
    server, engine = coder_server
    body = {"input_prefix": "def area(r):\n    ", "input_suffix": "\n\nprint(area(2))\n", "prompt": "return",
            "input_extra": [{"filename": "consts.py", "text": "PI = 3.14159\n"}], "n_predict": 10, "top_k": 40,
            "top_p": 0.99, "temperature": 0, "seed": -1, "cache_prompt": True, "samplers": ["top_k", "top_p"]}
    whole = server.http.post("/infill", json=body).json()
    code = Infill(body["input_prefix"], body["input_suffix"], (("consts.py", "PI = 3.14159\n"),), "return")
    ids = fim_markers(coder_tokenizer).prompt(coder_tokenizer, code)
    assert whole["content"] == _alone(engine, ids, 10) and whole["stop"] is True
    assert whole["tokens_predicted"] == 10 and whole["tokens_evaluated"] == len(ids) and whole["stop_type"] == "limit"
    assert whole["timings"]["predicted_n"] == 10
    with server.http.stream("POST", "/infill", json=body | {"stream": True}) as response:
        events = [json.loads(line[len("data: ") :]) for line in response.iter_lines() if line.startswith("data: ")]
    assert "".join(event["content"] for event in events) == whole["content"]
    assert [event["stop"] for event in events] == [False] * (len(events) - 1) + [True] and "timings" in events[-1]
    text = server.http.post("/completion", json={"prompt": "x = ", "n_predict": 6, "temperature": 0}).json()
    assert text["content"] == _alone(engine, coder_tokenizer.encode("x = "), 6)
    refused = server.http.post("/infill", json={"input_prefix": 5})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "input_prefix"
    lines = {"prompt": "x", "n_predict": 30, "grammar": 'root ::= ("y\\n"){40}'}  # no end before 40 lines
    assert server.http.post("/completion", json=lines).json()["tokens_predicted"] == 30
    timed = server.http.post("/completion", json=lines | {"t_max_predict_ms": 1}).json()  # llama.vscode's time limit
    assert timed["tokens_predicted"] < 30 and timed["stop_type"] == "limit" and "\n" in timed["content"]
    nested = {"prompt": "x", "n_predict": 30, "temperature": 0, "grammar": 'root ::= "a\\n    b\\n  c\\nd\\n"'}
    assert server.http.post("/completion", json=nested).json()["content"] == "a\n    b\n  c\nd\n"
    cut = server.http.post("/completion", json=nested | {"n_indent": 4}).json()  # llama.vscode's cursor column
    assert cut["content"] == "a\n    b\n  " and cut["stop_type"] == "limit"
    with server.http.stream("POST", "/completion", json=nested | {"n_indent": 4, "stream": True}) as response:
        events = [json.loads(line[len("data: ") :]) for line in response.iter_lines() if line.startswith("data: ")]
    assert "".join(event["content"] for event in events) == cut["content"] and events[-1]["stop_type"] == "limit"


def test_an_indentation_cut_ends_at_the_first_later_line_left_of_the_cursor():
    text = "x = 1\n    if x:\n\n        y()\n  \tz()\nw\n"
    for indent, kept in ((0, text), (2, text[: -len("w\n")]), (4, "x = 1\n    if x:\n\n        y()\n  \t"),
                         (5, "x = 1\n    ")):  # fmt: skip
        for size in (1, 3, len(text)):
            cut, out, ended = IndentCut(indent), "", False
            for at in range(0, len(text), size):
                piece, ended = cut.feed(text[at : at + size])
                out += piece
                if ended:
                    break
            assert (out, ended) == (kept, kept != text), (indent, size)


def test_the_fim_set_cuts_holes_in_the_standard_library(coder_tokenizer, tokenizer, tmp_path):
    holes = infill_prompts()
    assert len(holes) == 4 and all(hole.prefix.strip() and hole.suffix.strip() for hole in holes)
    assert prompt_ids(coder_tokenizer, holes[0])[-1] == fim_markers(coder_tokenizer).middle
    with pytest.raises(SpecchatError, match="no fill-in-the-middle tokens"):
        prompt_ids(tokenizer, holes[0])
    lines = tmp_path / "holes.jsonl"
    lines.write_text(json.dumps({"prompt": "def f(", "suffix": "):\n"}) + "\n" + json.dumps({"prompt": "Hi"}) + "\n")
    assert load_prompt_sets([], lines) == {"holes": [Infill("def f(", "):\n"), "Hi"]}


def test_run_suffix_needs_a_code_model(monkeypatch, capfd):
    assert_one_line_error(specchat_in_process(monkeypatch, capfd, "run", "x = ", "--suffix", "\n", "--system", "s"),
                          "--suffix fills in code without a chat template")  # fmt: skip
    assert_one_line_error(specchat("run", "x = ", "--suffix", "\n", "-n", "4", warm=True),
                          "smollm2-135m has no fill-in-the-middle tokens")  # fmt: skip
