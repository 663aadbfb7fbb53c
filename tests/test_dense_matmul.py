"""The CPU decoder's dense product (kernels/cpu/dense_matmul.h) is the arithmetic it documents, bit for bit, on every
build this machine runs: each output summed in 16 lanes, for bf16 weights a lane adding the odd input's product, then
the even one's, chunk after chunk (vdpbf16ps), for fp16 and fp32 weights the products of inputs 16c + l one by one
(fmas), the lanes paired down. So an output depends on its own activation row alone:
a verified tree row gets what its decode step gets, whatever rows share the product. Shapes reach every edge of the
kernel's loops: a last block of fewer than 16 weight rows, several units of 64, inputs past one slice of 2048, rows
past one group of 64 and not a multiple of the rows a pass takes."""

from __future__ import annotations

import platform

import pytest
import torch
import torch.nn.functional as F

from specchat.architectures.llama_model import HalfLinear, dense_linear
from specchat.kernels.cpu.cpu_decoder import cpu_decoder

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="ATen's product runs elsewhere")


def lane_arithmetic(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [rows, in] . w [out, in]^T as the kernel sums it, in torch: each step `sum + a * b` rounded once, as an fma
    and a vdpbf16ps step do (no denormals in these inputs): a bf16 by bf16 or fp16 product is exact in fp32, an fp16 by
    fp16 one too, an fp32 or fp16 by fp16 or fp32 one in fp64."""
    rows, inputs = x.shape
    lanes = torch.zeros(rows, w.shape[0], 16)
    if w.dtype in (torch.float16, torch.float32):
        xs, ws = x.double().view(rows, inputs // 16, 16), w.double().view(w.shape[0], inputs // 16, 16)
        for c in range(inputs // 16):
            lanes = (lanes.double() + xs[:, None, c] * ws[None, :, c]).float()
    else:
        xs, ws = x.float().view(rows, inputs // 32, 16, 2), w.float().view(w.shape[0], inputs // 32, 16, 2)
        for c in range(inputs // 32):
            lanes = lanes + xs[:, None, c, :, 1] * ws[None, :, c, :, 1]
            lanes = lanes + xs[:, None, c, :, 0] * ws[None, :, c, :, 0]
    while lanes.shape[-1] > 1:
        lanes = lanes[..., 0::2] + lanes[..., 1::2]
    return lanes[..., 0]


@pytest.mark.parametrize(("x_dtype", "weight_dtype"),
                         [(torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float16),
                          (torch.float32, torch.float16), (torch.float32, torch.float32),
                          (torch.float16, torch.float16), (torch.float16, torch.float32)])
@pytest.mark.parametrize(("out", "inputs"), [(16, 96), (149, 2112), (37, 64)])
def test_the_product_is_its_lane_arithmetic_whatever_rows_share_it(out, inputs, x_dtype, weight_dtype, cpu_isa):
    generator = torch.Generator().manual_seed(out)
    w = torch.randn(out, inputs, generator=generator).to(weight_dtype)
    x = torch.randn(131, inputs, generator=generator).to(x_dtype)
    want = lane_arithmetic(x, w)
    for rows in (1, 2, 3, 7, 9, 64, 65, 131):
        assert torch.equal(cpu_decoder().dense_matmul(x[:rows], w), want[:rows]), rows
    assert torch.equal(cpu_decoder().dense_matmul(x[100:101], w), want[100:101])  # a row alone: its bits in the batch


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(("out", "inputs"), [(16, 96), (149, 2112), (37, 64)])
def test_int8_codes_multiply_as_their_dequantized_matrix_whatever_rows_share_it(out, inputs, x_dtype, cpu_isa):
    """Q8_0's codes times an fp16 scale per 32 inputs: each weight d * q is exact in fp32, so the product is the fp32
    one of the dequantized matrix, lane for lane (a tied LM head, `Int8Linear`)."""
    generator = torch.Generator().manual_seed(out)
    codes = torch.randint(-128, 128, (out, inputs), generator=generator, dtype=torch.int8)
    scales = (torch.rand(out, inputs // 32, generator=generator) / 64).half().float()
    x = torch.randn(131, inputs, generator=generator).to(x_dtype)
    want = lane_arithmetic(x.float(), codes.float() * scales.repeat_interleave(32, dim=1))
    for rows in (1, 2, 3, 7, 9, 64, 65, 131):
        assert torch.equal(cpu_decoder().dense_matmul(x[:rows], codes, scales), want[:rows]), rows
    assert torch.equal(cpu_decoder().dense_matmul(x[100:101], codes, scales), want[100:101])
    with pytest.raises(RuntimeError, match="come with their scales"):
        cpu_decoder().dense_matmul(x, codes)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_a_decoder_layer_of_any_width_computes_its_rows_apart(dtype, cpu_isa):
    """A layer whose inputs are not in 32s (a hidden size of 48) runs the product with its inputs padded by zeros:
    each row is what it is alone, as a verified tree row must be its decode step (ATen's products, oneDNN's AMX ones
    among them, depend on the rows sharing the call)."""
    generator = torch.Generator().manual_seed(1)
    w = torch.randn(40, 48, generator=generator).to(dtype)
    x = torch.randn(9, 48, generator=generator).to(dtype)
    layer = cpu_decoder().Projection([cpu_decoder().Linear.dense(w, None)])
    want = lane_arithmetic(F.pad(x, (0, 16)), F.pad(w, (0, 16))).to(dtype)
    for rows in (1, 5, 9):
        assert torch.equal(layer(x[:rows]), want[:rows]), rows
    assert torch.equal(layer(x[4:5]), want[4:5])


def test_what_the_product_does_not_take_is_refused():
    w = torch.randn(16, 40).to(torch.bfloat16)  # inputs not in 32s: ATen's product takes these
    with pytest.raises(RuntimeError, match="inputs in 32s"):
        cpu_decoder().dense_matmul(torch.randn(1, 40).to(torch.bfloat16), w)
    with pytest.raises(RuntimeError, match="bf16 activations"):
        cpu_decoder().dense_matmul(torch.randn(1, 64), torch.randn(16, 64).to(torch.bfloat16))
    with pytest.raises(RuntimeError, match="bf16 or fp16 weight"):
        cpu_decoder().dense_matmul(torch.randn(1, 64).to(torch.bfloat16), torch.randn(16, 64))


def test_an_fp16_matrix_keeps_its_bits_beside_bf16_activations():
    """An F16 file's matrix stays fp16 (the same storage) and its product takes each weight exactly: far closer to
    the exact product than the weights rounded to bf16 (three of their eleven bits lost) would be."""
    generator = torch.Generator().manual_seed(0)
    w = torch.randn(48, 256, generator=generator).half()
    x = torch.randn(3, 256, generator=generator).to(torch.bfloat16)
    layer = dense_linear(w, None, torch.bfloat16)
    assert isinstance(layer, HalfLinear) and layer.weight.data_ptr() == w.data_ptr()
    ours = cpu_decoder().dense_matmul(x, w)
    assert torch.equal(layer(x), ours.to(torch.bfloat16))
    exact = x.double() @ w.double().T
    rounded = x.double() @ w.to(torch.bfloat16).double().T
    assert (ours.double() - exact).abs().max() < (rounded - exact).abs().max() / 10
