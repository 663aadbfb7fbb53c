"""Embeddings of Qwen2.5-Coder-1.5B Q4_K_M against llama.cpp's of the same texts: COUNT passages of about TOKENS
tokens cut from the long bench text (the Python reference manual), as a retrieval index is built. Ours through
`Engine.embedding` (what `/v1/embeddings` and `/api/embed` serve), llama.cpp's through llama-cpp-python's `embed`
(2 threads): its tokens' final-norm outputs, averaged here (its own mean pooling aborts on this model in 0.3.36's
`build_pooling`); both scaled to unit length. Prints each side's tokens/s and how close the two
vectors of each passage are (cosine similarity), then, as a retrieval check, how often a passage's nearest other
passage is the same under both.

    python scripts/embedding_vs_llamacpp.py [COUNT=16] [TOKENS=256]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import llama_cpp
import torch
from llama_cpp import Llama

from specchat.bench.prompts import long_prompts
from specchat.engine.generate import Engine
from specchat.loading import load_model

FILE = Path.home() / ".cache/specchat/gguf/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"


def main(count: int, tokens: int) -> None:
    torch.set_num_threads(2)
    loaded = load_model("qwen2.5-coder-1.5b")
    tokenizer = loaded.tokenizer
    ids = tokenizer.encode(long_prompts(count * tokens + 2000)[0])
    texts = [tokenizer.decode(ids[i * tokens : (i + 1) * tokens]) for i in range(count)]
    engine = Engine(loaded.model, tokenizer, max_len=2 * tokens + 64)
    llama = Llama(str(FILE), embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_NONE, n_ctx=2 * tokens + 64,
                  n_batch=2 * tokens + 64, n_ubatch=2 * tokens + 64, n_threads=2, verbose=False)  # fmt: skip
    counted = sum(len(tokenizer.encode(text)) for text in texts)
    start = time.perf_counter()
    ours = torch.stack([torch.nn.functional.normalize(engine.embedding(tokenizer.encode(t)), dim=0)
                        for t in texts])
    our_seconds = time.perf_counter() - start
    start = time.perf_counter()
    theirs = torch.stack([torch.nn.functional.normalize(torch.tensor(llama.embed(text)).mean(dim=0), dim=0)
                          for text in texts])  # fmt: skip
    their_seconds = time.perf_counter() - start
    agreement = (ours * theirs).sum(dim=1)
    print(f"{count} passages, {counted} tokens: ours {counted / our_seconds:.1f} tok/s, "
          f"llama.cpp {counted / their_seconds:.1f} tok/s, ratio {their_seconds / our_seconds:.2f}")  # fmt: skip
    print(f"cosine of ours to llama.cpp's: mean {agreement.mean():.4f}, least {agreement.min():.4f}")
    nearest = [(vectors @ vectors.T).fill_diagonal_(-2).argmax(dim=1) for vectors in (ours, theirs)]
    print(f"nearest other passage the same: {int((nearest[0] == nearest[1]).sum())} of {count}")


if __name__ == "__main__":
    main(*(int(arg) for arg in sys.argv[1:3]))
