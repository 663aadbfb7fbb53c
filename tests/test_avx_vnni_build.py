"""The AVX-VNNI path: AVX2 with vpdpbusd on 256-bit vectors and no AVX-512 (Intel since Alder Lake, AMD since
Zen 5). It compiles on any x86 machine and names itself; where the CPU has AVX-VNNI, its GGUF kernels give
bitwise what the AVX2 build gives (the same integers, four products an instruction). Its tile kernels are the
ones an AVX-512 VNNI build runs through the EVEX form of the same instruction for 8-row tiles, held to the
portable loops by test_gguf_kernels.py on such machines. Run by `make test-isas` (marked other_isas).
"""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf_files import LAYOUTS, random_blocks

from specchat.kernels.cpu.cpu_decoder import build

CPU_FLAGS = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
pytestmark = [pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="an x86 path"),
              pytest.mark.other_isas]


def test_the_avx_vnni_build_compiles_and_names_its_path():
    assert build("avxvnni", "gguf_kernels").isa() == "avx2 (avx-vnni)"


@pytest.mark.skipif("avx_vnni" not in CPU_FLAGS.split(), reason="this CPU has no AVX-VNNI")
@pytest.mark.parametrize("kind", list(LAYOUTS), ids=[t.name for t in LAYOUTS])
def test_avx_vnni_kernels_equal_the_avx2_build(kind):
    vnni, avx2, rng = build("avxvnni", "gguf_kernels"), build("avx2"), np.random.default_rng(int(kind))
    blocks = torch.from_numpy(random_blocks(kind, 48, 512, rng))
    x = torch.from_numpy(rng.standard_normal((21, 512)).astype(np.float32))
    for per_unit in (0, 1, 2):  # the file's rows, 8-row tiles, pairs of them
        matrix, unit_rows = (blocks, 1) if per_unit == 0 else vnni.gguf_tile(blocks, int(kind), 512, per_unit)
        for rows in (1, 3, 8, 21):
            mine = vnni.gguf_matmul(x[:rows], [matrix], [int(kind)], [unit_rows], 512, "best")
            assert torch.equal(mine, avx2.gguf_matmul(x[:rows], [matrix], [int(kind)], [unit_rows], 512, "best"))
