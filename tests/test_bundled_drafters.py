"""The drafters shipped for the default model load from its profile and keep its output.

Proven here, in fp32 on the real model: `--drafter longspec` and `longspec+ngram` (the profile's bundled
checkpoint, no path given) decode token for token what transformers' greedy `generate` decodes, while the
draft's tokens are accepted (the composite may leave the model out while it does not pay).
"""

from __future__ import annotations

import functools

import pytest
from test_speculative import hf_greedy, run

from specchat.drafters import build_drafter, parse_drafter, resolve_drafter
from specchat.engine.generate import Engine
from specchat.engine.prompt import encode_prompt

PROMPT = "Explain in a few sentences why the sky is blue."


@functools.cache
def greedy_reference(model, prompt: tuple[int, ...]) -> list[int]:
    """transformers' greedy continuation, computed once for both drafters (the model is read only)."""
    return hf_greedy(model, list(prompt), 64)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["longspec", "longspec+ngram"])
def test_the_bundled_drafter_keeps_the_output(default_model, name):
    model, tokenizer = default_model.model, default_model.tokenizer
    prompt = encode_prompt(tokenizer, PROMPT)
    expected = greedy_reference(model, tuple(prompt))
    engine = Engine(model, tokenizer, max_len=len(prompt) + 64)
    choice = resolve_drafter(parse_drafter(name), default_model.source.profile, default_model.source.name)
    engine.set_drafter(build_drafter(choice, engine.target), 7)
    out, events = run(engine, prompt, 64)
    assert out == expected[: len(out)] and len(out) == len(expected)
    assert events[-1].stats.accepted > 0
    if name == "longspec":  # a composite may leave the model out where it does not pay
        assert any("longspec" in event.origins for event in events)
