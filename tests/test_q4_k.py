"""Dense matrices written as GGUF Q4_K blocks (`quant/q4_k.py`): the bytes ggml's layout means, read back by the
CPU decoder's own Q4_K unpacking, and the layer a draft runs beside a GGUF target."""

from __future__ import annotations

import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from torch import nn

from specchat.quant.gguf_linear import GGUFLinear
from specchat.quant.q4_k import k_quant_blocks, q4_1_blocks, q4_k_blocks, q4_k_linear
from specchat.quant.quantize import quantize_linear


def _representable(rows: int, cols: int, seed: int) -> torch.Tensor:
    """A matrix that Q4_K holds exactly: w = d * sc * q - dmin * m with fp16 d, dmin, 6-bit sc, m and 4-bit q,
    every group using scale and min 63 somewhere and every sub-block codes 0 and 15 (so its range is found)."""
    g = torch.Generator().manual_seed(seed)
    groups = cols // 256
    d = torch.rand(rows, groups, 1, 1, generator=g).mul(1e-3).half().float()
    dmin = torch.rand(rows, groups, 1, 1, generator=g).mul(1e-3).half().float()
    sc = torch.randint(1, 64, (rows, groups, 8, 1), generator=g).float()
    m = torch.randint(0, 64, (rows, groups, 8, 1), generator=g).float()
    sc[:, :, 0], m[:, :, 1] = 63, 63
    q = torch.randint(0, 16, (rows, groups, 8, 32), generator=g).float()
    q[..., 0], q[..., 1] = 0, 15
    return (d * sc * q - dmin * m).reshape(rows, cols)


def test_blocks_hold_a_representable_matrix_exactly():
    """Every field in its place: scales and mins of all eight sub-blocks (the upper four split over three
    bytes), both nibbles of every byte, d and dmin. The CPU decoder's unpacking gives the matrix back bit for bit."""
    weight = _representable(32, 512, seed=0)
    layer = GGUFLinear(q4_k_blocks(weight), 12, 512, dtype=torch.float32)
    assert torch.equal(layer.dequantize(), weight)


def test_a_q4_k_layer_is_the_dense_product_to_4_bit_rounding():
    torch.manual_seed(0)
    linear = nn.Linear(512, 48)
    nn.init.normal_(linear.weight, std=0.02)
    layer = q4_k_linear(linear, dtype=torch.float32)
    x = torch.randn(3, 512)
    exact = linear(x)
    error = (layer(x) - exact).norm() / exact.norm()
    assert isinstance(layer, GGUFLinear) and 0 < error < 0.12  # 16 levels a sub-block: ~8% of a Gaussian matrix


def test_rows_that_do_not_split_into_q4_k_blocks_run_in_q4_1():
    """The embedded model's 576 columns: Q4_1 blocks, 32 values a block, as gguf-py reads them; the dense product
    to 4-bit rounding."""
    torch.manual_seed(1)
    linear = nn.Linear(576, 48, bias=False)
    nn.init.normal_(linear.weight, std=0.02)
    layer = quantize_linear(linear, "q4_k", dtype=torch.float32)
    assert isinstance(layer, GGUFLinear) and layer.format == "q4_1"
    blocks = q4_1_blocks(linear.weight.detach())
    assert torch.equal(layer.dequantize(), torch.from_numpy(dequantize(blocks.numpy(), GGMLQuantizationType.Q4_1)))
    x = torch.randn(3, 576)
    exact = linear(x)
    assert 0 < (layer(x) - exact).norm() / exact.norm() < 0.12
    assert isinstance(quantize_linear(nn.Linear(256, 32), "q4_k", dtype=torch.float32), GGUFLinear)


def test_rows_of_a_stacked_layer_come_from_the_matrix_that_holds_them():
    """A draft head is a few rows of a 152K-row head: only those rows are unpacked, in the order asked, from
    whichever of a stacked layer's matrices (tiled here: their rows come in eights) holds each."""
    first, second = _representable(32, 512, seed=1), _representable(16, 512, seed=2)
    layers = [GGUFLinear(q4_k_blocks(w), 12, 512, dtype=torch.float32) for w in (first, second)]
    stacked = GGUFLinear.stacked(layers, bias=None)
    rows = torch.tensor([40, 3, 31, 32, 47, 3])
    assert torch.equal(stacked.dequantize_rows(rows), torch.cat([first, second])[rows])


def test_q5_k_blocks_hold_a_representable_matrix_exactly():
    """Q5_K's fifth bits in their place (bit j of byte l for value 32j + l), read back by the CPU decoder (from
    tiles: the rows come in eights) and by gguf-py alike."""
    g = torch.Generator().manual_seed(3)
    d = torch.rand(16, 2, 1, 1, generator=g).mul(1e-3).half().float()
    dmin = torch.rand(16, 2, 1, 1, generator=g).mul(1e-3).half().float()
    sc = torch.randint(1, 64, (16, 2, 8, 1), generator=g).float()
    m = torch.randint(0, 64, (16, 2, 8, 1), generator=g).float()
    sc[:, :, 0], m[:, :, 1] = 63, 63
    q = torch.randint(0, 32, (16, 2, 8, 32), generator=g).float()
    q[..., 0], q[..., 1] = 0, 31
    weight = (d * sc * q - dmin * m).reshape(16, 512)
    blocks = k_quant_blocks(weight, bits=5)
    assert torch.equal(GGUFLinear(blocks, 13, 512, dtype=torch.float32).dequantize(), weight)
    assert torch.equal(torch.from_numpy(dequantize(blocks.numpy(), GGMLQuantizationType.Q5_K).copy()), weight)
