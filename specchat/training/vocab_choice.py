"""Which draft vocabulary a trained drafter ships with: the size whose real decoding is fastest here.

A smaller vocabulary makes every draft forward cheaper (the LM head over fewer rows) and loses the rare
tokens it cannot propose; what a user sees is the product, tau times steps per second. So each size is
measured as greedy decoding through the engine on held-out prompts, autoregressive decoding in the same run,
and the fastest wins. The sizes are nested (the most frequent tokens of the training answers, EOS always
in), so one trained model serves them all by taking those rows of the LM head.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specchat.bench.runs import engine_run
from specchat.drafters.longspec.drafter import LongSpecDrafter
from specchat.drafters.longspec.model import LongSpecLayer
from specchat.engine.generate import Engine

VOCAB_SIZES = (8192, 16384, 32768, 0)  # 0: the target's whole vocabulary


def measure_vocabs(loaded, layer: LongSpecLayer, vocabs: dict[int, torch.Tensor], prompts: list[list[int]], *,
                   max_new_tokens: int = 128,
                   progress: Callable[[str], None] = lambda _what: None) -> list[dict]:  # fmt: skip
    """One row per draft vocabulary (`vocabs`: size -> sorted ids, 0 the full one), and AR's first: decode
    tokens/s over `prompts`, tau, and the speedup over AR measured in this run."""
    engine = Engine(loaded.model, loaded.tokenizer, max_len=max(map(len, prompts)) + max_new_tokens)
    rows = []
    for size, vocab in [(None, None), *vocabs.items()]:
        progress("autoregressive" if size is None else f"draft vocabulary {size or 'full'}")
        drafter = (None if size is None
                   else LongSpecDrafter(engine.target, layer, draft_vocab=None if size == 0 else vocab))
        engine.set_drafter(drafter)
        runs = [engine_run(engine, ids, max_new_tokens) for ids in prompts]
        tokens, seconds = sum(r.decode_tokens for r in runs), sum(r.decode_seconds for r in runs)
        steps = sum(r.steps for r in runs)
        rows.append({"vocab": "AR" if size is None else size or engine.target.config.vocab_size,
                     "tau": tokens / steps if steps else 0.0, "tokens_per_second": tokens / seconds})  # fmt: skip
    for row in rows:
        row["speedup"] = row["tokens_per_second"] / rows[0]["tokens_per_second"]
    return rows


def best_vocab(rows: list[dict]) -> int:
    """The size of the fastest draft vocabulary among `rows` (AR's row excluded)."""
    return max((row for row in rows if row["vocab"] != "AR"), key=lambda row: row["tokens_per_second"])["vocab"]
