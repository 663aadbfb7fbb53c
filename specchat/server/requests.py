"""An OpenAI request body, checked field by field into what the engine is asked for.

Every problem is a `RequestError` naming the field, answered as OpenAI answers it (a 4xx and an `error` object),
before the request is queued. Fields the engine has no equivalent for are refused when they ask for something
(`best_of` > 1), and accepted at their neutral values, which many clients always send.
`response_format` runs JSON mode: `{"type": "json_object"}`, or `{"type": "json_schema", "json_schema": {"schema":
...}}` with a schema inside the subset `constraints/json_schema.py` holds a text to; `grammar` (llama-server's field)
holds it to a GBNF grammar, `structured_outputs` (vLLM's) to a choice, a regular expression, a schema or a grammar
(`regex` and `ebnf`: SGLang's). `tools` (functions), with
`tool_choice` and `parallel_tool_calls`, and the conversation's `tool` messages and assistant `tool_calls` go to the
model's chat template (`tool_calls.py`). Fields this server does not
know are ignored, as vLLM and llama-server do: clients add their own. Omitted sampling fields take the model's own
defaults, as `specchat run` does.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

from specchat.answer_format import AnswerFormat
from specchat.engine.budget import MAX_BUDGET
from specchat.engine.sampling_config import MAX_SEED
from specchat.fill_in_middle import Infill

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
MAX_STOPS = 16
MAX_CHOICES = 16  # a request's `n`: its answers are generated one after the other
MAX_CHAT_LOGPROBS, MAX_TEXT_LOGPROBS = 20, 5  # OpenAI's limits on the alternatives a token's log-probability lists
FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function's name
STRUCTURED = ("choice", "regex", "json", "grammar")  # vLLM's structured outputs
NATIVE_NAMES = {"n_predict": "max_tokens", "repeat_penalty": "repetition_penalty", "json_schema": "guided_json"}
FORMAT_FIELDS = {  # a request's fields that name one structured output: llama-server's, SGLang's, older vLLM's
    "grammar": "grammar", "regex": "regex", "ebnf": "grammar",
    "guided_choice": "choice", "guided_regex": "regex", "guided_json": "json", "guided_grammar": "grammar",
}  # fmt: skip


class RequestError(Exception):
    """A request the server will not run: its HTTP status, OpenAI's error type and the field at fault."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error", headers: dict[str, str] | None = None):  # fmt: skip
        super().__init__(message)
        self.message, self.param, self.status, self.kind = message, param, status, kind
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


@dataclass(frozen=True)
class CompletionRequest:
    """What one request asks for. Exactly one of `messages` (chat) and `prompt` (text or token ids) is set."""

    model: str | None
    messages: list[dict[str, str]] | None = None
    prompt: str | list[int] | None = None
    max_tokens: int | None = None  # None: until the end of the text or of the context
    sampling: dict = field(default_factory=dict)  # SamplingConfig fields the request sets
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    speculative: Speculative | None = None  # None: the server's drafter and budget
    format: AnswerFormat = AnswerFormat()  # JSON mode (response_format), a grammar, or free text
    logprobs: int | None = None  # each token's log-probability and this many alternatives; None: none
    tools: Tools | None = None  # functions the answer may call
    echo: bool = False  # a completion's text begins with its prompt (and its log-probabilities, when asked)
    infill: Infill | None = None  # code to fill in at a cursor (`suffix`, /infill): the model's FIM prompt
    reply: str = "openai"  # the answer's shape: "openai", "llama-server" (/completion, /infill), "ollama-chat" or
    # "ollama-generate" (ollama.py)
    choices: int = 1  # OpenAI's `n`: answers to the prompt, generated one after the other
    time_limit: float | None = None  # llama-server's t_max_predict_ms, in seconds: a line's end past it ends the answer
    indent: int = 0  # llama-server's n_indent: a later line indented less than this ends the answer; 0: none
    ignore_eos: bool = False  # the end of text is never chosen: the answer runs to max_tokens (benchmarks)
    min_tokens: int = 0  # vLLM's: tokens before the end of text or a stop string may end the answer


