"""Interleaved A/B of CPU decoder builds on the engine's whole forward (Qwen2.5-Coder-1.5B Q4_K_M unless `gguf=FILE`):
ms per forward over a chain of each size in `tree` (0 = a decode step) at `context` random cached tokens, median of
`repeats` rounds, each round every size and build in turn, the builds' order turning from round to round; and a
check that every build's logits are bitwise the same. Processes started one after another see this machine's memory
at different speeds (a step's time drifts 10-30% between them), so a change's effect is measured in one process.
Each build is named by its source version (the suffix of its directory under torch's extension root, built once by
`cpu_decoder()` in that checkout) and holds the matrices as this checkout tiled them:

    python scripts/forward_ab.py 9 before=f9456ebbf2b3 after=<version> [tree=0,1,3,7] [context=512] [gguf=FILE]
"""

import statistics
import sys
import time
from pathlib import Path

import torch
from gguf_matmul_ab import load_build

from specchat.bench.verify_cost import fill_cache
from specchat.engine.generate import Engine
from specchat.engine.lean_forward import LeanForward
from specchat.engine.verify_forward import verification_forward
from specchat.loading import load_model

FILE = Path.home() / ".cache/specchat/gguf/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
CALLS = 3  # forwards of one size and build in a row, timed as one


def main() -> None:
    torch.set_num_threads(2)
    repeats, trees, context, file, builds = int(sys.argv[1]), [0, 1, 3, 7], 512, FILE, {}
    for arg in sys.argv[2:]:
        name, value = arg.split("=")
        if name == "tree":
            trees = [int(n) for n in value.split(",")]
        elif name == "context":
            context = int(value)
        elif name == "gguf":
            file = Path(value)
        else:
            builds[name] = load_build(value)
    loaded = load_model(str(file))
    engine = Engine(loaded.model, loaded.tokenizer, max_len=context + max(trees) + 1)
    forwards = {name: LeanForward(loaded.model, build) for name, build in builds.items()}
    times = {(name, nodes): [] for name in builds for nodes in trees}
    with torch.inference_mode():
        fill_cache(engine.cache, context, loaded.model.config, loaded.model.dtype, engine.device)
        calls = {(name, nodes): verification_forward(_engine_forward(forward, engine.cache), engine.cache,
                                                     engine.device, tree=nodes)
                 for name, forward in forwards.items() for nodes in trees}  # fmt: skip
        for nodes in trees:
            logits = [calls[name, nodes]().logits for name in builds]
            assert all(torch.equal(logits[0], other) for other in logits[1:]), f"builds differ at {nodes} nodes"
        names = list(builds)
        for round_ in range(repeats):
            order = names[round_ % len(names):] + names[:round_ % len(names)]
            for nodes in trees:
                for name in order:
                    start = time.perf_counter()
                    for _ in range(CALLS):
                        calls[name, nodes]()
                    times[name, nodes].append((time.perf_counter() - start) / CALLS * 1e3)
    print(f"ms per forward at {context} tokens, median of {repeats} rounds (logits bitwise equal)")
    print("nodes " + " ".join(f"{name:>10}" for name in builds))
    for nodes in trees:
        print(f"{nodes:5} " + " ".join(f"{statistics.median(times[name, nodes]):10.2f}" for name in builds))


def _engine_forward(forward: LeanForward, cache):
    """`forward` with the engine's signature (`verification_forward` calls it so)."""
    return lambda tokens, *, positions, tree_mask: forward(tokens, positions, tree_mask, cache)


if __name__ == "__main__":
    main()
