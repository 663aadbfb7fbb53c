"""`specchat bench context`: autoregressive time per token as the context grows (only attention should grow).

Each context is a prompt of that many tokens, decoded `steps` tokens further by our engine without a drafter,
`repeats` times after a warm-up run; the time is the engine's own decode time (prefill excluded), so it is
what whole decode steps cost: the forward, sampling and the commit.
"""

from __future__ import annotations

from collections.abc import Callable

from specchat.bench.progress import NO_PROGRESS
from specchat.bench.runs import engine_run
from specchat.engine.generate import Engine
from specchat.loading import LoadedModel


def decode_cost(loaded: LoadedModel, contexts: list[int], *, steps: int, repeats: int,
                step: Callable[[str], None] = NO_PROGRESS) -> list[dict]:  # fmt: skip
    """Milliseconds per decoded token with `context` tokens already in the cache; `step` hears each run."""
    filler = loaded.tokenizer.encode(" ".join(["The lighthouse keeper wrote in the log every night."] * 4))
    engine = Engine(loaded.model, loaded.tokenizer, max_len=max(contexts) + steps + 1)
    rows = []
    for context in contexts:
        prompt = (filler * (context // len(filler) + 1))[:context]
        runs = []
        for repeat in range(repeats + 1):  # the first: warm-up
            step(f"context {context}: {'warm-up' if repeat == 0 else f'repeat {repeat}/{repeats}'}")
            runs.append(engine_run(engine, prompt, steps + 1))
        runs = runs[1:]
        seconds = sum(r.decode_seconds for r in runs)
        rows.append({"context": context, "ms_per_token": round(1000 * seconds / sum(r.decode_tokens for r in runs), 2)})
    return rows
