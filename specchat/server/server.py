"""`specchat serve`: listen at once, load the model on the engine's thread, serve until SIGTERM or Ctrl-C.

The port is bound before anything loads, so a taken port is a one-line error, not a minute later; requests
that come while the model loads get 503 (`/health` says "loading"). uvicorn runs on a thread of its own
while the main thread waits for a signal: then the server stops taking connections, the answers in flight
end cleanly (their last chunk and `[DONE]`), queued ones get 503, and the command exits 0.
"""

from __future__ import annotations

import copy
import signal
import socket
import sys
import threading
from dataclasses import dataclass

from specchat.errors import SpecchatError

GRACE_SECONDS = 3  # how long answers in flight get to send their last chunk at shutdown


@dataclass(frozen=True)
class ServeSettings:
    model: str | None
    drafter: str
    draft_budget: int | None
    draft_cache: str | None
    host: str
    port: int
    api_key: str | None
    context: int
    max_queue: int
    max_body_bytes: int
    dtype: str
    quantize: str | None
    device: str
    attention: str
    prompt_cache: bool | None = None  # reuse the prefix a prompt shares with the last one; None: where exact
    prompt_cache_bytes: int = 2**30  # earlier texts' prefixes kept for their clients' next requests
    kv_cache: str = "auto"  # the target's keys and values: the activations' dtype, or int8 (the CPU decoder)
    yarn: float | None = None  # the model's window stretched this many times by YaRN
    chat_template: tuple[str, str] | None = None  # (its file, its text) in place of the model's own


class Server:
    """The engine's thread and uvicorn's, serving on a socket bound at creation (`specchat serve`, `bench serve`)."""

    def __init__(self, settings: ServeSettings):
        import uvicorn

        from specchat.server.app import create_app
        from specchat.server.worker import EngineWorker

        self.listener = _listen(settings.host, settings.port)
        host, port = self.listener.getsockname()[:2]
        self.host, self.port = host, port
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
        self.worker = EngineWorker(lambda: load_served(settings), settings.max_queue,
                                   prompt_cache=settings.prompt_cache)
        app = create_app(self.worker, api_key=settings.api_key, max_body_bytes=settings.max_body_bytes)
        self.http = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off",
                                                  timeout_graceful_shutdown=GRACE_SECONDS))  # fmt: skip
        self._thread = threading.Thread(target=self.http.run, kwargs={"sockets": [self.listener]},
                                        name="specchat-http", daemon=True)  # fmt: skip

    def start(self) -> None:
        self.worker.start()
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """Stop taking requests, end those in flight (their last chunk), and wait for both threads."""
        self.worker.stop()
        self.http.should_exit = True
        self._thread.join(GRACE_SECONDS + 2)
        self.worker.join(2)


def serve(settings: ServeSettings) -> None:
    server = Server(settings)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda _signum, _frame: stop.set())
    _say(f"specchat serve: loading {settings.model or 'the default model'}; listening on {server.url} "
         "(requests get 503 until the model is ready)")  # fmt: skip
    server.start()
    worker, announced = server.worker, False
    while not stop.wait(0.1) and server.running:
        if worker.ready.is_set() and not announced:
            announced = True
            if worker.load_error is not None:
                break
            reuse = "reused" if worker.prompt_cache else "prefilled whole"
            _say(f"specchat serve: ready at {server.url}/v1 (and {server.url} for Ollama's clients; model "
                 f"{worker.served.name}, drafter {worker.served.drafter}; cached prompt prefixes {reuse}); Ctrl-C "
                 f"stops")  # fmt: skip
    server.stop()
    if worker.load_error is not None:
        raise SpecchatError(worker.load_error)
    _say("specchat serve: stopped")


def load_served(settings: ServeSettings):
    """Load the model, build the engine and its drafter, and warm them up (the first request then starts warm)."""
    from specchat.chat_template import use_chat_template
    from specchat.loading import decoding_defaults, load_model
    from specchat.ollama_models import ollama_stop, ollama_system
    from specchat.server.app import Served
    from specchat.session import Session

    loaded = load_model(settings.model, dtype=settings.dtype, quantize=settings.quantize, device=settings.device,
                        attention=settings.attention, yarn=settings.yarn)  # fmt: skip
    if settings.chat_template is not None:
        name, template = settings.chat_template
        use_chat_template(loaded.tokenizer, template, name)
    window = loaded.model.config.max_position_embeddings
    kept = settings.prompt_cache_bytes if settings.prompt_cache is not False else 0
    session = Session.over(loaded, max_len=min(settings.context, window), drafter=settings.drafter,
                           draft_budget=settings.draft_budget, draft_cache=settings.draft_cache,
                           kv_cache=settings.kv_cache, prefix_bytes=kept)  # fmt: skip
    engine, choice = session.engine, session.drafter
    for _ in engine.generate(loaded.tokenizer.encode("Hello"), max_new_tokens=2):
        pass  # pays the first forward's setup and, on a new machine, the verification-cost timing
    aliases = {settings.model} - {None, loaded.source.name}
    model = settings.model  # a model ollama holds by this name: its Modelfile's system prompt and stop strings
    return Served(engine, copy.deepcopy(loaded.tokenizer), loaded.source.name, frozenset(aliases), str(choice),
                  decoding_defaults(loaded), loaded.weights, model and ollama_system(model),
                  ollama_stop(model) if model else ())  # fmt: skip


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to `host:port` (port 0: a free one), or a one-line error."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(128)  # connections queue from now on, while uvicorn starts
    except OSError as error:
        raise SpecchatError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    return listener


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