@dataclass(frozen=True)
class Tools:
    """The request's `tools` and how they may be called."""

    functions: list[dict]  # OpenAI's function objects: name, description, parameters, strict
    choice: str = "auto"  # "auto", "required" (a call first) or "none"
    parallel: bool = True  # several calls in one answer
    named: str | None = None  # the function a call must be of (tool_choice naming one)

    def template(self) -> list[dict]:
        """The tools as chat templates take them (OpenAI's shape)."""
        return [{"type": "function", "function": function} for function in self.functions]

    def callable(self) -> list[dict]:
        """The functions a call may be of."""
        return [function for function in self.functions if self.named in (None, function["name"])]


@dataclass(frozen=True)
class Speculative:
    """The request's `speculative` object: which drafter (the one the server loaded, or "none") and, optionally, a
    fixed draft budget instead of the adaptive one."""

    drafter: str | None = None  # None: the server's
    draft_budget: int | None = None  # None: adaptive (or the server's --draft-budget)


def chat_request(body: object) -> CompletionRequest:
    """`POST /v1/chat/completions`."""
    body = json_object(body)
    _refuse_unsupported(body)
    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
        raise RequestError("give max_tokens or max_completion_tokens, not both", param="max_completion_tokens")
    tools = _tools(body)
    common = _common(body)
    if tools is not None and not common["format"].free:
        other = _format_fields(body)[0]
        raise RequestError(f"{other} and tools together are not supported", param=other)
    if tools is not None and common["ignore_eos"]:
        raise RequestError("ignore_eos and tools together are not supported: a call must end", param="ignore_eos")
    return CompletionRequest(
        model=model_name(body),
        messages=_messages(body.get("messages")),
        max_tokens=_max_tokens(body, "max_completion_tokens") or _max_tokens(body, "max_tokens"),
        logprobs=_chat_logprobs(body),
        tools=tools,
        choices=_choices(body),
        **common,
    )


def text_request(body: object) -> CompletionRequest:
    """`POST /v1/completions`: the prompt is continued as text, without the chat template."""
    body = json_object(body)
    _refuse_unsupported(body)
    if body.get("tools"):
        raise RequestError("tools are for /v1/chat/completions", param="tools")
    echo = body.get("echo", False)
    if echo not in (True, False, None):
        raise RequestError("echo must be a boolean", param="echo")
    suffix = body.get("suffix")
    if suffix is not None and not isinstance(suffix, str):
        raise RequestError("suffix must be a string", param="suffix")
    if suffix is not None and echo:
        raise RequestError("echo and suffix together are not supported", param="suffix")
    if body.get("best_of") not in (None, 1):
        raise RequestError("best_of must be 1: one completion per request", param="best_of")
    max_tokens = _max_tokens(body, "max_tokens", least=0 if echo else 1)  # with echo, 0 scores the prompt alone
    prompt = _prompt(body.get("prompt"), text_only=suffix is not None)
    logprobs = _integer(body, "logprobs")
    if logprobs is not None and not 0 <= logprobs <= MAX_TEXT_LOGPROBS:
        raise RequestError(f"logprobs must be between 0 and {MAX_TEXT_LOGPROBS}", param="logprobs")
    return CompletionRequest(
        model=model_name(body),
        prompt=prompt,
        infill=None if suffix is None else Infill(prompt, suffix),
        max_tokens=16 if "max_tokens" not in body else max_tokens,  # OpenAI's default for completions
        logprobs=logprobs,
        echo=bool(echo),
        choices=_choices(body),
        **_common(body),
    )


