"""Interleaved A/B of CPU decoder builds on every block-quantized matrix a decode step of a GGUF model reads (the
output head included, the embedding not; Qwen2.5-Coder-1.5B Q4_K_M unless `gguf=FILE`): ms per forward's matrices by
activation rows, median of `repeats` rounds, each round every row count and build in turn (the builds' order turning
from round to round: on a Xeon the one measured second ran up to 9% faster), and a check that every
build's results are bitwise the same. Each build is named by its source version (`source_version()` of that
checkout, built once by `cpu_decoder()`) and holds the matrices tiled its own way (`gguf_tile`, which returns the
unit's rows, or the older one which returned a tiled type id 1xx / 2xx), all repacked before any timing.
`version:U:PATH` holds that build's matrices in units of U tiles (1 or 2; 0 its choice) and runs its kernels of PATH
(best, avx2, ...):

    python scripts/gguf_matmul_ab.py 7 before=cf8b56c4ebc7 after=<version> [rows=1,2,3,4,8,16]
    python scripts/gguf_matmul_ab.py 7 pairs=<version> tiles=<version>:1 [rows=1,2,4,8] [gguf=FILE] [types=12,14]

`bits=any` skips the check, for builds that hold a type in different forms (one in rows, one in tiles);
`dtype=bfloat16` feeds bf16 activations, fp32 by default; bf16 ones go through the decoder's `Projection` (builds since
a1ec111), products in bf16 as a forward's.
"""

import glob
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import get_default_build_root

from specchat.kernels.cpu.cpu_decoder import iq_grids
from specchat.quant.gguf_model import gguf_tensors
from specchat.quant.gguf_types import BLOCK_TYPES

FILE = Path.home() / ".cache/specchat/gguf/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"


def load_build(version: str):
    path = glob.glob(f"{get_default_build_root()}/specchat_cpu_decoder_{version}/*.so")[0]
    spec = importlib.util.spec_from_file_location(f"specchat_cpu_decoder_{version}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if hasattr(module, "iq_grids"):  # builds since the IQ1-IQ3 types read their codebooks from gguf-py's tables
        module.iq_grids(iq_grids())
    return module


def held_by(build, blocks: torch.Tensor, kind: int, cols: int, per_unit: int | None, path: str, dtype: torch.dtype):
    """A function of x: the matrix times x, as `build` holds the matrix (in units of `per_unit` tiles if given)."""
    options = {} if per_unit is None else {"per_unit": per_unit}  # older builds took no per_unit
    tiles, unit = build.gguf_tile(blocks, kind, cols, **options)
    if dtype == torch.bfloat16:
        assert path == "best", "a Projection runs the build's best path"
        return build.Projection([build.gguf_linear([tiles], [kind], [unit], cols, None)])
    if unit in (1, 8, 16):  # unit rows
        return lambda x: build.gguf_matmul(x, [tiles], [kind], [unit], cols, path)
    return lambda x: build.gguf_matmul(x, [tiles], [unit], cols, path)  # a tiled type id


def main() -> None:
    torch.set_num_threads(2)
    repeats, rows, file, types, checked = int(sys.argv[1]), [1, 2, 3, 4, 8, 16], FILE, set(BLOCK_TYPES), True
    dtype = torch.float32
    builds = {}  # name -> (build, tiles per unit or None, path)
    for arg in sys.argv[2:]:
        name, value = arg.split("=")
        if name == "rows":
            rows = [int(n) for n in value.split(",")]
        elif name == "gguf":
            file = Path(value)
        elif name == "dtype":
            dtype = getattr(torch, value)
        elif name == "bits":
            checked = value != "any"
        elif name == "types":  # GGML type ids: only these matrices
            types = {int(t) for t in value.split(",")}
        else:
            version, *options = value.split(":")
            per_unit = int(options[0]) if options else None
            builds[name] = (load_build(version), per_unit, options[1] if len(options) > 1 else "best")
    tensors = [t for t in gguf_tensors(file) if t.name != "token_embd.weight" and int(t.tensor_type) in types]
    held = {name: [(held_by(build, torch.from_numpy(t.data), int(t.tensor_type), t.shape[0], per_unit, path, dtype),
                    t.shape[0]) for t in tensors] for name, (build, per_unit, path) in builds.items()}  # fmt: skip
    inputs = {(n, c): torch.randn(n, c, dtype=dtype) for n in rows for c in {t.shape[0] for t in tensors}}

    def forward(name: str, n: int) -> list[torch.Tensor]:
        return [product(inputs[n, c]) for product, c in held[name]]

    first = next(iter(builds))
    for n in rows if checked else []:
        want = forward(first, n)
        for name in builds:
            assert all(torch.equal(a, b) for a, b in zip(want, forward(name, n))), f"{name} differs at {n} rows"
    times: dict[tuple[str, int], list[float]] = {}
    names = list(builds)
    for round_index in range(repeats):  # the builds' order turns round by round: the later ran faster here
        turn = names[round_index % len(names):] + names[: round_index % len(names)]
        for n in rows:
            for name in turn:
                start = time.perf_counter()
                forward(name, n)
                times.setdefault((name, n), []).append((time.perf_counter() - start) * 1e3)
    print("every build's results bitwise equal" if checked else "results not compared (bits=any)")
    print("| build | " + " | ".join(f"{n} rows" for n in rows) + " |")
    for name in builds:
        one = statistics.median(times[name, rows[0]])
        cells = (f"{statistics.median(times[name, n]):.1f} ({statistics.median(times[name, n]) / one:.2f}x)"
                 for n in rows)
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
