"""Prompt text -> token ids, through the tokenizer's own chat template."""

from __future__ import annotations


def encode_prompt(tokenizer, prompt: str, *, system: str | None = None, raw: bool = False) -> list[int]:
    """Token ids for a single-turn prompt.

    Without `system` this is exactly `apply_chat_template([{"role": "user", "content": prompt}],
    add_generation_prompt=True)`; `raw` (or a tokenizer without a chat template) tokenizes the text as is.
    """
    if raw or not getattr(tokenizer, "chat_template", None):
        return tokenizer(prompt)["input_ids"]
    messages = [{"role": "user", "content": prompt}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return encode_chat(tokenizer, messages)


def encode_chat(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    """The conversation's ids, ready for the assistant's answer; `tools` (OpenAI's shape) go to the template."""
    encoded = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
