"""Prefill of a GGUF file (Qwen2.5-Coder-1.5B Q4_K_M unless named) against llama.cpp's prompt processing of the
same tokens, alternating round by round in one process: the first N tokens of the long bench text (the Python
reference manual), ours through `Engine.target_states`, llama.cpp through llama-cpp-python's `eval` (2 threads,
batches of 512).

    python scripts/prefill_vs_llamacpp.py [N=4096] [ROUNDS=3] [FILE]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
from llama_cpp import Llama

from specchat.bench.prompts import long_prompts
from specchat.engine.generate import Engine
from specchat.loading import load_model

FILE = Path.home() / ".cache/specchat/gguf/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"


def main(tokens: int = 4096, rounds: int = 3, file: Path = FILE) -> None:
    torch.set_num_threads(2)
    loaded = load_model(str(file))
    engine = Engine(loaded.model, loaded.tokenizer, max_len=tokens + 64)
    ids = loaded.tokenizer.encode(long_prompts(tokens + 2000)[0])[:tokens]
    llama = Llama(str(file), n_ctx=tokens + 64, n_threads=2, n_batch=512, verbose=False)
    ours, theirs = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        engine.target_states(ids)
        ours.append(tokens / (time.perf_counter() - start))
        llama.reset()
        start = time.perf_counter()
        llama.eval(ids)
        theirs.append(tokens / (time.perf_counter() - start))
        print(f"ours {ours[-1]:.1f} tok/s, llama.cpp {theirs[-1]:.1f} tok/s", flush=True)
    mine, its = statistics.median(ours), statistics.median(theirs)
    print(f"{tokens} tokens: ours {mine:.1f} tok/s, llama.cpp {its:.1f} tok/s, ratio {mine / its:.2f}")


if __name__ == "__main__":
    main(*(int(arg) for arg in sys.argv[1:3]), *(Path(arg) for arg in sys.argv[3:4]))