def native_request(body: object, *, infill: bool) -> CompletionRequest:
    """`POST /completion` and `POST /infill`, llama-server's own: its names for OpenAI's fields (`n_predict`, where
    a negative number means no limit; `repeat_penalty`; a `seed` of -1, a random one; `json_schema`), and for
    /infill the code around the cursor: `input_prefix`, `input_suffix`, `input_extra` (other files: `filename`,
    `text`) and `prompt` (the middle's start, already typed). `t_max_predict_ms`: past this long after the first
    token, the answer ends as soon as a line of it has ended (an editor's completion arrives in time); `n_indent`: a
    later line indented less than this ends it (the code after the cursor's block). Fields without a meaning here
    are ignored, as llama-server ignores what it does not know."""
    body = json_object(body)
    renamed = {NATIVE_NAMES.get(key, key): value for key, value in body.items() if key not in ("prompt", "suffix")}
    if renamed.get("seed") == -1:
        del renamed["seed"]
    if isinstance(renamed.get("max_tokens"), int) and renamed["max_tokens"] < 0:
        del renamed["max_tokens"]
    if infill:
        typed = body.get("prompt", "")
        for name, value in (("input_prefix", body.get("input_prefix", "")),
                            ("input_suffix", body.get("input_suffix", "")), ("prompt", typed)):  # fmt: skip
            if not isinstance(value, str):
                raise RequestError(f"{name} must be a string", param=name)
        code = Infill(body.get("input_prefix", ""), body.get("input_suffix", ""), _files(body.get("input_extra")),
                      typed)  # fmt: skip
        prompt = code.prefix
    else:
        code, prompt = None, _prompt(body.get("prompt"))
    limit = _number(body, "t_max_predict_ms")
    if limit is not None and limit < 0:
        raise RequestError("t_max_predict_ms must be >= 0 (0: no limit)", param="t_max_predict_ms")
    indent = _integer(body, "n_indent") or 0
    if indent < 0:
        raise RequestError("n_indent must be >= 0 (0: no limit)", param="n_indent")
    return CompletionRequest(model=model_name(body), prompt=prompt, infill=code, reply="llama-server",
                             max_tokens=_max_tokens(renamed, "max_tokens"), time_limit=limit / 1e3 if limit else None,
                             indent=indent,
                             **_common(renamed))  # fmt: skip


