"""The HTTP routes: OpenAI's chat completions, completions, embeddings and models, a health check, Prometheus' metrics,
llama-server's own `/completion` and `/infill` (editors' code completion), `/tokenize` / `/detokenize` (as
llama-server and vLLM have them: clients count a prompt's tokens with them), and Ollama's API (`ollama.py`).

A request is checked whole (body size, key, JSON, fields, model, prompt length) before it is queued, so a bad
one changes nothing. Errors are OpenAI's `{"error": {...}}` (Ollama's routes: `{"error": "..."}`) with a 4xx status.
Until the model has loaded, `/health` says "loading" (503) and generation requests get 503 with Retry-After.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hmac
import json
import time
from dataclasses import dataclass
from importlib.metadata import version

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from specchat.engine.sampling_config import MAX_SEED, SamplingConfig
from specchat.fill_in_middle import FimMarkers, fim_markers
from specchat.server.embeddings import (
    EmbeddingRequest,
    embedding_body,
    input_ids,
    ollama_embedding_request,
    openai_embedding_request,
)  # fmt: skip
from specchat.server.metrics import Metrics
from specchat.server.ollama import (
    OllamaReply,
    loaded_answer,
    model_card,
    model_entry,
    nothing_to_generate,
    ollama_request,
)  # fmt: skip
from specchat.server.requests import (
    CompletionRequest,
    RequestError,
    chat_request,
    detokenize_request,
    native_request,
    text_request,
    tokenize_request,
)  # fmt: skip
from specchat.server.responses import NativeReply, Reply
from specchat.server.worker import EmbeddingJob, Ended, EngineWorker, Job, Prompt, QueueFull
from specchat.tool_calls import ToolFormat, tool_format

REPLIES = {"openai": Reply, "llama-server": NativeReply, "ollama-chat": OllamaReply,
           "ollama-generate": functools.partial(OllamaReply, generate=True)}  # a request's `reply` -> its shape
RETRY_SECONDS = 5  # Retry-After while loading, and when the queue is full
DRAIN_BYTES = 256 * 2**20  # a body over the limit is still read up to this size, so that its client hears the 413
DISCONNECT_POLL_SECONDS = 0.5  # how often a waiting non-streaming request checks that its client is still there


@dataclass
class Served:
    """What the worker loaded: the engine, and what the routes need to check and answer a request."""

    engine: object
    tokenizer: object  # the routes' own copy: the engine's tokenizer is used on the engine's thread
    name: str  # the model id clients send and /v1/models lists
    aliases: frozenset[str]  # other names accepted for it (the --model given, its profile alias)
    drafter: str
    defaults: dict  # SamplingConfig fields the model asks for when a request leaves them out
    weights: str = ""  # their format ("q4_k", "int4-g32", "bfloat16"): Ollama's quantization level
    system: str | None = None  # the system prompt of a conversation that brings none (an ollama model's SYSTEM)
    stop: tuple[str, ...] = ()  # the stop strings of a request that names none (an ollama model's)

    @functools.cached_property
    def tool_format(self) -> ToolFormat | None:
        return tool_format(self.tokenizer)

    @functools.cached_property
    def fim_markers(self) -> FimMarkers | None:
        return fim_markers(self.tokenizer)

    def prompt_ids(self, request: CompletionRequest) -> list[int]:
        from specchat.engine.prompt import encode_chat

        if request.messages is not None:
            if not getattr(self.tokenizer, "chat_template", None):
                raise RequestError(f"model '{self.name}' has no chat template; use /v1/completions", param="messages")
            if request.tools is not None and self.tool_format is None:
                raise RequestError(f"model '{self.name}' cannot call tools: its chat template does not list them as "
                                   "Qwen's or Llama 3's do", param="tools")  # fmt: skip
            messages = request.messages
            if self.system and not any(message["role"] == "system" for message in messages):
                messages = [{"role": "system", "content": self.system}, *messages]
            ids = encode_chat(self.tokenizer, messages, request.tools.template() if request.tools else None)
        elif request.infill is not None:
            if self.fim_markers is None:
                raise RequestError(f"model '{self.name}' has no fill-in-the-middle tokens: it cannot fill in code",
                                   param="suffix")  # fmt: skip
            ids = self.fim_markers.prompt(self.tokenizer, request.infill)
        elif isinstance(request.prompt, str):
            ids = self.tokenizer.encode(request.prompt)
        else:
            ids = request.prompt
            if max(ids) >= len(self.tokenizer):
                raise RequestError(f"prompt token ids must be below the vocabulary size {len(self.tokenizer)}",
                                   param="prompt")  # fmt: skip
        capacity = self.engine.capacity
        if len(ids) >= capacity:
            remedy = ("the model's window: --yarn F stretches it" if self.engine.max_len == self.engine.context_window
                      else "start the server with a larger --context")  # fmt: skip
            raise RequestError(f"the prompt has {len(ids)} tokens; the context holds {capacity} in all, prompt and "
                               f"answer ({remedy})", param="messages" if request.messages is not None else "prompt")
        return ids

    def constraint(self, request: CompletionRequest):
        """How the answer is held (JSON mode, a grammar, tool calls), as the engine's thread builds it; None: free."""
        if not request.format.free:
            return request.format.constraint
        tools, form = request.tools, self.tool_format
        if tools is None or not form.tagged and tools.choice != "required":
            return None  # a whole-answer call the model may or may not make is read from its free answer
        return lambda engine: engine.tool_call_constraint(tools.callable(), form, choice=tools.choice,
                                                          parallel=tools.parallel)  # fmt: skip

    def echo_text(self, request: CompletionRequest, ids: list[int]) -> str:
        """The prompt as an echo gives it back: as sent, or its ids' text."""
        return request.prompt if isinstance(request.prompt, str) else self.tokenizer.decode(ids)

    def sampling(self, request: CompletionRequest) -> SamplingConfig:
        vocab = self.engine.model.config.vocab_size
        if any(token >= vocab for token, _ in request.sampling.get("logit_bias", ())):
            raise RequestError(f"logit_bias: token ids must be below the vocabulary size {vocab}", param="logit_bias")
        suppress = {"suppress": tuple(sorted(self.engine.eos_ids))} if request.ignore_eos else {}
        try:
            return SamplingConfig(**{**self.defaults, **request.sampling, **suppress})
        except ValueError as error:
            raise RequestError(str(error)) from None


