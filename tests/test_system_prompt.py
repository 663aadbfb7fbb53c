"""A system prompt for a model whose chat template refuses one (Gemma 2's raises "System role not supported"): it
goes at the head of the first user turn, as llama.cpp and ollama give it to such models, in a one-shot prompt, a
`--chat-template` file's check and the chat app's turns; a template that takes a system turn keeps it."""

from __future__ import annotations

import copy

import pytest
from jinja2.exceptions import TemplateError

from specchat.chat_template import use_chat_template
from specchat.engine.prompt import encode_prompt, render_chat
from specchat.tui.chat_prompt import next_prompt

GEMMA2 = (  # Gemma 2's template, as its tokenizer_config.json holds it
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)


@pytest.fixture(scope="module")
def gemma_tokenizer(tokenizer):
    gemma = copy.deepcopy(tokenizer)
    use_chat_template(gemma, GEMMA2, "gemma2.jinja")  # refused before: the check renders a system turn
    return gemma


def test_a_refused_system_prompt_heads_the_first_user_turn(gemma_tokenizer):
    assert encode_prompt(gemma_tokenizer, "Hi", system="Be brief.") == encode_prompt(gemma_tokenizer, "Be brief.\n\nHi")
    text = render_chat(gemma_tokenizer, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert text.endswith("<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n")


def test_a_template_that_takes_a_system_turn_keeps_it(tokenizer):
    text = render_chat(tokenizer, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert "<|im_start|>system\nBe brief.<|im_end|>" in text and "Be brief.\n\nHi" not in text


def test_the_templates_other_errors_still_stand(gemma_tokenizer):
    with pytest.raises(TemplateError, match="alternate"):
        render_chat(gemma_tokenizer, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def test_a_chat_keeps_the_system_prompt_in_every_turn(gemma_tokenizer):
    turns = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    first = next_prompt(gemma_tokenizer, turns, None, None, frozenset())
    later = turns + [{"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]
    second = next_prompt(gemma_tokenizer, later, None, None, frozenset())
    assert "Be brief.\n\nHi" in first.text
    assert second.text.startswith(first.text[: first.text.index("<start_of_turn>model")])