def _files(value: object) -> tuple[tuple[str, str], ...]:
    """/infill's `input_extra`: other files, each `{"filename": ..., "text": ...}`."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(each, dict) and isinstance(each.get("text", ""), str)
                                              and isinstance(each.get("filename", ""), str) for each in value):
        raise RequestError("input_extra must be a list of {filename, text} objects", param="input_extra")
    return tuple((each.get("filename", "file"), each.get("text", "")) for each in value)


@dataclass(frozen=True)
class TokenizeRequest:
    """`POST /tokenize` in llama-server's shape (`content`, `add_special`, `with_pieces`) or vLLM's (`prompt` or
    `messages`, `add_special_tokens`, `return_token_strs`): the answer comes back in the shape asked in."""

    model: str | None
    text: str | None  # None: `messages`, through the chat template
    messages: list[dict] | None
    special: bool  # the tokenizer's special tokens added around a text (BOS)
    pieces: bool  # each token's text too
    llama: bool  # llama-server's shape


def tokenize_request(body: object) -> TokenizeRequest:
    body = json_object(body)
    llama = "content" in body
    name = "content" if llama else "prompt"
    messages = None if llama or "messages" not in body else _messages(body["messages"])
    text = body.get(name)
    if messages is None and not isinstance(text, str):
        raise RequestError(f"{name} must be a string" + ("" if llama else " (or give messages)"), param=name)
    flags = ("add_special", "with_pieces") if llama else ("add_special_tokens", "return_token_strs")
    special, pieces = (body.get(flag, flag == "add_special_tokens") for flag in flags)  # vLLM adds them by default
    for flag, value in zip(flags, (special, pieces)):
        if not isinstance(value, bool):
            raise RequestError(f"{flag} must be a boolean", param=flag)
    return TokenizeRequest(model_name(body), text if messages is None else None, messages, special, pieces, llama)


def detokenize_request(body: object) -> tuple[str | None, list[int]]:
    """`POST /detokenize`: the model named (or None) and the ids."""
    body = json_object(body)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                               for t in tokens):  # fmt: skip
        raise RequestError("tokens must be a list of token ids", param="tokens")
    return model_name(body), tokens


def _tools(body: dict) -> Tools | None:
    """`tools`, `tool_choice` and `parallel_tool_calls`; None where no tool may be called. A strict function's
    parameters must be inside the schema subset (they will be held to it); other functions' are held to what
    of them is inside it."""
    from specchat.constraints.json_schema import JsonSchema, SchemaError

    tools, choice = body.get("tools"), body.get("tool_choice")
    if not tools:
        if choice not in (None, "none", "auto"):
            raise RequestError("tool_choice needs tools", param="tool_choice")
        return None
    if not isinstance(tools, list):
        raise RequestError("tools must be a list", param="tools")
    functions = []
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        if json_object(tool, where).get("type") != "function":
            raise RequestError(f"{where}.type must be 'function'", param=f"{where}.type")
        function = json_object(tool.get("function"), f"{where}.function")
        name = function.get("name")
        if not isinstance(name, str) or not FUNCTION_NAME.fullmatch(name):
            raise RequestError(f"{where}.function.name must be 1-64 letters, digits, '_' or '-'",
                               param=f"{where}.function.name")  # fmt: skip
        if any(name == other["name"] for other in functions):
            raise RequestError(f"{where}: two tools are named {name!r}", param=f"{where}.function.name")
        parameters = function.get("parameters")
        if parameters is not None:
            json_object(parameters, f"{where}.function.parameters")
        if function.get("strict"):
            try:
                JsonSchema(parameters or {"type": "object", "properties": {}})
            except SchemaError as error:
                raise RequestError(f"{where}.function.parameters (strict): {error}",
                                   param=f"{where}.function.parameters") from None  # fmt: skip
        functions.append({key: function[key] for key in ("name", "description", "parameters", "strict")
                          if function.get(key) is not None})  # fmt: skip
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise RequestError("parallel_tool_calls must be a boolean", param="parallel_tool_calls")
    if choice in (None, "auto", "required", "none"):
        return Tools(functions, choice or "auto", parallel)
    named = json_object(choice, "tool_choice").get("function")
    name = named.get("name") if isinstance(named, dict) else None
    chosen = [function for function in functions if function["name"] == name]
    if choice.get("type") != "function" or not chosen:
        raise RequestError("tool_choice must be 'auto', 'required', 'none' or {\"type\": \"function\", \"function\": "
                           "{\"name\": NAME}} naming one of the tools", param="tool_choice")  # fmt: skip
    return Tools(functions, "required", parallel, chosen[0]["name"])


def _chat_logprobs(body: dict) -> int | None:
    """Chat's `logprobs` (a boolean) and `top_logprobs` (the alternatives, up to 20) as one count."""
    wanted = body.get("logprobs")
    if wanted not in (None, True, False):
        raise RequestError("logprobs must be a boolean", param="logprobs")
    top = _integer(body, "top_logprobs")
    if top is not None and not 0 <= top <= MAX_CHAT_LOGPROBS:
        raise RequestError(f"top_logprobs must be between 0 and {MAX_CHAT_LOGPROBS}", param="top_logprobs")
    if top and not wanted:
        raise RequestError("top_logprobs needs logprobs: true", param="top_logprobs")
    return (top or 0) if wanted else None


