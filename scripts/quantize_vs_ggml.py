"""`--quantize q4_k_m`'s blocks against ggml's own quantizer on a real model's matrices: every block-quantized matrix
of a GGUF file, dequantized by gguf-py (the dense values), quantized to the type llama-quantize's Q4_K_M gives it
(`quant/gguf_quantize.py`) by specchat and by ggml (llama-cpp-python's library, `ggml_quantize_chunk`, no importance
matrix). Per type: the blocks that come out byte for byte the same, each side's RMS error over the RMS value, and
the time (specchat on every thread, ggml on one).

    python scripts/quantize_vs_ggml.py [FILE]      # the Qwen2.5-Coder-0.5B Q4_K_M file unless named
"""

from __future__ import annotations

import ctypes
import sys
import time
from collections import defaultdict
from pathlib import Path

import llama_cpp
import numpy as np
import torch
from gguf import GGMLQuantizationType, dequantize

from specchat.kernels.cpu.cpu_decoder import cpu_decoder
from specchat.quant.gguf_model import gguf_tensors
from specchat.quant.gguf_quantize import SCHEMES, block_type, more_bits
from specchat.quant.gguf_types import BLOCK_TYPES

FILE = Path.home() / ".cache/specchat/gguf/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def recipe_type(name: str, layers: int) -> int:
    """The type llama-quantize's Q4_K_M gives a tensor of this name."""
    base, more = SCHEMES["q4_k_m"]
    if name == "output.weight":
        return more
    if name.endswith(("attn_v.weight", "ffn_down.weight")) and more_bits(int(name.split(".")[1]), layers):
        return more
    return base


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else FILE
    library = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    library.ggml_quantize_chunk.restype = ctypes.c_size_t
    library.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                            ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]  # fmt: skip
    tensors = [t for t in gguf_tensors(path) if int(t.tensor_type) in BLOCK_TYPES]
    layers = 1 + max(int(t.name.split(".")[1]) for t in tensors if t.name.startswith("blk."))
    totals = defaultdict(lambda: np.zeros(7))  # blocks, identical, squared errors ours / ggml, squares, seconds x2
    for tensor in tensors:
        rows, columns = int(tensor.shape[1]), int(tensor.shape[0])
        kind = block_type(recipe_type(tensor.name, layers), columns)
        dense = dequantize(tensor.data, tensor.tensor_type).reshape(rows, columns).astype(np.float32)
        start = time.perf_counter()
        ours = cpu_decoder().gguf_quantize(torch.from_numpy(dense), kind).numpy()
        middle = time.perf_counter()
        theirs = np.zeros_like(ours)
        library.ggml_quantize_chunk(kind, dense.ctypes.data, theirs.ctypes.data, 0, rows, columns, None)
        end = time.perf_counter()
        width = BLOCK_TYPES[kind].bytes
        back = [dequantize(blocks, GGMLQuantizationType(kind)).reshape(rows, columns) for blocks in (ours, theirs)]
        total = totals[BLOCK_TYPES[kind].name]
        total += [ours.size // width, (ours.reshape(-1, width) == theirs.reshape(-1, width)).all(1).sum(),
                  ((back[0] - dense) ** 2).sum(), ((back[1] - dense) ** 2).sum(), (dense**2).sum(),
                  middle - start, end - middle]  # fmt: skip
    print(f"{path.name}: each matrix at llama-quantize's Q4_K_M type, specchat ({torch.get_num_threads()} threads) "
          "against ggml (1 thread)")  # fmt: skip
    for name, (blocks, same, ours, theirs, squares, ours_s, theirs_s) in sorted(totals.items()):
        print(f"  {name}: {int(blocks)} blocks, {same / blocks:.4f} identical; relative RMS error "
              f"{np.sqrt(ours / squares):.5f} against {np.sqrt(theirs / squares):.5f}; {ours_s:.1f} s against "
              f"{theirs_s:.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()
