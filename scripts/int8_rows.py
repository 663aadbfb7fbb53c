"""int8 codes with a scale per 32 inputs (`Int8Linear`) in the CPU decoder's dense product, against the same codes as
two 4-bit planes on torch's int4 kernel (q = 16 hi + lo, x W^T = x W_hi^T + x W_lo^T), by activation rows: the
embedded model's tied Q8_0 LM head (49152 x 576, its embedding's codes) and a random int8 matrix of an 8B's MLP shape
(14336 x 4096, 59 MB of codes). Each row count's two products in turn, ms medians of `repeats` rounds.

    python scripts/int8_rows.py [repeats] [rows=1,4,8,16,64,512]
"""

import statistics
import sys
import time

import torch

from specchat.kernels.cpu.cpu_decoder import cpu_decoder
from specchat.loading import load_model
from specchat.quant.int4_linear import pack, scales_and_zeros


def planes(decoder, codes: torch.Tensor, scale: torch.Tensor):
    """The codes as two 4-bit planes on torch's int4 kernel: hi in -8..7 with scale 16 d, lo in 0..15 with scale d."""
    high = codes >> 4
    packed = [pack(high + 8), pack(codes & 15)]
    zeros = [scales_and_zeros(16 * scale, torch.zeros_like(scale), torch.bfloat16),
             scales_and_zeros(scale, 8 * scale, torch.bfloat16)]  # fmt: skip
    return decoder.Linear.int4(packed, zeros, 32, None)


def main() -> None:
    torch.set_num_threads(2)
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    rows = [1, 4, 8, 16, 64, 512]
    if len(sys.argv) > 2:
        rows = [int(n) for n in sys.argv[2].removeprefix("rows=").split(",")]
    decoder = cpu_decoder()
    head = load_model(None, dtype="auto", device="cpu").model.lm_head
    generator = torch.Generator().manual_seed(0)
    mlp = (torch.randint(-127, 128, (14336, 4096), dtype=torch.int8, generator=generator),
           torch.rand(14336, 4096 // 32, generator=generator) / 100)  # fmt: skip
    matrices = {"the embedded model's head": (head.codes, head.scale), "an 8B's MLP matrix": mlp}
    for name, (codes, scale) in matrices.items():
        products = {"int8": decoder.Linear.int8(codes, scale, None), "planes": planes(decoder, codes, scale)}
        products = {kind: decoder.Projection([linear]) for kind, linear in products.items()}
        times = {}
        for _ in range(repeats):
            for n in rows:
                x = torch.randn(n, codes.shape[1]).to(torch.bfloat16)
                for kind, product in products.items():
                    product(x)
                    start = time.perf_counter()
                    product(x)
                    times.setdefault((n, kind), []).append(time.perf_counter() - start)
        for kind in products:
            cells = "  ".join(f"{n}: {statistics.median(times[n, kind]) * 1e3:.2f}" for n in rows)
            print(f"{name}, {kind}, ms by rows  {cells}")


if __name__ == "__main__":
    main()
