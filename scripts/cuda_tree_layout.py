"""TokenSwift's tree laid out on the device (`heads_tree`: about a hundred small kernels queued, no wait; on a GPU
also replayed as one CUDA graph, as the drafter replays it) against on the host (`host_tree`: one read, then
Python), a proposal of 15 nodes below the draft forward's token from 3 levels of guesses and 20 4-grams. Per
proposal: the host's time to queue it (the host layout's includes its read), the time until the device has run it,
and with its nodes read as the acceptance reads them. The device layout's queueing overlaps the draft forward's
weight read on a GPU; its run time is what it adds to a step there.
`python scripts/cuda_tree_layout.py` on a CUDA machine (a CPU runs it too, without the graph).
"""

import random
import time

import torch

from specchat.drafters.tokenswift.device_ngrams import DeviceNgrams
from specchat.drafters.tokenswift.heads_tree import heads_tree, host_tree, product_levels
from specchat.drafters.tokenswift.ngram_table import NgramTable
from specchat.engine.cuda_graphs import capture

KINDS = ("tokenswift", "ngram")
DEPTH = 4  # below the draft forward's token, 3 levels or 3 tokens of a gram


def layouts(device: torch.device) -> dict:
    rng = random.Random(0)
    table = NgramTable(lag=16)
    table.add([rng.randrange(50) for _ in range(4000)])  # a text whose tokens repeat: 20 continuations a token
    mirror = DeviceNgrams(table, device)
    values = torch.rand(3, 3, device=device).sort(descending=True).values
    tokens = torch.randint(0, 50, (3, 3), device=device)
    levels = product_levels(values, tokens)
    start = torch.tensor([7], device=device)
    below = (start, torch.tensor([0.9], device=device))

    def on_device():
        mirror.update()
        return heads_tree(levels, *mirror.lookup(start), 15, below).tree(KINDS, DEPTH)

    timed = {"device": on_device, "host": lambda: host_tree(levels, table, 15, KINDS, below, 7)}
    if device.type == "cuda":
        graph, out = capture(lambda: heads_tree(levels, *mirror.lookup(start), 15, below))

        def replayed():
            graph.replay()
            return out.copy().tree(KINDS, DEPTH)

        timed["graph"] = replayed
    return timed


def main(proposals: int = 300) -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    synchronize = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    print(f"{'layout':>6} {'queued ms':>9} {'run ms':>7} {'read ms':>7}  ({device}, 15 of 100 candidates)")
    for name, layout in layouts(device).items():
        for _ in range(30):
            layout().tokens
        synchronize()
        start = time.perf_counter()
        for _ in range(proposals):
            layout()
        queued = time.perf_counter() - start
        synchronize()
        run = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(proposals):
            layout().tokens
        read = time.perf_counter() - start
        print(f"{name:>6} {queued / proposals * 1e3:9.3f} {run / proposals * 1e3:7.3f} {read / proposals * 1e3:7.3f}")


if __name__ == "__main__":
    main()
