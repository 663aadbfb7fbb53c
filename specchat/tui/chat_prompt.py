"""Token ids for a chat's next turn that extend, token for token, what the engine already holds.

The engine reuses cached KV up to the first token where a new prompt differs from its committed ids. Encoding
the conversation's text afresh would not always give back the tokens the model generated (a BPE tokenizer
spells one text many ways), so earlier answers would be prefilled again. Instead the next prompt is the
previous prompt's ids, the answer's own ids, then the chat template's text after the answer, encoded alone.
When the template does not render the previous turn verbatim (it trims or rewrites content), the whole
conversation is encoded afresh, which is still correct, only slower.
"""

from __future__ import annotations

from dataclasses import dataclass

from specchat.engine.prompt import encode_chat, render_chat
from specchat.tui.transcript import Message


@dataclass(frozen=True)
class ChatPrompt:
    ids: list[int]  # what the engine is asked to continue
    text: str  # the chat template's rendering of the same messages
    messages: int  # how many template messages (system included) it renders


def chat_messages(system: str | None, messages: list[Message]) -> list[dict[str, str]]:
    head = [{"role": "system", "content": system}] if system is not None else []
    return head + [{"role": m.role, "content": m.text} for m in messages]


def next_prompt(tokenizer, turns: list[dict[str, str]], answer: Message | None, previous: ChatPrompt | None,
                eos_ids: frozenset[int]) -> ChatPrompt:  # fmt: skip
    """The prompt for `turns` (ending with the new user message).

    Args:
        turns: template messages, system included.
        answer: the assistant message that followed `previous` (the second to last of `turns`), if any.
        previous: the prompt the last answer continued, if the conversation has not changed since.
        eos_ids: ids that end an answer; one closing `answer` stands for the template's end-of-turn text.
    """
    text = render_chat(tokenizer, turns)
    if previous is not None and answer is not None and len(turns) == previous.messages + 2:
        head = previous.text + answer.text
        if text.startswith(head):
            ids, tail = previous.ids + answer.token_ids, text[len(head) :]
            if answer.token_ids and answer.token_ids[-1] in eos_ids:
                eos_text = tokenizer.decode(answer.token_ids[-1:])
                if tail.startswith(eos_text):
                    tail = tail[len(eos_text) :]
                else:  # the template closes turns with other text: it follows the answer instead of EOS
                    ids = ids[:-1]
            return ChatPrompt(ids + tokenizer.encode(tail, add_special_tokens=False), text, len(turns))
    return ChatPrompt(encode_chat(tokenizer, turns), text, len(turns))
