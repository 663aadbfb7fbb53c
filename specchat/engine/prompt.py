"""Prompt text -> token ids, through the tokenizer's own chat template."""

from __future__ import annotations


def encode_prompt(tokenizer, prompt: str, *, system: str | None = None, raw: bool = False) -> list[int]:
    """Token ids for a single-turn prompt.

    Without `system` this is exactly `apply_chat_template([{"role": "user", "content": prompt}],
    add_generation_prompt=True)`; `raw` (or a tokenizer without a chat template) tokenizes the text as is.
    """
    if raw or not getattr(tokenizer, "chat_template", None):
        return tokenizer.encode(prompt)
    messages = [{"role": "user", "content": prompt}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return encode_chat(tokenizer, messages)


def encode_chat(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    """The conversation's ids, ready for the assistant's answer; `tools` (OpenAI's shape) go to the template."""
    encoded = render_chat(tokenizer, messages, tools=tools, tokenize=True)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def render_chat(tokenizer, messages: list[dict], *, tools: list[dict] | None = None, tokenize: bool = False,
                chat_template: str | None = None):  # fmt: skip
    """The chat template applied to `messages`, ready for the assistant's answer (its text, or with `tokenize` its
    ids). A template that refuses a system message (Gemma 2's raises an error) gets it at the head of the first user
    turn, as llama.cpp and ollama give it to such models."""
    from jinja2.exceptions import TemplateError

    def apply(conversation: list[dict]):
        return tokenizer.apply_chat_template(conversation, tools=tools, chat_template=chat_template,
                                             add_generation_prompt=True, tokenize=tokenize)  # fmt: skip

    try:
        return apply(messages)
    except TemplateError:
        if len(messages) < 2 or messages[0]["role"] != "system" or messages[1]["role"] != "user":
            raise
        first = {**messages[1], "content": f"{messages[0]['content']}\n\n{messages[1]['content']}"}
        return apply([first, *messages[2:]])
