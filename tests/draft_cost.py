"""Draft cost of a random-weight LongSpec draft on the default model, as it runs by default (4-bit, CPU).

Per context (1K, 6K tokens) and draft vocabulary (the full 49152, 16K, 8K): median ms of one proposal at tree
budgets 7, 15 and 63 (beam), against one decode step and one verification of the same tree; draft memory.
Run: HF_HUB_OFFLINE=1 .venv/bin/python tests/draft_cost.py
"""

from __future__ import annotations

import json
import time

import torch

from specchat.drafters.longspec.drafter import LongSpecDrafter
from specchat.drafters.longspec.model import LongSpecConfig, LongSpecLayer
from specchat.engine.generate import Engine
from specchat.engine.sampling import SamplingConfig
from specchat.loading import load_model


def median_ms(call, repeats: int = 5) -> float:
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return round(sorted(times)[len(times) // 2] * 1000, 2)


def main() -> None:
    loaded = load_model(None, dtype="auto", device="cpu")
    text = open(torch.__file__.replace("__init__.py", "functional.py")).read()
    ids = loaded.tokenizer.encode(text)
    torch.manual_seed(0)
    layer = LongSpecLayer(LongSpecConfig.for_target(loaded.model.config))
    weight_bytes = sum(p.numel() for p in layer.parameters()) * 2  # bf16
    rows = []
    for context in (1000, 6000):
        engine = Engine(loaded.model, loaded.tokenizer, max_len=context + 80)
        list(engine.generate(ids[:context], max_new_tokens=1))
        decode = engine.autoregressive_step_seconds(repeats=5) * 1000
        for vocab in (None, 16384, 8192):
            drafter = LongSpecDrafter(engine.target, layer, draft_vocab=None if vocab is None else torch.arange(vocab))
            engine.set_drafter(drafter)
            list(engine.generate(ids[:context], max_new_tokens=1))  # the drafter sees the request
            row = {"context": context, "draft_vocab": vocab or 49152, "decode_ms": round(decode, 2),
                   "draft_memory_mib": round((drafter.memory_bytes() + weight_bytes
                                              + (0 if vocab is None else vocab * 576 * 2)) / 2**20, 2)}
            for budget in (7, 15, 63):
                with torch.inference_mode():
                    row[f"draft_ms_{budget}"] = median_ms(lambda: drafter.propose(budget, SamplingConfig()))
            rows.append(row)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
