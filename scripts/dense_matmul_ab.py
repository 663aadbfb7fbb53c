"""Interleaved A/B of CPU decoder builds on every bf16 matrix a decode step of a BF16 GGUF model reads (the output
head included; the embedding as the head where they are tied): ms per forward's matrices by activation rows, the
weights' GB/s, median of `repeats` rounds, each round every row count and build in turn (the builds' order turning
from round to round), and a check that every build's products are bitwise the same. A build is named by its source
version (`source_version()` of that checkout, built once by `cpu_decoder()`, `avx2_` before it for the AVX2 build;
builds before the fp16 weights named their product `bf16_matmul`):

    python scripts/dense_matmul_ab.py 7 before=<version> after=<version> gguf=BF16.gguf [rows=1,2,4,8]

Without a file, `dtype=bfloat16|float16|float32|int8` multiplies random matrices of one layer of Qwen2.5-Coder-1.5B's
shapes in that dtype (int8: codes with a scale per 32 inputs, as a Q8_0 head), by bf16 activations for bf16 weights
and fp32 ones for the others.
"""

import statistics
import sys
import time
from pathlib import Path

import torch
from gguf_matmul_ab import load_build  # scripts/ is on the path when run from there

from specchat.quant.gguf_model import gguf_tensors

BF16 = 30  # GGML's type id


def step_matrices(file: Path) -> list[torch.Tensor]:
    """The file's 2-D bf16 matrices a decode step multiplies by, as they lie in the mapped file."""
    tensors = {t.name: t for t in gguf_tensors(file)}
    names = [n for n, t in tensors.items() if len(t.shape) == 2 and int(t.tensor_type) == BF16]
    if "output.weight" in names:
        names.remove("token_embd.weight")
    matrices = []
    for name in names:
        t = tensors[name]
        data = torch.from_numpy(t.data).view(torch.bfloat16)
        matrices.append(data.reshape(int(t.shape[1]), int(t.shape[0])))
    return matrices


LAYER_SHAPES = [(2048, 1536), (1536, 1536), (17920, 1536), (1536, 8960)]  # the 1.5B's qkv, o, gate_up, down


def layer_matrices(dtype: str) -> list[tuple[torch.Tensor, ...]]:
    """Random matrices of one 1.5B layer's shapes in `dtype` (int8: with their scales [out, in / 32])."""
    torch.manual_seed(0)
    if dtype == "int8":
        return [(torch.randint(-127, 128, (o, i), dtype=torch.int8), torch.rand(o, i // 32) * 0.01)
                for o, i in LAYER_SHAPES]  # fmt: skip
    return [((torch.randn(o, i) * 0.05).to(getattr(torch, dtype)),) for o, i in LAYER_SHAPES]


def main() -> None:
    torch.set_num_threads(2)
    repeats, rows, file, dtype = int(sys.argv[1]), [1, 2, 4, 8], None, None
    builds = {}
    for arg in sys.argv[2:]:
        name, value = arg.split("=")
        if name == "rows":
            rows = [int(n) for n in value.split(",")]
        elif name == "gguf":
            file = Path(value)
        elif name == "dtype":
            dtype = value
        else:
            builds[name] = load_build(value)
    if (file is None) == (dtype is None):
        sys.exit("gguf=FILE (a BF16 GGUF file) or dtype=D is needed")
    products = {name: getattr(build, "dense_matmul", None) or build.bf16_matmul for name, build in builds.items()}
    matrices = [(m,) for m in step_matrices(file)] if file else layer_matrices(dtype)
    size = sum(t.numel() * t.element_size() for m in matrices for t in m)
    activations = torch.bfloat16 if matrices[0][0].dtype == torch.bfloat16 else torch.float32
    inputs = {(n, c): torch.randn(n, c).to(activations) for n in rows for c in {m[0].shape[1] for m in matrices}}

    def forward(name: str, n: int) -> list[torch.Tensor]:
        product = products[name]
        return [product(inputs[n, m[0].shape[1]], *m) for m in matrices]

    first = next(iter(builds))
    for n in rows:
        want = forward(first, n)
        for name in builds:
            assert all(torch.equal(a, b) for a, b in zip(want, forward(name, n))), f"{name} differs at {n} rows"
    times: dict[tuple[str, int], list[float]] = {}
    names = list(builds)
    for round_index in range(repeats):
        turn = names[round_index % len(names):] + names[: round_index % len(names)]
        for n in rows:
            for name in turn:
                start = time.perf_counter()
                forward(name, n)
                times.setdefault((name, n), []).append(time.perf_counter() - start)
    print(f"every build's products bitwise equal; {len(matrices)} matrices, {size / 1e9:.2f} GB")
    print("| build | " + " | ".join(f"{n} rows" for n in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for name in builds:
        cells = []
        for n in rows:
            t = statistics.median(times[name, n])
            cells.append(f"{t * 1e3:.1f} ms ({size / t / 1e9:.0f} GB/s)")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
