"""Times the sampling pipeline a decode step runs on a 152K-token vocabulary (Qwen2.5's) per number of rows
(not a test: prints a table): `process_rows` (penalty, temperature, top-k, top-p, min-p) and `PositionNoise.choose`
(the keyed race every sampled draw runs), under the settings a chat uses by default (Qwen's; Llama 3.1's, top-p
without a top-k; SmolLM2's, a low temperature) and the writer's.

    .venv/bin/python scripts/sampling_speed.py [rows=1,4,8]
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from specchat.engine.keyed_draws import PositionNoise
from specchat.engine.sampling import process_rows
from specchat.engine.sampling_config import SamplingConfig
from specchat.writer.settings import SAMPLING

VOCAB = 151_936
SETTINGS = {
    "chat (Qwen's defaults)": SamplingConfig(temperature=0.7, top_k=20, top_p=0.8, penalty=1.05),
    "chat (Llama 3.1's defaults)": SamplingConfig(temperature=0.6, top_p=0.9),
    "chat (SmolLM2's defaults)": SamplingConfig(temperature=0.2, top_p=0.9),
    "writer (TokenSwift's)": SamplingConfig(**SAMPLING),
}


def milliseconds(work, rounds: int = 30) -> float:
    for _ in range(3):
        work()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        work()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    torch.set_num_threads(2)
    rows = [int(n) for n in sys.argv[1].split("=")[1].split(",")] if len(sys.argv) > 1 else [1, 4, 8]
    noise = PositionNoise(5)
    print("| settings | rows | process_rows ms | keyed choose ms |")
    print("|---|---|---|---|")
    for name, config in SETTINGS.items():
        for n in rows:
            logits = torch.randn(n, VOCAB, generator=torch.Generator().manual_seed(n)) * 3
            history = torch.randint(0, VOCAB, (n, 256), generator=torch.Generator().manual_seed(n + 1))
            processed = process_rows(logits, config, history)
            indices = list(range(100, 100 + n))
            process = milliseconds(lambda: process_rows(logits, config, history))
            keyed = milliseconds(lambda: noise.choose(processed, indices))
            print(f"| {name} | {n} | {process:.2f} | {keyed:.2f} |")


if __name__ == "__main__":
    main()
