"""The CPU decoder's dense bf16 product (kernels/cpu/dense_matmul.h) against ATen's, by activation rows: one layer's
MLP matrices of Gemma 3 1B's shapes (four 6912 x 1152 and two 1152 x 6912, 96 MB of bf16), each row count's two
products alternating, medians of `repeats` rounds; ms and the weights' GB/s. `SPECCHAT_CPU_ISA=avx2` times the AVX2
build; set ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 too to hold ATen to AVX2 as well.

    python scripts/dense_matmul_rows.py [repeats] [rows=1,4,8,64,512]
"""

import statistics
import sys
import time

import torch

from specchat.kernels.cpu.cpu_decoder import cpu_decoder


def main() -> None:
    torch.set_num_threads(2)
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 9
    rows = [int(n) for n in sys.argv[2].removeprefix("rows=").split(",")] if len(sys.argv) > 2 else [1, 4, 8, 64, 512]
    decoder = cpu_decoder()
    weights = [torch.randn(6912, 1152).to(torch.bfloat16) for _ in range(4)]
    weights += [torch.randn(1152, 6912).to(torch.bfloat16) for _ in range(2)]
    size = sum(w.numel() * w.element_size() for w in weights)
    products = {"ours": decoder.dense_matmul, "aten": torch.nn.functional.linear}
    print(f"CPU decoder {decoder.isa()}; {size / 1e6:.0f} MB of weights")
    for count in rows:
        inputs = {w.shape[1]: torch.randn(count, w.shape[1]).to(torch.bfloat16) for w in weights}
        times = {name: [] for name in products}
        for _ in range(repeats):
            for name, product in products.items():
                start = time.perf_counter()
                for w in weights:
                    product(inputs[w.shape[1]], w)
                times[name].append(time.perf_counter() - start)
        medians = {name: statistics.median(t) for name, t in times.items()}
        parts = "  ".join(f"{name} {t * 1e3:7.2f} ms ({size / t / 1e9:4.1f} GB/s)" for name, t in medians.items())
        print(f"{count:4d} rows: {parts}  ours/aten {medians['ours'] / medians['aten']:.2f}")


if __name__ == "__main__":
    main()
