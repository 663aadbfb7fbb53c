"""Ollama's API (`/api/chat`, `/api/generate`, `/api/tags`, `/api/show`, `/api/ps`, `/api/version`; its embeddings in
`embeddings.py`), so that the clients and apps written for an Ollama server talk to this one.

A request is read into OpenAI's names and checked as the OpenAI routes check theirs (`requests.py`): `options`
(`num_predict`, `temperature`, `top_k`, `top_p`, `min_p`, `seed`, `stop`, `repeat_penalty`, the additive penalties),
`format` ("json" or a JSON Schema), `tools`, `logprobs` / `top_logprobs`; `/api/generate`'s prompt goes through the
chat template after its `system`, unless `raw`, and with a `suffix` it is code to fill in. Streaming is Ollama's
default: one JSON object a line, the last one `done` with the counts and durations (nanoseconds). Errors are
Ollama's `{"error": "..."}`. Options with no meaning here (`num_ctx`, `num_thread`, `keep_alive`, ...) are ignored,
as Ollama ignores what a model does not use; images and thinking are refused.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from datetime import UTC, datetime

from specchat.bench.bandwidth import weight_bytes
from specchat.engine.stats import GenerationStats
from specchat.server.requests import CompletionRequest, RequestError, chat_request, text_request
from specchat.server.responses import Reply

OPTIONS = {  # Ollama's option -> OpenAI's (or vLLM's) field
    "num_predict": "max_tokens", "temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
    "seed": "seed", "stop": "stop", "repeat_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}  # fmt: skip
RENAMED = {"max_tokens": "num_predict", "repetition_penalty": "repeat_penalty", "response_format": "format"}
DONE = {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}  # the engine's -> Ollama's


def ollama_request(body: object, *, chat: bool) -> CompletionRequest:
    """`POST /api/chat` (`chat`) or `POST /api/generate`, as the request the OpenAI routes would have made of it;
    a field at fault is named as Ollama names it."""
    try:
        return replace(_read(body, chat), reply="ollama-chat" if chat else "ollama-generate")
    except RequestError as error:
        for ours, theirs in RENAMED.items():
            if error.param == ours:
                error.param, error.message = theirs, error.message.replace(ours, theirs)
        raise


def _read(body: object, chat: bool) -> CompletionRequest:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    options = {} if body.get("options") is None else body["options"]
    if not isinstance(options, dict):
        raise RequestError("options must be a JSON object", param="options")
    if body.get("images"):
        raise RequestError("images are not supported: this server's models read text only", param="images")
    if body.get("think"):
        raise RequestError("think is not supported: this server's models answer without a reasoning trace",
                           param="think")  # fmt: skip
    if body.get("template"):
        raise RequestError("template is not supported: the model's own chat template is used", param="template")
    if body.get("context"):
        raise RequestError("context is not supported: send the conversation to /api/chat", param="context")
    asked = {OPTIONS[key]: value for key, value in options.items() if key in OPTIONS}  # max_tokens None: no limit
    if isinstance(asked.get("max_tokens"), int) and asked["max_tokens"] < 0:  # -1: no limit, -2: fill the context
        asked["max_tokens"] = None
    stream = body.get("stream")  # on unless turned off: Ollama's default
    asked |= {"model": body.get("model"), "stream": True if stream is None else stream,
              "max_tokens": asked.get("max_tokens"), **_format(body.get("format"))}  # fmt: skip
    if body.get("logprobs"):
        asked |= {"logprobs": True, "top_logprobs": body.get("top_logprobs") or 0}
    if chat:
        messages = body.get("messages")
        if isinstance(messages, list):
            messages = [_message(each, i) for i, each in enumerate(messages)]
        return chat_request(asked | {"messages": messages, "tools": body.get("tools")})
    prompt, system = body.get("prompt"), body.get("system")
    if not isinstance(prompt, str):
        raise RequestError("prompt must be a string", param="prompt")
    if system is not None and not isinstance(system, str):
        raise RequestError("system must be a string", param="system")
    if body.get("raw") or body.get("suffix") is not None:
        asked |= {"prompt": prompt, "suffix": body.get("suffix")}
        if asked.get("logprobs"):  # a completion's count of alternatives
            asked["logprobs"] = asked.pop("top_logprobs")
        return text_request(asked)
    messages = [{"role": "system", "content": system}] if system else []
    return chat_request(asked | {"messages": [*messages, {"role": "user", "content": prompt}]})


def _format(value: object) -> dict:
    """`format`: "json" (JSON mode) or a JSON Schema, as OpenAI's `response_format`."""
    if value in (None, ""):
        return {}
    if value == "json":
        return {"response_format": {"type": "json_object"}}
    if isinstance(value, dict):
        return {"response_format": {"type": "json_schema", "json_schema": {"schema": value}}}
    raise RequestError('format must be "json" or a JSON Schema object', param="format")


def _message(message: object, index: int) -> object:
    """One of Ollama's messages as OpenAI's: its role, text and an assistant's calls (their arguments objects, as
    chat templates take them)."""
    if not isinstance(message, dict):
        return message  # refused, by its place, as OpenAI's are
    if message.get("images"):
        raise RequestError(f"messages[{index}].images: this server's models read text only", param="images")
    return {key: message[key] for key in ("role", "content", "tool_calls") if key in message}


