"""`specchat bench serve`: the server under 1, 4, 8... clients at once, against the same engine driven directly.

The server runs in this process on a free port. First every prompt goes to the engine directly, one after the
other, through the worker's queue with no HTTP in between (a second pass, timed: the first pays one-time
costs): the time `specchat run` would take. Then, for each
client count, each client streams every prompt through `/v1/chat/completions`, all clients at once. Per
request: time to the first token, and the mean time between the later ones; per client count: tokens per
second over all clients. One engine answers one request at a time, so more clients wait longer for their
first token, and their tokens per second together stay those of one. The server's overhead is its time per
token against the direct one, with one client.
"""

from __future__ import annotations

import http.client
import json
import queue
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from specchat.bench.progress import NO_PROGRESS
from specchat.engine.sampling_config import SamplingConfig


@dataclass(frozen=True)
class ServeRow:
    clients: int
    requests: int
    tokens: int
    seconds: float  # from the first request sent to the last answer done
    tokens_per_second: float  # all clients together
    ttft_ms: float  # median time to the first token
    itl_ms: float  # mean time between later tokens
    direct_tokens_per_second: float  # the same prompts through the engine directly, one after the other
    overhead: float | None  # one client: the server's time per token over the direct one, less 1


@dataclass(frozen=True)
class _Answer:
    tokens: int
    first: float  # seconds from sending to the first token
    last: float  # seconds from sending to the last token


def serve_bench(server, prompts: list[str], *, clients: list[int], max_tokens: int,
                step: Callable[[str], None] = NO_PROGRESS) -> list[ServeRow]:  # fmt: skip
    """`server`: a started `specchat.server.server.Server` whose model has loaded."""
    served = server.worker.served
    step("the engine directly")
    for prompt in prompts:  # a pass untimed: the first answers after loading pay one-time costs
        _direct(server.worker, served, prompt, max_tokens)
    started = time.perf_counter()
    direct_tokens = sum(_direct(server.worker, served, prompt, max_tokens) for prompt in prompts)
    direct = direct_tokens / (time.perf_counter() - started)
    rows = []
    for count in clients:
        step(f"{count} client{'s' * (count > 1)}")
        answers: list[_Answer] = []
        lock = threading.Lock()

        def client() -> None:
            for prompt in prompts:
                answer = _streamed(server, served.name, prompt, max_tokens)
                with lock:
                    answers.append(answer)

        started = time.perf_counter()
        threads = [threading.Thread(target=client) for _ in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        seconds = time.perf_counter() - started
        tokens = sum(answer.tokens for answer in answers)
        gaps = [(a.last - a.first) / (a.tokens - 1) for a in answers if a.tokens > 1]
        rows.append(ServeRow(
            clients=count, requests=len(answers), tokens=tokens, seconds=round(seconds, 3),
            tokens_per_second=round(tokens / seconds, 2),
            ttft_ms=round(1000 * statistics.median(a.first for a in answers), 1),
            itl_ms=round(1000 * statistics.fmean(gaps), 2) if gaps else 0.0,
            direct_tokens_per_second=round(direct, 2),
            overhead=round(direct / (tokens / seconds) - 1, 4) if count == 1 else None,
        ))  # fmt: skip
    return rows


def _direct(worker, served, prompt: str, max_tokens: int) -> int:
    """Tokens of one greedy answer generated through the worker's queue, no HTTP (the engine's own thread)."""
    from specchat.engine.prompt import encode_chat
    from specchat.server.worker import Ended, Job

    items: queue.Queue = queue.Queue()
    ids = encode_chat(served.tokenizer, [{"role": "user", "content": prompt}])
    worker.submit(Job(ids, SamplingConfig(), max_tokens, (), deliver=items.put))
    tokens = 0
    while not isinstance(item := items.get(), Ended):
        tokens += len(item.tokens)
    return tokens


def _streamed(server, model: str, prompt: str, max_tokens: int) -> _Answer:
    """One greedy chat completion streamed over HTTP, timed by the client."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "temperature": 0,
            "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    connection = http.client.HTTPConnection(server.host, server.port, timeout=600)
    sent = time.perf_counter()
    connection.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    first = last = None
    tokens = 0
    for line in response:
        if not line.startswith(b"data: {"):
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        elif chunk["choices"] and chunk.get("specchat", {}).get("origins"):  # a chunk of tokens
            last = time.perf_counter() - sent
            first = first if first is not None else last
    connection.close()
    return _Answer(tokens, first or 0.0, last or 0.0)