def _common(body: dict) -> dict:
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise RequestError("stream must be a boolean", param="stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise RequestError("stream_options is only allowed when stream is true", param="stream_options")
        include_usage = json_object(options, "stream_options").get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise RequestError("stream_options.include_usage must be a boolean", param="stream_options.include_usage")
    return {"sampling": _sampling(body), "stop": _stop(body.get("stop")), "stream": stream,
            "include_usage": include_usage, "speculative": _speculative(body.get("speculative")),
            "format": _answer_format(body), "ignore_eos": _ignore_eos(body),
            "min_tokens": _min_tokens(body)}  # fmt: skip


def _min_tokens(body: dict) -> int:
    """vLLM's `min_tokens` (SGLang's `min_new_tokens`), refused with a format or tools, whose text ends where it must,
    and above the answer's length limit."""
    name = "min_new_tokens" if "min_new_tokens" in body else "min_tokens"
    value = _integer(body, name) or 0
    if value < 0:
        raise RequestError(f"{name} must be >= 0", param=name)
    limit = next((body[key] for key in ("max_completion_tokens", "max_tokens") if _is_int(body.get(key))), None)
    if value and limit is not None and value > limit:
        raise RequestError(f"{name} ({value}) must be at most the answer's length limit ({limit})", param=name)
    held = [*_format_fields(body), *(["tools"] if body.get("tools") else [])]
    if value and held:
        raise RequestError(f"{name} and {held[0]} together are not supported: a held text ends where it must",
                           param=name)  # fmt: skip
    return value


def _ignore_eos(body: dict) -> bool:
    """vLLM's and llama-server's `ignore_eos` (the answer runs to its length limit), refused with a format, whose
    whole text must end."""
    value = body.get("ignore_eos", False)
    if value not in (True, False, None):
        raise RequestError("ignore_eos must be a boolean", param="ignore_eos")
    if value and _format_fields(body):
        raise RequestError(f"ignore_eos and {_format_fields(body)[0]} together are not supported: a held text must "
                           f"end", param="ignore_eos")  # fmt: skip
    return bool(value)


def _answer_format(body: dict) -> AnswerFormat:
    """What the answer is held to: `response_format` (OpenAI's), `structured_outputs` (vLLM's: `choice`, `regex`,
    `json` or `grammar`) or one of FORMAT_FIELDS (`grammar`: llama-server's GBNF; `regex`, `ebnf`: SGLang's), one
    of them, checked now."""
    asked = _format_fields(body)
    if len(asked) > 1:
        raise RequestError(f"give one of {', '.join(asked)}, not several", param=asked[1])
    if not asked:
        return AnswerFormat()
    name = asked[0]
    if name == "response_format":
        return _response_format(body[name])
    if name in FORMAT_FIELDS:
        return _structured(FORMAT_FIELDS[name], body[name], name)
    fields = {key: value for key, value in json_object(body[name], name).items() if value not in (None, False)}
    if len(fields) != 1 or next(iter(fields)) not in STRUCTURED:
        raise RequestError(f"{name} takes one of {', '.join(STRUCTURED)}", param=name)
    [(kind, value)] = fields.items()
    return _structured(kind, value, f"{name}.{kind}")


def _format_fields(body: dict) -> list[str]:
    """The fields of `body` that ask for a format (`response_format: {"type": "text"}`, which many clients send,
    asks for none)."""
    plain = isinstance(body.get("response_format"), dict) and body["response_format"].get("type") == "text"
    return [name for name in ("response_format", "structured_outputs", *FORMAT_FIELDS)
            if body.get(name) not in (None, "", {}) and not (name == "response_format" and plain)]  # fmt: skip


def _structured(kind: str, value: object, param: str) -> AnswerFormat:
    """vLLM's structured output `kind` ("choice", "regex", "json" or "grammar") held to `value`, checked."""
    from specchat.constraints import Grammar, GrammarError, JsonSchema, SchemaError

    if kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise RequestError(f"{param} must be a JSON Schema", param=param) from None
        try:
            JsonSchema(value)
        except SchemaError as error:
            raise RequestError(f"{param}: {error}", param=param) from None
        return AnswerFormat(json=True, schema=value)
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(each, str) and each for each in value):
            raise RequestError(f"{param} must be a list of non-empty strings", param=param)
        kind, value = "regex", "|".join(re.escape(each) for each in value)
    if not isinstance(value, str):
        raise RequestError(f"{param} must be a string", param=param)
    try:
        Grammar.from_regex(value) if kind == "regex" else Grammar.from_gbnf(value)
    except GrammarError as error:
        raise RequestError(f"{param}: {error}", param=param) from None
    return AnswerFormat(regex=value) if kind == "regex" else AnswerFormat(grammar=value)


def _response_format(value: object) -> AnswerFormat:
    """JSON mode as `response_format` asks for it (vLLM takes it on completions too), the schema checked now."""
    from specchat.constraints.json_schema import JsonSchema, SchemaError

    kind = None if value is None else json_object(value, "response_format").get("type")
    if kind in (None, "text"):
        return AnswerFormat()
    if kind == "json_object":
        return AnswerFormat(json=True)
    if kind != "json_schema":
        raise RequestError(f"response_format {kind!r} is not supported; 'text', 'json_object' or 'json_schema'",
                           param="response_format")  # fmt: skip
    schema = json_object(value.get("json_schema"), "response_format.json_schema").get("schema")
    try:
        JsonSchema(schema)
    except SchemaError as error:
        raise RequestError(f"response_format.json_schema: {error}", param="response_format") from None
    return AnswerFormat(json=True, schema=schema)


