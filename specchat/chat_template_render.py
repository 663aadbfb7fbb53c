"""Chat templates rendered as the Hugging Face tokenizers render them: the Jinja sandbox with the same options,
filters and globals, and the conversation given to it in the same shape, so that a template written for
`apply_chat_template` produces the same text here without importing transformers (about a second of every launch).
"""

from __future__ import annotations

import functools
import json
from datetime import datetime

REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # the names a message's reasoning comes under


def render_chat_template(template: str, messages: list[dict], *, tools: list[dict] | None = None,
                         add_generation_prompt: bool = False, special_tokens: dict | None = None) -> str:  # fmt: skip
    """`template` applied to `messages` (keys whose value is None dropped, reasoning under each of its names), with
    `tools` (JSON schemas) and the tokenizer's named special tokens (`bos_token`, ...) in scope."""
    return _compiled(template).render(messages=[_message(message) for message in messages], tools=tools,
                                      documents=None, add_generation_prompt=add_generation_prompt,
                                      **(special_tokens or {}))  # fmt: skip


def _message(message: dict) -> dict:
    message = {key: value for key, value in message.items() if value is not None}
    reasoning = next((message[key] for key in REASONING_FIELDS if key in message), None)
    if reasoning is not None:  # templates read `reasoning_content`, gpt-oss's `thinking`
        message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
    return message


@functools.lru_cache(maxsize=16)
def _compiled(template: str):
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """`{% generation %}...{% endgeneration %}` marks an assistant's tokens for training masks: its body, as is."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class Namespace(jinja2.utils.Namespace):
        """A namespace that refuses underscore-prefixed names (a way out of the sandbox)."""

        def __init__(*args, **kwargs):
            self, values = args[0], dict(*args[1:], **kwargs)
            for name in values:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, values)

        def __setitem__(self, name, value):
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a chat template cannot set {name!r} on a namespace")

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[Generation, loopcontrols])  # fmt: skip
    environment.filters["tojson"] = tojson  # not Jinja's own, which escapes HTML
    environment.globals.update(raise_exception=raise_exception, namespace=Namespace, dict=_Dict(),
                               strftime_now=lambda spec: datetime.now().strftime(spec))  # fmt: skip
    return environment.from_string(template)


class _Dict:
    """`dict(...)` in a template, without the type itself (whose attributes reach out of the sandbox)."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)
