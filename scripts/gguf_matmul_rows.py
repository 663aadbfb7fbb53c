"""Time every matrix a decode step of a GGUF model reads (the output head included, the embedding not) through
the GGUF kernels, by block type and number of activation rows: what a tree of that many rows costs in matmuls
against one row, and how close one row comes to the memory's speed. Medians over repeats, each repeat every
row count in turn. The model is Qwen2.5-Coder-1.5B Q4_K_M unless --gguf names another file; --synthetic times
one random 8960 x 1536 matrix (the 1.5B's MLP shape) of every block type instead.

    python scripts/gguf_matmul_rows.py [--gguf FILE | --synthetic] [--rows 1,2,4,8,16] [--repeats 7]
                                     [--path best|avx2|portable] [--untiled-q6]

--untiled-q6 runs Q6_K a row at a time, as before it had tiles.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' helpers
from gguf_files import random_blocks  # noqa: E402

from specchat.kernels.cpu.cpu_decoder import cpu_decoder
from specchat.quant.gguf_model import gguf_tensors
from specchat.quant.gguf_types import BLOCK_TYPES, Q6_K

FILE = Path.home() / ".cache/specchat/gguf/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"


def matrices(path: Path, untiled_q6: bool) -> list[tuple[torch.Tensor, int, int, int, str, int]]:
    """(blocks, type, unit rows, columns, block type name, bytes) of every block-quantized matrix but the
    embedding, held as GGUFLinear holds them (tiled)."""
    decoder, held = cpu_decoder(), []
    for tensor in gguf_tensors(path):
        kind = int(tensor.tensor_type)
        if tensor.name == "token_embd.weight" or kind not in BLOCK_TYPES:
            continue
        blocks, columns = torch.from_numpy(tensor.data), tensor.shape[0]
        name, units = BLOCK_TYPES[kind].name.upper(), 1
        if not (kind == Q6_K and untiled_q6):
            blocks, units = decoder.gguf_tile(blocks, kind, columns)
        held.append((blocks, kind, units, columns, name, blocks.numel()))
    return held


def synthetic(untiled_q6: bool) -> list[tuple[torch.Tensor, int, int, int, str, int]]:
    """One random 8960 x 1536 matrix of every block type, held as `matrices` holds a file's."""
    decoder, held, rng = cpu_decoder(), [], np.random.default_rng(0)
    for kind, block in BLOCK_TYPES.items():
        blocks, units = torch.from_numpy(random_blocks(kind, 8960, 1536, rng)), 1
        if not (kind == Q6_K and untiled_q6):
            blocks, units = decoder.gguf_tile(blocks, kind, 1536)
        held.append((blocks, kind, units, 1536, block.name.upper(), blocks.numel()))
    return held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, default=FILE)
    parser.add_argument("--synthetic", action="store_true")
    parser.add_argument("--rows", default="1,2,4,8,16")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--path", default="best", choices=["best", "avx2", "unpacked", "portable"])
    parser.add_argument("--untiled-q6", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(2)
    held = synthetic(args.untiled_q6) if args.synthetic else matrices(args.gguf, args.untiled_q6)
    counts = [int(n) for n in args.rows.split(",")]
    names = sorted({name for *_, name, _ in held})
    sizes = {name: sum(size for *_, n, size in held if n == name) for name in names}
    inputs = {(n, cols): torch.randn(n, cols) for n in counts for cols in {c for _, _, _, c, _, _ in held}}
    times: dict[tuple[int, str], list[float]] = defaultdict(list)
    for _ in range(args.repeats):
        for n in counts:
            spent: dict[str, float] = defaultdict(float)
            for blocks, kind, units, cols, name, _ in held:
                start = time.perf_counter()
                cpu_decoder().gguf_matmul(inputs[n, cols], [blocks], [kind], [units], cols, args.path)
                spent[name] += time.perf_counter() - start
            for name in names:
                times[n, name].append(spent[name])
    for n in counts:
        medians = {name: statistics.median(times[n, name]) for name in names}
        parts = "  ".join(
            f"{name} {t * 1e3:6.1f} ms ({sizes[name] / t / 1e9:4.1f} GB/s)" for name, t in medians.items()
        )
        print(f"{n:3d} rows: {parts}  all {sum(medians.values()) * 1e3:6.1f} ms")


if __name__ == "__main__":
    main()
