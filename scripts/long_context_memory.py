"""What a session at a long context holds: the engine's KV cache (its bytes as allocated, and the process's resident
memory it added), then a prompt of random tokens prefilled and greedy tokens decoded (tok/s, peak resident memory).
Sliding-window layers hold their window alone; every other layer, every position.

    python scripts/long_context_memory.py MODEL.gguf MAX_LEN [PROMPT_TOKENS=16] [NEW_TOKENS=32]
"""

from __future__ import annotations

import resource
import sys

import psutil
import torch

from specchat.engine.generate import Engine
from specchat.engine.sampling_config import SamplingConfig
from specchat.loading import load_model


def main(path: str, max_len: int, prompt_tokens: int = 16, new_tokens: int = 32) -> None:
    loaded = load_model(path)
    before = psutil.Process().memory_info().rss
    engine = Engine(loaded.model, loaded.tokenizer, max_len=max_len)
    prompt = torch.randint(300, 40000, (prompt_tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    events = list(engine.generate(prompt, sampling=SamplingConfig(), max_new_tokens=new_tokens))
    stats = events[-1].stats
    held = sum(keys.nbytes + values.nbytes for _, keys, values in engine.cache.stacks)
    added = psutil.Process().memory_info().rss - before
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"{engine.max_len} positions: KV cache {held / 2**20:.1f} MiB (resident +{added / 2**20:.0f} MiB, peak "
          f"{peak / 2**20:.0f} MiB); prefill {prompt_tokens / stats.prefill_seconds:.1f} tok/s, decode "
          f"{stats.tokens_per_second:.2f} tok/s over {stats.new_tokens} tokens")


if __name__ == "__main__":
    main(sys.argv[1], *(int(arg) for arg in sys.argv[2:5]))
