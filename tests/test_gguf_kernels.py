"""The CPU decoder's GGUF block kernels (kernels/gguf_blocks.h) against gguf-py's own dequantization.

Activations are quantized to int8 per row over each type's groups (32 values, or 256 for the K-quants), so
the kernel computes exactly x_q @ W^T with x_q the quantized activations: checked to 1e-5 of the output's
scale in float64 (the kernel's only rounding is its float accumulation), and to 2% of it against the
unquantized x (int8 activations: llama.cpp's own precision for these types). Each row's result is bitwise
the same alone, among 1..150 rows (past the 64 a pass over the weights takes), and on every code path
(the best this machine has, AVX-512 VNNI where it has it; AVX2; the portable loops). Q4_K and Q6_K repacked
in tiles of 8 rows (types 112, 114) are held to the same, and to the row-at-a-time kernel's results within float
rounding.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from gguf_files import LAYOUTS, random_blocks

from specchat.kernels.cpu_decoder import cpu_decoder

TYPES = list(LAYOUTS)


def quantized(x: torch.Tensor, group: int) -> torch.Tensor:
    """x as the kernel sees it: int8 per `group` values, scale = max |x| / 127, round half to even."""
    groups = x.view(x.shape[0], -1, group)
    amax = groups.abs().amax(-1, keepdim=True)
    inverse = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
    return (torch.round(groups * inverse) * (amax / 127)).view_as(x)


PATHS = ["avx2", "portable"]  # each checked against "best"


def matmul(x, blocks, kind, *, path="best"):
    return cpu_decoder().gguf_matmul(x, [torch.from_numpy(blocks)], [int(kind)], x.shape[1], path)


@pytest.mark.parametrize("kind", TYPES, ids=[t.name for t in TYPES])
@pytest.mark.parametrize("rows, columns, n", [(37, 512, 1), (64, 768, 5), (3, 256, 17)])
def test_kernel_equals_gguf_dequantize_then_matmul(kind, rows, columns, n):
    rng = np.random.default_rng(rows + n)
    blocks = random_blocks(kind, rows, columns, rng)
    weight = torch.from_numpy(dequantize(blocks, kind).copy()).double()
    x = torch.from_numpy(rng.standard_normal((n, columns)).astype(np.float32))
    got = matmul(x, blocks, kind).double()
    scale = (x.double() @ weight.T).abs().max()
    exact_inputs = quantized(x, LAYOUTS[kind][0]).double() @ weight.T
    assert (got - exact_inputs).abs().max() <= 1e-5 * scale
    assert (got - x.double() @ weight.T).abs().max() <= 2e-2 * scale


@pytest.mark.parametrize("kind", TYPES, ids=[t.name for t in TYPES])
def test_rows_are_bitwise_independent_and_paths_agree(kind):
    rng = np.random.default_rng(1)
    blocks = random_blocks(kind, 40, 512, rng)
    x = torch.from_numpy(rng.standard_normal((150, 512)).astype(np.float32))  # 64 + 64 + 22 rows a pass
    together = matmul(x, blocks, kind)
    for path in PATHS:
        assert torch.equal(together, matmul(x, blocks, kind, path=path)), path
    # straddling the blocks of four rows, and the chunks of 64 rows that pass over the weights together
    for first, count in [(0, 1), (5, 1), (3, 4), (7, 5), (60, 4), (0, 9), (62, 5), (127, 23)]:
        assert torch.equal(matmul(x[first : first + count], blocks, kind), together[first : first + count])


def test_stacked_matrices_of_different_types_equal_each_alone():
    rng = np.random.default_rng(2)
    parts = [(Q, random_blocks(Q, rows, 512, rng)) for Q, rows in zip(TYPES, [8, 16, 3, 5, 7, 9, 2, 11])]
    x = torch.from_numpy(rng.standard_normal((6, 512)).astype(np.float32))
    stacked = cpu_decoder().gguf_matmul(x, [torch.from_numpy(b) for _, b in parts], [int(k) for k, _ in parts], 512, "best")
    assert torch.equal(stacked, torch.cat([matmul(x, b, k) for k, b in parts], dim=1))


@pytest.mark.parametrize("kind", TYPES, ids=[t.name for t in TYPES])
def test_rows_dequantize_like_gguf_py(kind):
    rng = np.random.default_rng(3)
    blocks = random_blocks(kind, 10, 512, rng)
    want = torch.from_numpy(dequantize(blocks, kind).copy())
    ids = torch.tensor([9, 0, 4, 4])
    got = cpu_decoder().gguf_rows(torch.from_numpy(blocks), int(kind), 512, ids)
    torch.testing.assert_close(got, want[ids], atol=1e-6 * want.abs().max().item(), rtol=0)


# --- Q4_K and Q6_K in tiles of eight rows (types 112, 114): the same products, 8 weight rows at once --------

Q4_K, Q6_K = GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K
TILED = {Q4_K: 112, Q6_K: 114}


def tiled(kind, blocks: np.ndarray, columns: int) -> torch.Tensor:
    tile = cpu_decoder().gguf_tile_q4_k if kind == Q4_K else cpu_decoder().gguf_tile_q6_k
    return tile(torch.from_numpy(blocks), columns)


def tile_matmul(kind, x, tiles, *, path="best"):
    return cpu_decoder().gguf_matmul(x, [tiles], [TILED[kind]], x.shape[1], path)


@pytest.mark.parametrize("kind", list(TILED), ids=[t.name for t in TILED])
@pytest.mark.parametrize("rows, columns, n", [(8, 512, 1), (64, 768, 5), (24, 256, 17)])
def test_tiles_equal_gguf_dequantize_then_matmul(kind, rows, columns, n):
    rng = np.random.default_rng(rows + n)
    blocks = random_blocks(kind, rows, columns, rng)
    weight = torch.from_numpy(dequantize(blocks, kind).copy()).double()
    x = torch.from_numpy(rng.standard_normal((n, columns)).astype(np.float32))
    got = tile_matmul(kind, x, tiled(kind, blocks, columns)).double()
    scale = (x.double() @ weight.T).abs().max()
    assert (got - quantized(x, 256).double() @ weight.T).abs().max() <= 1e-5 * scale
    torch.testing.assert_close(got, matmul(x, blocks, kind).double(), atol=1e-5 * scale.item(), rtol=0)


@pytest.mark.parametrize("kind", list(TILED), ids=[t.name for t in TILED])
def test_tile_rows_are_bitwise_independent_and_paths_agree(kind):
    rng = np.random.default_rng(1)
    tiles = tiled(kind, random_blocks(kind, 40, 512, rng), 512)
    x = torch.from_numpy(rng.standard_normal((150, 512)).astype(np.float32))
    together = tile_matmul(kind, x, tiles)
    for path in PATHS:
        assert torch.equal(together, tile_matmul(kind, x, tiles, path=path)), path
    for first, count in [(0, 1), (5, 1), (3, 4), (7, 5), (60, 4), (0, 9), (62, 5), (127, 23), (16, 15)]:
        assert torch.equal(tile_matmul(kind, x[first : first + count], tiles), together[first : first + count])


@pytest.mark.parametrize("kind", list(TILED), ids=[t.name for t in TILED])
def test_tiles_dequantize_like_their_blocks_and_stack_with_other_types(kind):
    rng = np.random.default_rng(4)
    blocks = random_blocks(kind, 16, 512, rng)
    ids = torch.arange(16).flip(0)
    rows = cpu_decoder().gguf_rows(torch.from_numpy(blocks), int(kind), 512, ids)
    assert torch.equal(cpu_decoder().gguf_rows(tiled(kind, blocks, 512), TILED[kind], 512, ids), rows)
    q8 = random_blocks(GGMLQuantizationType.Q8_0, 3, 512, rng)
    x = torch.from_numpy(rng.standard_normal((6, 512)).astype(np.float32))
    stacked = cpu_decoder().gguf_matmul(x, [tiled(kind, blocks, 512), torch.from_numpy(q8)], [TILED[kind], 8], 512, "best")
    assert torch.equal(stacked, torch.cat([tile_matmul(kind, x, tiled(kind, blocks, 512)), matmul(x, q8, 8)], dim=1))
