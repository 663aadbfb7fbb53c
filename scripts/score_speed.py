"""Measures scoring a text (what `echo` with `logprobs` answers, lm-eval's loglikelihood) against llama.cpp (not a
test: prints a table and JSON).

The text is `--tokens` tokens of the Python standard library's source (`bench logits`'s). Ours: the engine's
`prompt_logprobs` (the server's path), the second of two runs; llama.cpp: llama-cpp-python's forward over the same
ids with `logits_all`, the second of two runs (its own `echo` with `logprobs` took 181 s for 1K tokens here, and
its log-probabilities gave the text a perplexity of about 5 million). Each row gives
the seconds, prompt tokens a second and the text's perplexity (the mean negative log-likelihood, exponentiated),
which should agree to the quantization's rounding.

    .venv/bin/python scripts/score_speed.py --model qwen2.5-coder-1.5b --tokens 1024
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from specchat.bench.logits import text_ids  # noqa: E402
from specchat.loading import load_model  # noqa: E402
from specchat.session import Session  # noqa: E402


def ours(loaded, ids: list[int]) -> dict:
    engine = Session.over(loaded, max_len=len(ids) + 8, drafter="none").engine
    for _ in range(2):
        start = time.perf_counter()
        scored = engine.prompt_logprobs(ids, 1)
        seconds = time.perf_counter() - start
    return _row("specchat", seconds, [entry.logprob for entry in scored[1:]])


def llamacpp(path: str, ids: list[int]) -> dict:
    """llama.cpp's forward over the ids with every row's logits kept (as llama-perplexity scores a text), then
    their log-softmax at each next token."""
    from llama_cpp import Llama

    llm = Llama(path, n_ctx=len(ids) + 8, n_batch=512, logits_all=True, n_threads=torch.get_num_threads(),
                verbose=False)  # fmt: skip
    for _ in range(2):
        llm.reset()
        start = time.perf_counter()
        llm.eval(ids)
        logits = torch.from_numpy(llm.scores[: len(ids) - 1]).float()
        logprobs = logits.log_softmax(-1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()
        seconds = time.perf_counter() - start
    return _row("llama.cpp", seconds, logprobs)


def _row(method: str, seconds: float, logprobs: list[float]) -> dict:
    return {"method": method, "tokens": len(logprobs) + 1, "seconds": round(seconds, 3),
            "tokens_per_second": round((len(logprobs) + 1) / seconds, 1),
            "perplexity": round(math.exp(-sum(logprobs) / len(logprobs)), 4)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--tokens", type=int, default=1024)
    args = parser.parse_args()
    loaded = load_model(args.model)
    ids = text_ids(loaded.tokenizer, args.tokens)
    rows = [ours(loaded, ids), llamacpp(str(loaded.source.gguf_path()), ids)]
    for row in rows:
        print(f"{row['method']:>10}  {row['seconds']:7.2f} s  {row['tokens_per_second']:7.1f} tok/s  "
              f"perplexity {row['perplexity']}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