def create_app(worker: EngineWorker, *, api_key: str | None, max_body_bytes: int) -> Starlette:
    metrics = Metrics(waiting=lambda: worker.waiting, running=lambda: int(worker.busy))

    async def prometheus(request: Request) -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    async def health(request: Request) -> Response:
        if worker.load_error is not None:
            return JSONResponse({"status": "error", "error": worker.load_error}, status_code=503)
        if worker.served is None:
            return JSONResponse({"status": "loading"}, status_code=503, headers={"Retry-After": str(RETRY_SECONDS)})
        return JSONResponse({"status": "ready", "model": worker.served.name, "drafter": worker.served.drafter,
                             "generating": worker.busy, "waiting": worker.waiting,
                             "tokens_generated": worker.tokens_generated, "prompt_cache": worker.prompt_cache,
                             "kv_cache": worker.served.engine.cache.kv_cache})  # fmt: skip

    async def models(request: Request) -> Response:
        served = _served(request)
        return JSONResponse({"object": "list", "data": [_model_card(served)]})

    async def model(request: Request) -> Response:
        served = _served(request)
        _check_model(served, request.path_params["model"])
        return JSONResponse(_model_card(served))

    async def chat_completions(request: Request) -> Response:
        return await _complete(request, chat_request(await _json(request)))

    async def completions(request: Request) -> Response:
        return await _complete(request, text_request(await _json(request)))

    async def native_completion(request: Request) -> Response:
        return await _complete(request, native_request(await _json(request), infill=False))

    async def infill(request: Request) -> Response:
        return await _complete(request, native_request(await _json(request), infill=True))

    async def embeddings(request: Request) -> Response:
        return await _embed(request, openai_embedding_request(await _json(request)))

    async def ollama_embed(request: Request) -> Response:
        return await _embed(request, ollama_embedding_request(await _json(request), legacy=False))

    async def ollama_embeddings(request: Request) -> Response:
        return await _embed(request, ollama_embedding_request(await _json(request), legacy=True))

    async def _embed(request: Request, wanted: EmbeddingRequest) -> Response:
        arrived = time.perf_counter()
        served = _served(request)
        if wanted.model is not None:
            _check_model(served, wanted.model)
        engine = served.engine
        texts = input_ids(wanted, served.tokenizer, engine.capacity, engine.model.config.hidden_size)
        vectors = []
        if texts:
            items: asyncio.Queue = asyncio.Queue()
            job = EmbeddingJob(texts, deliver=functools.partial(asyncio.get_running_loop().call_soon_threadsafe,
                                                                items.put_nowait))  # fmt: skip
            _submit(job)
            item = await _next(request, items, job)
            if item is None:
                metrics.answered(499)
                return Response(status_code=499)
            if isinstance(item, Ended):
                if item.error is not None:
                    raise RequestError(item.error, status=item.status, kind=_kind(item.status))
                raise RequestError("the server is shutting down", status=503, kind="server_error")
            vectors = item.vectors
        body = embedding_body(wanted, served.name, vectors, sum(map(len, texts)), time.perf_counter() - arrived)
        metrics.answered(200)
        return JSONResponse(body)

    def _submit(job: Job | EmbeddingJob) -> None:
        try:
            worker.submit(job)
        except QueueFull:
            raise RequestError(f"the server is busy: {worker.waiting} requests are waiting; retry later",
                               status=429, kind="rate_limit_error",
                               headers={"Retry-After": str(RETRY_SECONDS)}) from None  # fmt: skip

    async def _next(request: Request, items: asyncio.Queue, job: Job | EmbeddingJob) -> object | None:
        """The job's next delivery; None (the job cancelled) once its client has gone: nobody waits for it."""
        while True:
            try:
                return await asyncio.wait_for(items.get(), DISCONNECT_POLL_SECONDS)
            except TimeoutError:
                if await request.is_disconnected():
                    job.cancelled.set()
                    return None

    async def ollama_chat(request: Request) -> Response:
        return await _ollama(request, chat=True)

    async def ollama_generate(request: Request) -> Response:
        return await _ollama(request, chat=False)

    async def _ollama(request: Request, *, chat: bool) -> Response:
        body = await _json(request)
        if nothing_to_generate(body, chat=chat):  # how Ollama's clients load a model
            served = _served(request)
            _check_model(served, body.get("model") or served.name)
            return JSONResponse(loaded_answer(served.name, body, chat=chat))
        return await _complete(request, ollama_request(body, chat=chat))

    async def root(request: Request) -> Response:
        """Ollama's heartbeat: its command line asks `HEAD /` before anything else."""
        return PlainTextResponse("specchat is running")

    async def ollama_tags(request: Request) -> Response:
        return JSONResponse({"models": [model_entry(_served(request))]})

    async def ollama_running(request: Request) -> Response:
        served = _served(request)
        entry = model_entry(served)
        return JSONResponse({"models": [entry | {"size_vram": 0, "context_length": served.engine.capacity}]})

    async def ollama_show(request: Request) -> Response:
        body = await _json(request)
        served = _served(request)
        name = body.get("model", body.get("name")) if isinstance(body, dict) else None
        if not isinstance(name, str):
            raise RequestError("model is required", param="model")
        _check_model(served, name)
        return JSONResponse(model_card(served))

    async def ollama_version(request: Request) -> Response:
        return JSONResponse({"version": version("specchat")})

    async def tokenize(request: Request) -> Response:
        """The ids of a text (or a conversation through the chat template), as llama-server or vLLM answers."""
        wanted = tokenize_request(await _json(request))
        served = _served(request)
        if wanted.model is not None:
            _check_model(served, wanted.model)
        tokenizer = served.tokenizer
        if wanted.messages is not None:
            from specchat.engine.prompt import encode_chat

            ids = encode_chat(tokenizer, wanted.messages)
        else:
            ids = tokenizer.encode(wanted.text, add_special_tokens=wanted.special)
        if wanted.llama:
            pieces = [{"id": i, "piece": tokenizer.decode([i])} for i in ids] if wanted.pieces else ids
            return JSONResponse({"tokens": pieces})
        return JSONResponse({"count": len(ids), "max_model_len": served.engine.capacity, "tokens": ids,
                             "token_strs": tokenizer.convert_ids_to_tokens(ids) if wanted.pieces else None})

    async def detokenize(request: Request) -> Response:
        """The text of ids, under both servers' names for it (vLLM's `prompt`, llama-server's `content`)."""
        name, ids = detokenize_request(await _json(request))
        served = _served(request)
        if name is not None:
            _check_model(served, name)
        if any(token >= len(served.tokenizer) for token in ids):
            raise RequestError(f"token ids must be below the vocabulary size {len(served.tokenizer)}", param="tokens")
        text = served.tokenizer.decode(ids)
        return JSONResponse({"prompt": text, "content": text})

    def _served(request: Request) -> Served:
        _authorize(request)
        if worker.served is None:
            reason = worker.load_error or "the model is loading"
            raise RequestError(reason, status=503, kind="server_error",
                               headers={"Retry-After": str(RETRY_SECONDS)})  # fmt: skip
        return worker.served

    def _authorize(request: Request) -> None:
        if api_key is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), api_key.encode()):
            raise RequestError("a valid API key is required (Authorization: Bearer KEY)", status=401,
                               kind="authentication_error")  # fmt: skip

    async def _json(request: Request) -> object:
        _authorize(request)
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > max(max_body_bytes, DRAIN_BYTES):
            raise _too_large()  # not worth reading: its client may see the connection reset
        body, stream = bytearray(), request.stream()
        async for chunk in stream:
            body += chunk
            if len(body) > max_body_bytes:  # read the rest, unkept: a client still sending would see a reset
                read = len(body)
                async for rest in stream:
                    read += len(rest)
                    if read > DRAIN_BYTES:
                        break
                raise _too_large()
        try:
            return json.loads(body)
        except ValueError as error:  # also bad UTF-8
            raise RequestError(f"the request body is not valid JSON: {error}") from None

    def _too_large() -> RequestError:
        return RequestError(f"the request body is over {max_body_bytes} bytes", status=413)

    async def _complete(request: Request, wanted: CompletionRequest) -> Response:
        arrived = time.perf_counter()
        served = _served(request)
        if wanted.model is not None:
            _check_model(served, wanted.model)
        ids = served.prompt_ids(wanted)
        drafting, draft_budget = _speculation(served, wanted)
        room = served.engine.capacity + 1 - len(ids)
        loop = asyncio.get_running_loop()
        wanted_tokens = room if wanted.max_tokens is None else min(wanted.max_tokens, room)
        sampling, constraint = served.sampling(wanted), served.constraint(wanted)
        answers = []  # (job, its deliveries, its reply), one a choice
        shape = REPLIES[wanted.reply]
        for index in range(wanted.choices):
            items: asyncio.Queue = asyncio.Queue()
            job = Job(ids, _choice_sampling(sampling, index), wanted_tokens, wanted.stop or served.stop,
                      deliver=functools.partial(loop.call_soon_threadsafe, items.put_nowait), drafting=drafting,
                      draft_budget=draft_budget, constraint=constraint, logprobs=wanted.logprobs,
                      echo=wanted.echo, time_limit=wanted.time_limit, min_tokens=wanted.min_tokens,
                      indent=wanted.indent)  # fmt: skip
            try:
                _submit(job)
            except RequestError:
                for earlier, _, _ in answers:
                    earlier.cancelled.set()
                raise
            reply = shape(served.name, served.drafter if drafting else "none", chat=wanted.messages is not None,
                          token_bytes=served.engine.token_bytes if wanted.logprobs is not None else None,
                          tools=served.tool_format if wanted.tools and wanted.tools.choice != "none" else None,
                          echo=served.echo_text(wanted, ids) if wanted.echo else None, index=index)  # fmt: skip
            if answers:  # one response: one id
                reply.id, reply.created = answers[0][2].id, answers[0][2].created
            answers.append((job, items, reply))
        if wanted.stream:
            return StreamingResponse(_stream(answers, wanted.include_usage, arrived),
                                     media_type=answers[0][2].media_type, headers={"Cache-Control": "no-cache"})
        return await _whole(request, answers, arrived)

    def _heard(reply: Reply, item, arrived: float) -> None:
        """Metrics of one delivery from the engine: the first token's time, a finished run's counts."""
        if isinstance(item, Ended):
            metrics.ran(reply.stats)
        elif reply.stats is None and not isinstance(item, Prompt):
            metrics.time_to_first_token.observe(time.perf_counter() - arrived)

    async def _whole(request: Request, answers: list, arrived: float) -> Response:
        try:
            for job, items, reply in answers:
                while True:
                    item = await _next(request, items, job)
                    if item is None:  # nobody is waiting for the answer: the engine is freed
                        metrics.answered(499)
                        return Response(status_code=499)
                    _heard(reply, item, arrived)
                    if isinstance(item, Ended):
                        break
                    reply.add(item)
                if item.error is not None:
                    raise RequestError(item.error, status=item.status, kind=_kind(item.status))
                if item.shutdown and reply.stats is None:
                    raise RequestError("the server is shutting down", status=503, kind="server_error")
                if item.shutdown or item.cut:
                    reply.cut_short()
        finally:
            for job, _, _ in answers:
                job.cancelled.set()
        metrics.answered(200)
        replies = [reply for _, _, reply in answers]
        return JSONResponse(replies[0].body(replies[1:]))

    async def _stream(answers: list, include_usage: bool, arrived: float):
        metrics.answered(200)  # the status is sent before the answer
        try:
            for job, items, reply in answers:
                if opening := reply.first_chunk():
                    yield opening
                while True:
                    _heard(reply, item := await items.get(), arrived)
                    if isinstance(item, Ended):
                        break
                    if text := reply.chunk(item):
                        yield text
                if item.error is not None:
                    yield reply.error_chunk(RequestError(item.error, status=item.status, kind=_kind(item.status)))
                    return
                if item.shutdown or item.cut:
                    reply.cut_short()
                yield reply.finish_chunk()
            replies = [reply for _, _, reply in answers]
            yield replies[0].end_chunks(replies[0].body(replies[1:])["usage"] if include_usage else None)
        finally:  # the client hung up (the stream is cancelled), or it ended: either way the jobs are over
            for job, _, _ in answers:
                job.cancelled.set()

    async def on_request_error(request: Request, error: RequestError) -> Response:
        metrics.answered(error.status)
        body = {"error": error.message} if request.url.path.startswith("/api/") else error.body()  # Ollama's
        return JSONResponse(body, status_code=error.status, headers=error.headers)

    async def on_http_error(request: Request, error: HTTPException) -> Response:
        kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        refused = RequestError(f"{request.method} {request.url.path}: {error.detail}", status=error.status_code,
                               kind=kind, headers=error.headers)  # fmt: skip
        return await on_request_error(request, refused)

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/completion", native_completion, methods=["POST"]),
        Route("/infill", infill, methods=["POST"]),
        Route("/", root, methods=["GET", "HEAD"]),
        Route("/api/chat", ollama_chat, methods=["POST"]),
        Route("/api/generate", ollama_generate, methods=["POST"]),
        Route("/api/embed", ollama_embed, methods=["POST"]),
        Route("/api/embeddings", ollama_embeddings, methods=["POST"]),
        Route("/api/tags", ollama_tags, methods=["GET"]),
        Route("/api/ps", ollama_running, methods=["GET"]),
        Route("/api/show", ollama_show, methods=["POST"]),
        Route("/api/version", ollama_version, methods=["GET"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
    ]
    handlers = {RequestError: on_request_error, HTTPException: on_http_error}
    return Starlette(routes=routes, exception_handlers=handlers)


def _choice_sampling(sampling: SamplingConfig, index: int) -> SamplingConfig:
    """The sampling of a request's choice `index`: a seeded request's choices each draw from a seed of their own
    (the seed, plus the index), so that they differ as OpenAI's do."""
    if index == 0 or sampling.seed is None:
        return sampling
    return dataclasses.replace(sampling, seed=(sampling.seed + index) % (MAX_SEED + 1))


def _speculation(served: Served, wanted: CompletionRequest) -> tuple[bool, int | None]:
    """Whether the request drafts, and its fixed budget (None: the server's), from its `speculative` object."""
    asked = wanted.speculative
    if asked is None:
        return served.drafter != "none", None
    if asked.drafter not in (None, served.drafter, "none"):
        raise RequestError(f"this server drafts with {served.drafter!r}: speculative.drafter may be that or 'none', "
                           f"not {asked.drafter!r}", param="speculative.drafter")  # fmt: skip
    if asked.drafter != "none" and served.drafter == "none" and asked.draft_budget is not None:
        raise RequestError("this server has no drafter: speculative.draft_budget asks for none",
                           param="speculative.draft_budget")  # fmt: skip
    return asked.drafter != "none" and served.drafter != "none", asked.draft_budget


def _check_model(served: Served, name: str) -> None:
    """The model a request names must be this server's: its name, an alias, or either with Ollama's default tag."""
    name = name.removesuffix(":latest")
    if name != served.name and name not in served.aliases:
        raise RequestError(f"the model '{name}' is not served here; this server has '{served.name}'",
                           param="model", status=404, kind="not_found_error")  # fmt: skip


def _model_card(served: Served) -> dict:
    """The model as `/v1/models` lists it, with vLLM's `max_model_len` (prompt and answer together) that clients
    size their prompts by."""
    return {"id": served.name, "object": "model", "created": 0, "owned_by": "specchat",
            "max_model_len": served.engine.capacity}  # fmt: skip


def _kind(status: int) -> str:
    return "invalid_request_error" if status < 500 else "server_error"
