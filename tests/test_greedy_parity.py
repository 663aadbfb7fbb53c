"""Greedy decoding equals transformers' `generate(do_sample=False)` token for token in fp32."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_FAMILIES, tiny_model

from specchat.engine.generate import Engine
from specchat.engine.prompt import encode_prompt
from specchat.engine.sampling import SamplingConfig

PROMPTS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain step by step how a bill becomes a law in the United States.",
    "List ten fruits and describe the taste of each one.",
)


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=n, pad_token_id=model.config.pad_token_id
        )
    return out[0, len(prompt) :].tolist()


def ours(model, tokenizer, prompt: list[int], n: int) -> list[int]:
    engine = Engine(model, tokenizer, max_len=len(prompt) + n)
    events = engine.generate(prompt, sampling=SamplingConfig(temperature=0.0), max_new_tokens=n)
    return [t for event in events for t in event.tokens]


@pytest.mark.parametrize("family", TINY_FAMILIES)
@pytest.mark.parametrize("prompt_len", [1, 7, 40])
def test_tiny_models_match_generate(family, prompt_len, tokenizer):
    model = tiny_model(family, seed=prompt_len)
    prompt = torch.randint(3, 49152, (prompt_len,), generator=torch.Generator().manual_seed(prompt_len)).tolist()
    expected = hf_greedy(model, prompt, 64)
    assert len(expected) == 64
    assert ours(model, tokenizer, prompt, 64) == expected


@pytest.mark.slow
@pytest.mark.parametrize("prompt", PROMPTS)
def test_default_model_matches_generate(prompt, default_model):
    model, tokenizer = default_model.model, default_model.tokenizer
    ids = encode_prompt(tokenizer, prompt)
    expected = hf_greedy(model, ids, 32)  # 64 tokens cost twice the time and proved the same on these prompts
    assert len(expected) == 32
    assert ours(model, tokenizer, ids, 32) == expected


def test_chat_template_is_applied_exactly(tokenizer, hf_tokenizer):
    prompt = "What is the capital of France?"
    expected = hf_tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
    assert encode_prompt(tokenizer, prompt) == list(expected["input_ids"])
    assert encode_prompt(tokenizer, prompt, raw=True) == tokenizer.encode(prompt)
    with_system = encode_prompt(tokenizer, prompt, system="Answer in French.")
    assert tokenizer.decode(with_system).count("Answer in French.") == 1


@pytest.mark.slow
def test_default_model_answers_coherently(default_model):
    model, tokenizer = default_model.model, default_model.tokenizer
    ids = encode_prompt(tokenizer, "What is the capital of France?")
    text = tokenizer.decode(ours(model, tokenizer, ids, 20), skip_special_tokens=True)
    assert "Paris" in text
