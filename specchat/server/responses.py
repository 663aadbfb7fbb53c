"""What goes back: OpenAI's response and stream-chunk objects, llama-server's `timings` object (what its clients
read: prompt and generation times, drafted and accepted tokens), and a `specchat` object no other server has,
saying which tokens the drafter proposed (and the target accepted), tau and the acceptance rate."""

from __future__ import annotations

import json
import time
import uuid

from specchat.engine.events import TokenLogprob
from specchat.engine.stats import GenerationStats
from specchat.server.worker import Prompt
from specchat.tool_calls import ToolCall, ToolFormat, call_reader

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}  # the engine's -> OpenAI's


class Reply:
    """One answer of a request (its choice `index`) as it is produced; renders it whole (`body`, or its `choice`
    among a request's several) or as stream chunks."""

    media_type = "text/event-stream"  # of a streamed answer

    def __init__(self, model: str, drafter: str, *, chat: bool, token_bytes=None, tools: ToolFormat | None = None,
                 echo: str | None = None, index: int = 0):  # fmt: skip
        self.index = index
        self.model, self.drafter, self.chat = model, drafter, chat
        self.echo = echo  # the prompt's text, where the completion begins with it
        self.token_bytes = token_bytes  # id -> bytes, when the request asked for log-probabilities
        self.calls = call_reader(tools) if tools else None  # the answer's tool calls, where it may make them
        self.logprobs: list[tuple[int, TokenLogprob | None]] = []
        self.characters = 0  # of the text whose tokens' log-probabilities went out (a completion's text_offset)
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.text: list[str] = []
        self.origins: list[str] = []
        self.stats: GenerationStats | None = None
        self.prompt_tokens = 0  # an echoed prompt's, until the engine's stats say
        self.finish: str | None = None
        self.ended_by: str | None = None  # the engine's finish reason

    def add(self, event) -> None:
        """Take one engine step (a `StepEvent`), or the echoed prompt (a `Prompt`: the text begins with it)."""
        if isinstance(event, Prompt):
            self.text.append(self.echo)
            self.prompt_tokens = len(event.ids)
            if self.token_bytes is not None:
                self.logprobs += list(zip(event.ids, event.logprobs))
            return
        self.text.append(event.text)
        self.origins += event.origins
        if self.token_bytes is not None:
            self.logprobs += list(zip(event.tokens, event.logprobs))
        self.stats = event.stats
        if event.finish_reason is not None:
            self.ended_by, self.finish = event.finish_reason, FINISH[event.finish_reason]

    def cut_short(self) -> None:
        """The server stopped this answer before the engine did (shutting down)."""
        self.finish = self.finish or "length"

    def body(self, others: list[Reply] = ()) -> dict:
        """The whole answer, with the `others` choices of the request after this one's."""
        usage = self.usage()
        for other in others:  # one prompt, several completions
            usage["completion_tokens"] += other.usage()["completion_tokens"]
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return self._envelope("chat.completion" if self.chat else "text_completion",
                              [self.choice(), *(other.choice() for other in others)], usage=usage,
                              timings=self.timings(), specchat=self.summary(self.origins))  # fmt: skip

    def choice(self) -> dict:
        text = "".join(self.text)
        message = {"role": "assistant", "content": text}
        if self.calls is not None:
            text, calls = self.calls.read(text, ended=True)
            message = {"role": "assistant", "content": (text.strip() if calls else text) or None}
            if calls:
                message["tool_calls"] = [_call(call) for call in calls]
        choice = {"index": self.index, "finish_reason": self._finish_reason, "logprobs": self._logprobs(self.logprobs)}
        return choice | ({"message": message} if self.chat else {"text": text})

    def first_chunk(self) -> str:
        """A chat stream opens with the assistant's role (completions streams have no roles)."""
        return self._chunk({"role": "assistant", "content": ""}, None) if self.chat else ""

    def chunk(self, event) -> str:
        """The stream chunk of one step: its text, its tokens' origins, the tool calls that closed and, when asked,
        log-probabilities (or of the echoed prompt)."""
        self.add(event)
        if isinstance(event, Prompt):
            scored = self._logprobs(self.logprobs)
            return self._chunk({"content": self.echo}, None, logprobs=scored)
        delta, calls = {"content": event.text}, []
        if self.calls is not None:
            text, calls = self.calls.read(event.text, ended=event.finish_reason is not None)
            delta = {"content": text}
            if calls:
                first = len(self.calls.calls) - len(calls)
                indexed = [{"index": first + i} | _call(call) for i, call in enumerate(calls)]
                delta = {"content": text or None, "tool_calls": indexed}
        if not delta["content"] and not calls and event.finish_reason is None and self.token_bytes is None:
            return ""
        scored = self._logprobs(self.logprobs[len(self.logprobs) - len(event.tokens) :])
        return self._chunk(delta, None, {"origins": event.origins}, logprobs=scored)

    def finish_chunk(self) -> str:
        """The finish reason with the whole answer's figures."""
        return self._chunk({}, self._finish_reason, self.summary([]), timings=self.timings())

    def end_chunks(self, usage: dict | None) -> str:
        """After every choice's chunks: the usage, when asked, and the end marker."""
        return (_sse(self._envelope(self._chunk_object, [], usage=usage)) if usage else "") + "data: [DONE]\n\n"

    def error_chunk(self, error) -> str:
        """A stream's end where the engine failed (a `RequestError`)."""
        return f"data: {json.dumps(error.body())}\n\ndata: [DONE]\n\n"

    def usage(self) -> dict:
        prompt = self.stats.prompt_tokens if self.stats else self.prompt_tokens
        completion = self.stats.new_tokens if self.stats else 0
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def timings(self) -> dict:
        """llama-server's `timings`: the prompt's tokens prefilled (`cache_n` of them were cached) and its time with
        the first token's, then the later tokens' time, and the draft tokens verified and accepted."""
        stats = self.stats or GenerationStats()
        prompt_n, predicted_n = stats.prompt_tokens - stats.reused_tokens, stats.new_tokens
        prompt_ms, predicted_ms = 1e3 * stats.prefill_seconds, 1e3 * stats.decode_seconds
        return {
            "cache_n": stats.reused_tokens,
            "prompt_n": prompt_n,
            "prompt_ms": round(prompt_ms, 3),
            "prompt_per_second": round(1e3 * prompt_n / prompt_ms, 3) if prompt_ms else None,
            "predicted_n": predicted_n,
            "predicted_ms": round(predicted_ms, 3),
            "predicted_per_second": round(1e3 * stats.decode_tokens / predicted_ms, 3) if predicted_ms else None,
            "draft_n": stats.drafted_nodes,
            "draft_n_accepted": stats.accepted,
        }

    def summary(self, origins: list[str]) -> dict:
        """The `specchat` object: each token's origin (when given), and how the drafting went."""
        figures = {"drafter": self.drafter}
        if origins:
            figures["origins"] = origins
        if self.stats is not None:
            figures["drafted_tokens"] = sum(origin != "target" for origin in self.origins)
            figures |= self.stats.as_json()  # tau is its mean_accepted_length
        return figures

    @property
    def _finish_reason(self) -> str | None:
        """OpenAI's: "tool_calls" where the model ended its answer after calling tools."""
        called = self.calls is not None and self.calls.calls
        if self.stats is None and self.prompt_tokens:  # an echo of the prompt alone (max_tokens 0)
            return "length"
        return "tool_calls" if called and self.finish == "stop" else self.finish

    @property
    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def _logprobs(self, scored: list[tuple[int, TokenLogprob]]) -> dict | None:
        """OpenAI's `logprobs` of these tokens: chat's `content` list, or a completion's parallel lists."""
        if self.token_bytes is None:
            return None
        if self.chat:
            return {"content": [self._entry(token, entry.logprob) | {"top_logprobs": [
                self._entry(other, logprob) for other, logprob in entry.top]} for token, entry in scored],
                "refusal": None}  # fmt: skip
        texts = [self._text(token) for token, _ in scored]
        offsets = [self.characters + sum(map(len, texts[:i])) for i in range(len(texts))]
        self.characters += sum(map(len, texts))
        return {"tokens": texts, "token_logprobs": [entry and entry.logprob for _, entry in scored],
                "text_offset": offsets,
                "top_logprobs": [entry and {self._text(other): logprob for other, logprob in entry.top}
                                 for _, entry in scored]}  # fmt: skip

    def _entry(self, token: int, logprob: float) -> dict:
        return {"token": self._text(token), "logprob": logprob, "bytes": list(self.token_bytes(token))}

    def _text(self, token: int) -> str:
        return self.token_bytes(token).decode("utf-8", errors="replace")

    def _chunk(self, delta: dict, finish: str | None, specchat: dict | None = None, logprobs: dict | None = None,
               **extra) -> str:
        choice = {"index": self.index, "finish_reason": finish, "logprobs": logprobs}
        choice |= {"delta": delta} if self.chat else {"text": delta.get("content", "")}
        extra |= {"specchat": specchat} if specchat else {}
        return _sse(self._envelope(self._chunk_object, [choice], **extra))

    def _envelope(self, kind: str, choices: list[dict], **extra) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices,
                **extra}  # fmt: skip