def _speculative(value: object) -> Speculative | None:
    if value is None:
        return None
    fields = json_object(value, "speculative")
    unknown = sorted(set(fields) - {"drafter", "draft_budget"})
    if unknown:
        raise RequestError(f"speculative has no field {unknown[0]!r} (drafter, draft_budget)",
                           param=f"speculative.{unknown[0]}")  # fmt: skip
    drafter = fields.get("drafter")
    if drafter is not None and (not isinstance(drafter, str) or not drafter):
        raise RequestError("speculative.drafter must be a drafter's name, or 'none'", param="speculative.drafter")
    budget = fields.get("draft_budget")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int)
                               or not 1 <= budget <= MAX_BUDGET):  # fmt: skip
        raise RequestError(f"speculative.draft_budget must be a whole number from 1 to {MAX_BUDGET}",
                           param="speculative.draft_budget")  # fmt: skip
    if drafter == "none" and budget is not None:
        raise RequestError("speculative.draft_budget needs a drafter, not 'none'", param="speculative.draft_budget")
    return Speculative(drafter, budget)


def _sampling(body: dict) -> dict:
    """SamplingConfig's fields from OpenAI's (the additive penalties and `logit_bias` too) and vLLM's (`top_k`, `min_p`,
    `repetition_penalty`)."""
    sampling = {}
    for name, key, low, high, low_open in (
        ("temperature", "temperature", 0.0, 2.0, False),
        ("top_p", "top_p", 0.0, 1.0, True),
        ("min_p", "min_p", 0.0, 1.0, False),
        ("penalty", "repetition_penalty", 0.0, 10.0, True),
        ("frequency_penalty", "frequency_penalty", -2.0, 2.0, False),
        ("presence_penalty", "presence_penalty", -2.0, 2.0, False),
    ):
        value = _number(body, key)
        if value is None:
            continue
        if not (low < value if low_open else low <= value) or value > high or (name == "min_p" and value == high):
            ends = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if name == 'min_p' else ']'}"
            raise RequestError(f"{key} must be in {ends}, not {value:g}", param=key)
        sampling[name] = value
    top_k = _integer(body, "top_k")
    if top_k is not None:
        if top_k < -1:
            raise RequestError("top_k must be -1 or 0 (off) or a positive number of tokens", param="top_k")
        sampling["top_k"] = max(top_k, 0)
    bias = body.get("logit_bias")
    if bias:
        if not isinstance(bias, dict) or not all(isinstance(key, str) and key.isdigit() and not isinstance(value, bool)
                                                 and isinstance(value, (int, float)) and -100 <= value <= 100
                                                 for key, value in bias.items()):  # fmt: skip
            raise RequestError("logit_bias maps token ids (as strings) to biases from -100 to 100", param="logit_bias")
        sampling["logit_bias"] = tuple(sorted((int(key), float(value)) for key, value in bias.items()))
    seed = _integer(body, "seed")
    if seed is not None:
        if not 0 <= seed <= MAX_SEED:
            raise RequestError(f"seed must be between 0 and {MAX_SEED}", param="seed")
        sampling["seed"] = seed
    return sampling


def _choices(body: dict) -> int:
    """OpenAI's `n`."""
    n = _integer(body, "n")
    if n is not None and not 1 <= n <= MAX_CHOICES:
        raise RequestError(f"n must be between 1 and {MAX_CHOICES}", param="n")
    return n or 1


def _refuse_unsupported(body: dict) -> None:
    """Fields that ask for what the engine does not do: a clear 400, unless they ask for nothing."""
    for name in ("functions", "function_call"):
        if body.get(name):
            raise RequestError(f"{name} is not supported; tools and tool_choice are", param=name)


