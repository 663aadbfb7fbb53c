"""Fill in the middle: a code model's markers found by name, its prompt in prefix-suffix-middle order, the server's
`suffix` and `run --suffix`, and the bench's `fim` set; a model without markers is refused in one line."""

from __future__ import annotations

import copy
import json

import openai
import pytest
from conftest import tiny_model
from test_cli import assert_one_line_error, specchat, specchat_in_process
from test_tool_calls import InProcessServer

from specchat.bench.prompts import Infill, infill_prompts, load_prompt_sets, prompt_ids
from specchat.engine.generate import Engine
from specchat.errors import SpecchatError
from specchat.fill_in_middle import fim_markers

QWEN_MARKERS = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]


@pytest.fixture(scope="module")
def coder_tokenizer(tokenizer):
    """The default model's tokenizer with Qwen 2.5 Coder's markers as special tokens."""
    coder = copy.deepcopy(tokenizer)
    coder.add_special_tokens({"additional_special_tokens": QWEN_MARKERS})
    return coder


def test_the_prompt_is_prefix_suffix_middle_between_the_markers(coder_tokenizer, tokenizer):
    markers = fim_markers(coder_tokenizer)
    assert [coder_tokenizer.convert_ids_to_tokens(i) for i in (markers.prefix, markers.suffix, markers.middle)] == \
        QWEN_MARKERS  # fmt: skip
    prefix, suffix = "def add(a, b):\n    ", "\n\nprint(add(1, 2))\n"
    ids = markers.prompt(coder_tokenizer, prefix, suffix)
    assert coder_tokenizer.decode(ids) == f"<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>"
    assert ids[0] == markers.prefix and ids[-1] == markers.middle
    assert fim_markers(tokenizer) is None  # SmolLM2 has none


def test_the_server_fills_in_a_suffix_and_refuses_it_without_markers(coder_tokenizer, tokenizer):
    engine = Engine(tiny_model("llama", vocab_size=len(coder_tokenizer), seed=1), coder_tokenizer, max_len=512)
    server = InProcessServer(engine, coder_tokenizer)
    try:
        reply = server.client.completions.create(model="tiny", prompt="x = [1, 2", suffix="]\nprint(x)\n",
                                                 max_tokens=12, temperature=0)  # fmt: skip
        ids = fim_markers(coder_tokenizer).prompt(coder_tokenizer, "x = [1, 2", "]\nprint(x)\n")
        alone = [token for event in engine.generate(ids, max_new_tokens=12) for token in event.tokens]
        assert reply.choices[0].text == coder_tokenizer.decode(alone, skip_special_tokens=True)
        assert reply.usage.prompt_tokens == len(ids)
    finally:
        server.close()
    plain = InProcessServer(Engine(tiny_model("llama", seed=1), tokenizer, max_len=512), tokenizer)
    try:
        with pytest.raises(openai.BadRequestError, match="no fill-in-the-middle tokens"):
            plain.client.completions.create(model="tiny", prompt="x = 1", suffix="\n", max_tokens=4)
    finally:
        plain.close()


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
