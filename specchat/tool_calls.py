"""Tool calls (OpenAI's `tools`): which chat templates take them, the schema a call is held to, and an answer read
back into its text and its calls.

specchat reads the two conventions templates use. Qwen 2.5 / 3's and Hermes' list the tools in the prompt and have the
model write each call as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, each tag one token of its
vocabulary (several calls, text around them). Llama 3.x's have the whole answer be one call, `{"name": ...,
"parameters": {...}}`. While a call is written it is held to the schema of its tool's parameters
(`constraints/tool_call_text.py`), so a closed call always parses and names a tool.
"""

from __future__ import annotations

import json
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"
LLAMA_INSTRUCTION = '{"name": function name, "parameters"'  # how Llama 3.x's templates ask for a call


@dataclass(frozen=True)
class ToolFormat:
    """How a model's template has it write a call: between two tags (their ids), or as the whole answer (no tags);
    and the key the arguments go under."""

    arguments: str = "arguments"
    open_id: int | None = None
    close_id: int | None = None

    @property
    def tagged(self) -> bool:
        return self.open_id is not None


def tool_format(tokenizer) -> ToolFormat | None:
    """The call format of the tokenizer's chat template: Hermes' tags where the template uses them and the
    vocabulary has each as one token, Llama 3.x's whole-answer calls where the template asks for them; else None
    (the model cannot be asked for calls)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if not isinstance(template, str) or "tools" not in template:
        return None
    if LLAMA_INSTRUCTION in template:
        return ToolFormat("parameters")
    if OPEN_TAG not in template:
        return None
    ids = [tokenizer.convert_tokens_to_ids(tag) for tag in (OPEN_TAG, CLOSE_TAG)]
    special = set(tokenizer.all_special_ids)  # a special tag would be dropped from the answer's text
    if any(not isinstance(each, int) or each == tokenizer.unk_token_id or each in special for each in ids):
        return None
    return ToolFormat("arguments", *ids)


def call_schema(functions: list[dict], arguments: str = "arguments") -> dict:
    """The JSON Schema of one call of `functions` (OpenAI's function objects): `name` one of theirs, then under
    `arguments` what that function's parameters allow (none given: no arguments). Each function's `$defs` and
    `definitions` move to the top, under names of their own, with its references."""
    defs, calls, key = {}, [], arguments
    for index, function in enumerate(functions):
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        for table in ("$defs", "definitions"):
            for name, schema in (parameters.get(table) or {}).items():
                defs[f"{index}.{name}"] = _rebased(schema, index)
        arguments = _rebased({k: v for k, v in parameters.items() if k not in ("$defs", "definitions")}, index)
        calls.append({"type": "object", "required": ["name", key],
                      "properties": {"name": {"const": function["name"]}, key: arguments}})  # fmt: skip
    return {"anyOf": calls, "$defs": defs} if defs else {"anyOf": calls}


def _rebased(schema: object, index: int) -> object:
    """`schema` with its references into `$defs` / `definitions` renamed as `call_schema` moves them."""
    if isinstance(schema, list):
        return [_rebased(each, index) for each in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _rebased(value, index) for key, value in schema.items()}
    ref = schema.get("$ref")
    for prefix in ("#/$defs/", "#/definitions/"):
        if isinstance(ref, str) and ref.startswith(prefix):
            out["$ref"] = f"#/$defs/{index}.{ref[len(prefix) :]}"
    return out


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object's text, as OpenAI sends arguments
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")


def call_reader(form: ToolFormat) -> CallReader:
    """A reader of an answer in `form`."""
    return TaggedCalls(form.arguments) if form.tagged else WholeAnswerCall(form.arguments)


class CallReader(ABC):
    """Reads an answer as it arrives: `feed(text)` and, once it has ended, `finish()`, each the text outside calls
    that is now certain and the calls read; `calls`, every call so far."""

    calls: list[ToolCall]

    @abstractmethod
    def feed(self, text: str) -> tuple[str, list[ToolCall]]: ...

    @abstractmethod
    def finish(self) -> tuple[str, list[ToolCall]]: ...

    def read(self, text: str, ended: bool) -> tuple[str, list[ToolCall]]:
        """`feed(text)`, then where the answer `ended`, `finish()`: the text and calls of both."""
        out, calls = self.feed(text)
        if ended:
            rest, last = self.finish()
            out, calls = out + rest, calls + last
        return out, calls


class TaggedCalls(CallReader):
    """Calls between tags, read as the text arrives: a call when its closing tag arrives; text that may be the
    start of a tag waits for what follows it, and blanks for what follows them (blanks between calls are not
    text)."""

    def __init__(self, arguments: str = "arguments"):
        self.arguments = arguments
        self.calls: list[ToolCall] = []
        self._pending = ""  # text not handed out yet
        self._in_call = False

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self._pending += text
        out, calls = [], []
        while True:
            tag = CLOSE_TAG if self._in_call else OPEN_TAG
            at = self._pending.find(tag)
            if at < 0:
                break
            before, self._pending = self._pending[:at], self._pending[at + len(tag) :]
            if not self._in_call:
                out.append(before)
            elif call := _parsed(before, self.arguments):
                calls.append(call)
            else:  # not a call after all (tags written as plain text, outside any constraint): text
                out.append(OPEN_TAG + before + CLOSE_TAG)
            self._in_call = not self._in_call
        if not self._in_call:
            keep = next((n for n in range(len(OPEN_TAG) - 1, 0, -1) if self._pending.endswith(OPEN_TAG[:n])), 0)
            keep = max(keep, len(self._pending) - len(self._pending.rstrip()))
            out.append(self._pending[: len(self._pending) - keep])
            self._pending = self._pending[len(self._pending) - keep :]
        self.calls += calls
        return "".join(out), calls

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The rest: a call left open (a length limit cut it) with its tag, or blanks, which are text only where no
        call was made."""
        rest, self._pending = (OPEN_TAG if self._in_call else "") + self._pending, ""
        return ("" if self.calls and not rest.strip() else rest), []


class WholeAnswerCall(CallReader):
    """An answer that is one call or text: one that opens with `{` is held back, and is a call if the whole of it
    parses as one; any other is text, handed out as it arrives."""

    def __init__(self, arguments: str = "parameters"):
        self.arguments = arguments
        self.calls: list[ToolCall] = []
        self._pending = ""
        self._text: bool | None = None  # undecided until the answer's first non-blank character

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self._pending += text
        if self._text is None and self._pending.strip():
            self._text = not self._pending.lstrip().startswith("{")
        if not self._text:
            return "", []
        out, self._pending = self._pending, ""
        return out, []

    def finish(self) -> tuple[str, list[ToolCall]]:
        rest, self._pending = self._pending, ""
        call = None if self._text else _parsed(rest, self.arguments)
        if call is None:
            return rest, []
        self.calls.append(call)
        return "", [call]


def _parsed(text: str, arguments: str) -> ToolCall | None:
    """The call `text` holds (its JSON was held to the calls' schema as it was written), or None."""
    try:
        call = json.loads(text)
        return ToolCall(call["name"], json.dumps(call[arguments], ensure_ascii=False))
    except (ValueError, TypeError, KeyError):
        return None
