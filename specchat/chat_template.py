"""A chat template given in a file (`--chat-template`, llama.cpp's `--chat-template-file`): for a model whose own
template is missing, wrong, or does not list tools. Read before anything loads, and put in place of the model's own
only once it renders a conversation, so a bad file is one line, not a failed first request."""

from __future__ import annotations

from pathlib import Path

from specchat.errors import SpecchatError


def read_chat_template(path: Path) -> str:
    try:
        template = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = "not UTF-8 text" if isinstance(error, UnicodeDecodeError) else error.strerror or str(error)
        raise SpecchatError(f"--chat-template {path}: {reason}") from None
    if not template.strip():
        raise SpecchatError(f"--chat-template {path}: the file is empty")
    return template


def use_chat_template(tokenizer, template: str, name: str) -> None:
    """Make `template` the tokenizer's chat template once it renders a short conversation (`name`: its file)."""
    from specchat.engine.prompt import render_chat

    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    try:
        render_chat(tokenizer, conversation, chat_template=template)
    except Exception as error:  # Jinja's syntax and runtime errors, the template's own raise_exception
        reason = " ".join(str(error).split()) or type(error).__name__
        raise SpecchatError(f"--chat-template {name} does not render a conversation: {reason}") from None
    tokenizer.chat_template = template
