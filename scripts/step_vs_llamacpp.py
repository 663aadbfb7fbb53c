"""A decode step of a GGUF file (Qwen2.5-Coder-1.5B Q4_K_M unless named) against llama.cpp's, alternating in one
process (the memory's speed drifts from one minute to the next here): each round eight of our steps over a cache of
`context` random keys and values (the engine's forward, rolled back after each), then eight of llama.cpp's after a
prompt of as many tokens (llama-cpp-python's `eval`, 2 threads); the median of each and of their ratio.

    python scripts/step_vs_llamacpp.py [CONTEXT=512] [ROUNDS=15] [FILE]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
from llama_cpp import Llama

from specchat.bench.verify_cost import fill_cache, verification_forward
from specchat.engine.generate import Engine
from specchat.loading import load_model

FILE = Path.home() / ".cache/specchat/gguf/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
STEPS = 8  # each side's steps a round


def main(context: int = 512, rounds: int = 15, file: Path = FILE) -> None:
    torch.set_num_threads(2)
    loaded = load_model(str(file))
    engine = Engine(loaded.model, loaded.tokenizer, max_len=context + STEPS + 1)
    llama = Llama(str(file), n_ctx=context + STEPS + 1, n_threads=2, verbose=False)
    llama.eval(list(range(1000, 1000 + context)))
    ours, theirs = [], []
    with torch.inference_mode():
        fill_cache(engine.cache, context, engine.model.config, engine.model.dtype, engine.device)
        step = verification_forward(engine._forward, engine.cache, engine.device, tree=0)
        step()
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(STEPS):
                step()
            ours.append((time.perf_counter() - start) / STEPS)
            llama.n_tokens = context  # back to the prompt: each round's steps at the same positions
            start = time.perf_counter()
            for i in range(STEPS):
                llama.eval([2000 + i])
            theirs.append((time.perf_counter() - start) / STEPS)
    ratios = [their / our for our, their in zip(ours, theirs)]
    print(f"a step at {context} tokens: ours {statistics.median(ours) * 1e3:.1f} ms ({min(ours) * 1e3:.1f}-"
          f"{max(ours) * 1e3:.1f}), llama.cpp {statistics.median(theirs) * 1e3:.1f} ms ({min(theirs) * 1e3:.1f}-"
          f"{max(theirs) * 1e3:.1f}); llama.cpp's time / ours {statistics.median(ratios):.2f} "
          f"({min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main(*(int(arg) for arg in sys.argv[1:3]), *(Path(arg) for arg in sys.argv[3:4]))
