"""The CPU decoder built for AVX2 only (x86-64-v3, what a machine without AVX-512 compiles) gives bitwise what
this machine's own build gives: the GGUF block kernels (every type, both tile kinds, row counts below and past
a kernel's row blocks; the AVX-512 VNNI build's too) and the decoder's attention (fp32 and bf16 caches, a bf16 one
beside fp32 activations, head_dim 64, 96 and 128, a decode step and a tree of rows). So results do not depend on the
machine that computes them, and the AVX2 paths, which an AVX-512 machine's own build never runs, are tested here too.
A bf16 cache's attention on a CPU with AMX tiles rounds as the tiles do (bf16_tiles.h): there the two builds agree
within a bf16 rounding of the outputs.
Skipped where the native build is that same AVX2 build (no AVX-512) or the machine is not x86; run by
`make test-isas` (marked other_isas).
"""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf_files import LAYOUTS, random_blocks

from specchat.kernels.cpu.cpu_decoder import build, cpu_decoder

CPU_FLAGS = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
pytestmark = [pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or "avx512f" not in CPU_FLAGS,
                                 reason="the native build is the AVX2 one here (no AVX-512) or this is not x86"),
              pytest.mark.other_isas]


@pytest.fixture(scope="module")
def avx2():
    """The decoder compiled for x86-64-v3 (AVX2, FMA, F16C; no AVX-512), as SPECCHAT_CPU_ISA=avx2 builds it."""
    return build("avx2")


@pytest.mark.parametrize("isa", ["avx2", "avx512vnni"])
@pytest.mark.parametrize("kind", list(LAYOUTS), ids=[t.name for t in LAYOUTS])
def test_gguf_kernels_equal_the_avx2_and_avx512_vnni_builds(isa, kind):
    """The AVX-512 VNNI build (no VBMI, BF16 or AMX) gathers the IQ types' codebook entries where this machine's own
    build may look them up in registers."""
    if isa == "avx512vnni" and "avx512_vnni" not in CPU_FLAGS.split():
        pytest.skip("this CPU has no AVX-512 VNNI")
    other = build(isa) if isa == "avx2" else build(isa, "gguf_kernels")
    native, rng = cpu_decoder(), np.random.default_rng(int(kind))
    blocks = torch.from_numpy(random_blocks(kind, 48, 512, rng))
    held = [(blocks, 1)] + [native.gguf_tile(blocks, int(kind), 512, per_unit) for per_unit in (1, 2)]
    x = torch.from_numpy(rng.standard_normal((21, 512)).astype(np.float32))
    for matrix, unit_rows in held:  # the file's rows, 8-row tiles and pairs of them
        for rows, terms in ((1, 1), (3, 1), (8, 1), (21, 1), (1, 2), (21, 2)):  # fp32 activations: two int8 terms
            mine = native.gguf_matmul(x[:rows], [matrix], [int(kind)], [unit_rows], 512, "best", terms)
            theirs = other.gguf_matmul(x[:rows], [matrix], [int(kind)], [unit_rows], 512, "best", terms)
            assert torch.equal(mine, theirs), (unit_rows, rows, terms)


@pytest.mark.parametrize(("dtype", "kv_cache"),
                         [(torch.float32, "auto"), (torch.bfloat16, "auto"), (torch.float32, "bf16"),
                          (torch.bfloat16, "int8")],
                         ids=["fp32", "bf16", "fp32-bf16", "int8"])  # fmt: skip
@pytest.mark.parametrize("head_dim", [64, 96, 128])
@pytest.mark.parametrize("context", [300, 301])  # bf16 value rows go in pairs: an odd prefix pairs with the tree
def test_attention_equals_the_avx2_build(avx2, dtype, kv_cache, head_dim, context):
    """An int8 cache's scores run through vpdpbusd here and through the portable loops there (no VNNI)."""
    heads, kv_heads, hidden, intermediate, layers = 8, 2, 128, 64, 2
    generator = torch.Generator().manual_seed(head_dim)

    def random(*shape, scale=1.0):
        return (torch.randn(*shape, generator=generator) * scale).to(dtype)

    weights = [(random((heads + 2 * kv_heads) * head_dim, hidden, scale=0.05),
                random(hidden, heads * head_dim, scale=0.05),
                random(2 * intermediate, hidden, scale=0.05), random(hidden, intermediate, scale=0.05))
               for _ in range(layers)]  # fmt: skip
    held = torch.bfloat16 if kv_cache == "bf16" else dtype  # a bf16 cache beside fp32 activations
    keys = [random(kv_heads, context + 19, head_dim).to(held) for _ in range(layers)]
    values = [random(kv_heads, context + 19, head_dim).to(held) for _ in range(layers)]
    scales = None
    if kv_cache == "int8":  # random codes (keys -127..127 stored plus 128, as written) and scales over 320 slots
        keys = [torch.randint(1, 256, (kv_heads, 320, head_dim), generator=generator, dtype=torch.uint8)
                for _ in range(layers)]
        values = [torch.randint(-127, 128, (kv_heads, 320, head_dim), generator=generator, dtype=torch.int8)
                  for _ in range(layers)]  # fmt: skip
        scales = [torch.rand(kv_heads, 20, head_dim // 32 + 1, 16, generator=generator) * 0.02 for _ in range(layers)]
    inputs = {rows: random(rows, hidden) for rows in (1, 9)}
    outputs = []
    for native in (cpu_decoder(), avx2):
        def dense(w, native=native):
            return native.Projection([native.Linear.dense(w, None)])

        ones = torch.ones(hidden, dtype=dtype)
        decoder = native.Decoder([native.Layer(dense(a), dense(b), dense(c), dense(d), ones, ones)
                                  for a, b, c, d in weights],
                                 ones, heads, kv_heads, head_dim, intermediate, 1e-6, head_dim**-0.5)  # fmt: skip
        outputs.append([
            native.forward(decoder, x, torch.ones(rows, head_dim), torch.zeros(rows, head_dim),
                           [k.clone() for k in keys], [v.clone() for v in values], context,
                           None if rows == 1 else torch.tril(torch.ones(rows, rows, dtype=torch.bool)), False,
                           scales and [s.clone() for s in scales])[0]
            for rows, x in inputs.items()
        ])  # fmt: skip
    tiles = "amx" in cpu_decoder().isa() and held == torch.bfloat16 and kv_cache != "int8"
    for mine, theirs in zip(*outputs):
        if tiles:  # outputs of 2-4: a bf16 step there is 1/64
            torch.testing.assert_close(mine, theirs, atol=2e-2, rtol=0)
        else:
            assert torch.equal(mine, theirs)