def _call(call: ToolCall) -> dict:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


STOP_TYPES = {"eos": "eos", "stop": "word", "length": "limit", "context": "limit"}  # the engine's -> llama-server's


class NativeReply(Reply):
    """llama-server's own answer (`/completion`, `/infill`): `content` and `stop`, streamed as bare SSE events
    (no `[DONE]`), the last one with the counts and `timings`."""

    def body(self, others: list[Reply] = ()) -> dict:
        return self._native("".join(self.text), stop=True)

    def first_chunk(self) -> str:
        return ""

    def chunk(self, event) -> str:
        self.add(event)
        return _sse(self._native(event.text, stop=False)) if event.text else ""

    def finish_chunk(self) -> str:
        return _sse(self._native("", stop=True))

    def end_chunks(self, usage: dict | None) -> str:
        return ""

    def _native(self, content: str, stop: bool) -> dict:
        out = {"index": 0, "content": content, "stop": stop, "model": self.model}
        if not stop:
            return out
        stats = self.stats or GenerationStats()
        return out | {
            "stop_type": STOP_TYPES.get(self.ended_by, "limit"), "stopping_word": "", "truncated": False,
            "tokens_predicted": stats.new_tokens, "tokens_evaluated": stats.prompt_tokens,
            "tokens_cached": stats.reused_tokens, "timings": self.timings(), "specchat": self.summary([]),
        }  # fmt: skip