class OllamaReply(Reply):
    """Ollama's answer: `message` (chat) or `response` (generate), whole or a JSON object a line; tool calls whole,
    their arguments objects; the last object `done`, with the counts and durations in nanoseconds."""

    media_type = "application/x-ndjson"

    def __init__(self, *args, generate: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.generate = generate

    def body(self, others: list[Reply] = ()) -> dict:
        text, calls = "".join(self.text), []
        if self.calls is not None:
            text, calls = self.calls.read(text, ended=True)
        return self._object(text, calls, self.logprobs, done=True)

    def first_chunk(self) -> str:
        return ""

    def chunk(self, event) -> str:
        self.add(event)
        text, calls = event.text, []
        if self.calls is not None:
            text, calls = self.calls.read(event.text, ended=event.finish_reason is not None)
        if not text and not calls and self.token_bytes is None:
            return ""
        scored = self.logprobs[len(self.logprobs) - len(event.tokens) :]
        return _line(self._object(text, calls, scored, done=False))

    def finish_chunk(self) -> str:
        return _line(self._object("", [], [], done=True))

    def end_chunks(self, usage: dict | None) -> str:
        return ""

    def error_chunk(self, error: RequestError) -> str:
        return _line({"error": error.message})

    def _object(self, text: str, calls: list, scored: list, *, done: bool) -> dict:
        out = {"model": self.model, "created_at": now()}  # each object's own time, as Ollama's
        if self.generate:
            out["response"] = text
        else:
            out["message"] = {"role": "assistant", "content": text}
            if calls:
                out["message"]["tool_calls"] = [
                    {"function": {"name": call.name, "arguments": json.loads(call.arguments)}} for call in calls
                ]
        if self.token_bytes is not None and scored:
            out["logprobs"] = [self._logprob(token, entry) for token, entry in scored]
        out["done"] = done
        if not done:
            return out
        stats = self.stats or GenerationStats()
        return out | {
            "done_reason": DONE.get(self.ended_by, "length"), "total_duration": _ns(stats.prefill_seconds +
            stats.decode_seconds), "load_duration": 0, "prompt_eval_count": stats.prompt_tokens,
            "prompt_eval_duration": _ns(stats.prefill_seconds), "eval_count": stats.new_tokens,
            "eval_duration": _ns(stats.decode_seconds), "specchat": self.summary([]),
        }  # fmt: skip

    def _logprob(self, token: int, entry) -> dict:
        top = [{"token": self._text(other), "logprob": logprob} for other, logprob in entry.top]
        return {"token": self._text(token), "logprob": entry.logprob, "top_logprobs": top}


def loaded_answer(model: str, body: dict, *, chat: bool) -> dict:
    """What Ollama answers a request with nothing to generate (an empty prompt or conversation): the model is
    loaded, or with `keep_alive` 0 (`ollama stop`) unloaded, which here it stays (it is the server's one model)."""
    out = {"model": model, "created_at": now()}
    out |= {"message": {"role": "assistant", "content": ""}} if chat else {"response": ""}
    return out | {"done": True, "done_reason": "unload" if body.get("keep_alive") in (0, "0", "0s") else "load"}


def nothing_to_generate(body: object, *, chat: bool) -> bool:
    """An Ollama client's way to load a model: a request without a prompt or messages."""
    if not isinstance(body, dict):
        return False
    return (not body.get("messages")) if chat else body.get("prompt") in (None, "") and body.get("suffix") is None


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def _line(payload: dict) -> str:
    return json.dumps(payload, ensure_ascii=False) + "\n"


def model_entry(served) -> dict:
    """The served model as `/api/tags` and `/api/ps` list it: its name, the bytes of its matrices, a digest that
    names these weights (`ollama list` shows its first 12 digits as the ID) and `details`."""
    model = served.engine.model
    family = getattr(model.config, "model_type", "").removesuffix("_text")  # GGUF's name: gemma3, not gemma3_text
    identity = f"{served.name}|{model.name_or_path}|{served.weights}"  # the weights' path names their file's hash
    file = "gguf" if served.weights.startswith("q") else "safetensors"  # GGUF's block types are q4_k, q8_0, ...
    details = {"parent_model": "", "format": file,
               "family": family, "families": [family], "parameter_size": parameter_size(model.config),
               "quantization_level": served.weights.upper()}  # fmt: skip
    return {"name": served.name, "model": served.name, "modified_at": now(), "size": weight_bytes(model),
            "digest": hashlib.sha256(identity.encode()).hexdigest(), "details": details}


def parameter_size(config) -> str:
    """The model's parameter count as Ollama writes it ("1.5B", "135M"), from its shapes: the embedding, each
    layer's attention, MLP and norms, the output head where it is not the embedding's."""
    hidden, heads, kv_heads = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    layer = attention + 3 * hidden * config.intermediate_size + 2 * hidden
    vocab = config.vocab_size * hidden * (1 if getattr(config, "tie_word_embeddings", False) else 2)
    count = vocab + config.num_hidden_layers * layer + hidden
    return f"{count / 1e9:.1f}B" if count >= 1e9 else f"{count / 1e6:.0f}M"


def model_card(served) -> dict:
    """`/api/show`: the chat template, the context length, and what the model can do (`insert`: fill in the
    middle; `tools`: calls in the chat template)."""
    entry = model_entry(served)
    family = entry["details"]["family"]
    capabilities = ["completion", *(["tools"] if served.tool_format else []),
                    *(["insert"] if served.fim_markers else [])]  # fmt: skip
    return {"modelfile": "", "parameters": "", "template": getattr(served.tokenizer, "chat_template", None) or "",
            "details": entry["details"], "modified_at": entry["modified_at"], "capabilities": capabilities,
            "model_info": {"general.architecture": family, f"{family}.context_length": served.engine.capacity}}


def now() -> str:
    """The time as Ollama writes it (RFC 3339, UTC)."""
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
