"""Time every matrix a decode step of Qwen2.5-Coder-1.5B Q4_K_M reads (its Q4_K and Q6_K matrices, the output
head included, the embedding not) through the GGUF kernels, by the number of activation rows: what a tree of
that many rows costs in matmuls against one row. Medians over repeats, each repeat every row count in turn.

    python tests/gguf_matmul_rows.py [--rows 1,2,4,8,16] [--repeats 7] [--path best|avx2|portable] [--untiled-q6]

--untiled-q6 runs Q6_K a row at a time, as before it had tiles.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from specchat.kernels.cpu_decoder import cpu_decoder
from specchat.quant.gguf_model import gguf_tensors
from specchat.quant.gguf_types import Q4_K, Q6_K, UNTILED

FILE = Path.home() / ".cache/specchat/gguf/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"


def matrices(untiled_q6: bool) -> list[tuple[torch.Tensor, int, int]]:
    """(blocks, type, columns) of every Q4_K / Q6_K matrix but the embedding, tiled as GGUFLinear holds them."""
    decoder, held = cpu_decoder(), []
    for tensor in gguf_tensors(FILE):
        kind = int(tensor.tensor_type)
        if tensor.name == "token_embd.weight" or kind not in (Q4_K, Q6_K):
            continue
        blocks, columns = torch.from_numpy(tensor.data), tensor.shape[0]
        if kind == Q4_K or not untiled_q6:
            blocks, kind = decoder.gguf_tile(blocks, kind, columns)
        held.append((blocks, kind, columns))
    return held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,2,4,8,16")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--path", default="best", choices=["best", "avx2", "portable"])
    parser.add_argument("--untiled-q6", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(2)
    held, counts = matrices(args.untiled_q6), [int(n) for n in args.rows.split(",")]
    inputs = {(n, cols): torch.randn(n, cols) for n in counts for cols in {c for _, _, c in held}}
    times: dict[int, list[tuple[float, float]]] = {n: [] for n in counts}
    for _ in range(args.repeats):
        for n in counts:
            q4 = q6 = 0.0
            for blocks, kind, cols in held:
                start = time.perf_counter()
                cpu_decoder().gguf_matmul(inputs[n, cols], [blocks], [kind], cols, args.path)
                elapsed = time.perf_counter() - start
                q4, q6 = (q4 + elapsed, q6) if UNTILED.get(kind, kind) == Q4_K else (q4, q6 + elapsed)
            times[n].append((q4, q6))
    for n in counts:
        q4 = statistics.median(t for t, _ in times[n]) * 1e3
        q6 = statistics.median(t for _, t in times[n]) * 1e3
        print(f"{n:3d} rows: Q4_K {q4:6.1f} ms  Q6_K {q6:6.1f} ms  all {q4 + q6:6.1f} ms")


if __name__ == "__main__":
    main()