def _messages(messages: object) -> list[dict]:
    """The conversation as chat templates take it: roles and text, with the assistant's `tool_calls` (arguments
    as objects, as templates write them) and each `tool` message's `tool_call_id`."""
    if messages is None:
        raise RequestError("messages is required", param="messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list", param="messages")
    checked = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        message = json_object(message, where)
        role = message.get("role")
        if role not in ROLES and role != "tool":
            raise RequestError(f"{where}.role must be one of {', '.join(ROLES)}, tool", param=f"{where}.role")
        calls = message.get("tool_calls") if role == "assistant" else None
        content = message.get("content")
        if calls and content is None:
            content = ""
        checked.append({"role": ROLES.get(role, role), "content": _content(content, f"{where}.content")})
        if calls:
            checked[-1]["tool_calls"] = _calls(calls, f"{where}.tool_calls")
        if role == "tool" and isinstance(message.get("tool_call_id"), str):
            checked[-1]["tool_call_id"] = message["tool_call_id"]
    if checked[-1]["role"] == "assistant":
        raise RequestError("the last message must be the user's, the system's or a tool's, not the assistant's",
                           param=f"messages[{len(checked) - 1}].role")  # fmt: skip
    return checked


def _calls(calls: object, where: str) -> list[dict]:
    """An assistant message's `tool_calls`, each one's arguments (JSON text) parsed."""
    if not isinstance(calls, list):
        raise RequestError(f"{where} must be a list", param=where)
    out = []
    for index, call in enumerate(calls):
        function = json_object(json_object(call, f"{where}[{index}]").get("function"), f"{where}[{index}].function")
        name, arguments = function.get("name"), function.get("arguments", "{}")
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            raise RequestError(f"{where}[{index}].function.arguments is not JSON",
                               param=f"{where}[{index}].function.arguments") from None  # fmt: skip
        if not isinstance(name, str) or not isinstance(arguments, dict):
            raise RequestError(f"{where}[{index}].function needs a name and arguments that are a JSON object",
                               param=f"{where}[{index}].function")  # fmt: skip
        out.append({"id": call.get("id"), "type": "function", "function": {"name": name, "arguments": arguments}})
    return out


def _content(content: object, where: str) -> str:
    """A message's text: a string, or a list of text parts (other parts, images, are refused)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for index, part in enumerate(content):
            part = json_object(part, f"{where}[{index}]")
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(f"{where}[{index}]: only text parts are supported", param=f"{where}[{index}]")
            texts.append(part["text"])
        return "".join(texts)
    raise RequestError(f"{where} must be a string or a list of text parts", param=where)


def _prompt(prompt: object, text_only: bool = False) -> str | list[int]:
    """One prompt: text, or token ids; a list of one of either. Several prompts are refused (one per request).
    `text_only`: the text before a suffix, which may be empty (a completion at a file's start)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if text_only:
        if not isinstance(prompt, str):
            raise RequestError("prompt must be a string where a suffix is given", param="prompt")
        return prompt
    if isinstance(prompt, str):
        if not prompt:
            raise RequestError("prompt is empty", param="prompt")
        return prompt
    if isinstance(prompt, list) and prompt and all(_is_int(token) for token in prompt):
        if min(prompt) < 0:
            raise RequestError("prompt token ids must be >= 0", param="prompt")
        return list(prompt)
    if prompt is None:
        raise RequestError("prompt is required", param="prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(each, (str, list)) for each in prompt):
        raise RequestError("one prompt per request", param="prompt")
    raise RequestError("prompt must be a string or a list of token ids", param="prompt")


def _stop(stop: object) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise RequestError("stop must be a string or a list of strings", param="stop")
    if len(stops) > MAX_STOPS:
        raise RequestError(f"stop takes at most {MAX_STOPS} strings", param="stop")
    return tuple(s for s in stops if s)


def model_name(body: dict) -> str | None:
    """The `model` a request names, or None."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError("model must be a string", param="model")
    return model


def _max_tokens(body: dict, name: str, least: int = 1) -> int | None:
    value = _integer(body, name)
    if value is not None and value < least:
        raise RequestError(f"{name} must be at least {least}, not {value}", param=name)
    return value


def json_object(value: object, where: str = "the request body") -> dict:
    """`value`, which must be a JSON object (`where`: what it is, named in the error)."""
    if not isinstance(value, dict):
        raise RequestError(f"{where} must be a JSON object", param=None if where == "the request body" else where)
    return value


def _number(body: dict, name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RequestError(f"{name} must be a number", param=name)
    return float(value)


def _integer(body: dict, name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not _is_int(value):
        raise RequestError(f"{name} must be an integer", param=name)
    return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
