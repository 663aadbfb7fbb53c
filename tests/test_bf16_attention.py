"""The CPU decoder's attention over a bf16 cache (bf16 dot products: the query and the softmax weights rounded
to bf16, value rows summed in pairs) against the same attention in fp32 on the same values: within bf16's
rounding, for a decode step and a tree, odd and even prefixes (an odd prefix's last key pairs with the tree's
first). A swapped half of a pair, a pair dropped at a prefix's end or a weight off by a row would be errors
of the order of the outputs themselves. The scores themselves are that arithmetic bit for bit, however many
queries a pass over the keys serves."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specchat.kernels.cpu.cpu_decoder import cpu_decoder

HEADS, KV_HEADS = 4, 2


def _attention_outputs(dtype, head_dim, context, rows, seed):
    """One layer whose output projection is the identity and whose MLP adds nothing: the layer's output less its
    input is the attention's output [rows, heads * head_dim]."""
    native = cpu_decoder()
    generator = torch.Generator().manual_seed(seed)
    hidden = HEADS * head_dim

    def random(*shape, scale=1.0):  # bf16 values, so both dtypes start from the same numbers
        return (torch.randn(*shape, generator=generator) * scale).to(torch.bfloat16).to(dtype)

    qkv = random((HEADS + 2 * KV_HEADS) * head_dim, hidden, scale=hidden**-0.5)
    identity = torch.eye(hidden, dtype=dtype)
    gate_up, down = random(2 * 16, hidden), torch.zeros(hidden, 16, dtype=dtype)
    dense = lambda w: native.Projection([native.Linear.dense(w, None)])  # noqa: E731
    ones = torch.ones(hidden, dtype=dtype)
    layer = native.Layer(dense(qkv), dense(identity), dense(gate_up), dense(down), ones, ones)
    decoder = native.Decoder([layer], ones, HEADS, KV_HEADS, head_dim, 16, 1e-6, head_dim**-0.5)
    keys = random(KV_HEADS, context + rows, head_dim, scale=3.0)  # scores of a few units: a peaked softmax
    values = random(KV_HEADS, context + rows, head_dim)
    x = random(rows, hidden, scale=1e-3)  # the norm scales it up; the residual it adds back is below bf16's rounding
    mask = (None if rows == 1
            else torch.rand(rows, rows, generator=generator).lt(0.6).tril() | torch.eye(rows, dtype=torch.bool))
    cos, sin = torch.ones(rows, head_dim), torch.zeros(rows, head_dim)
    out = native.forward(decoder, x, cos, sin, [keys], [values], context, mask, False)[1]
    return out.float() - x.float()


@pytest.mark.parametrize("head_dim", [64, 96, 128])
@pytest.mark.parametrize("context", [300, 301])
@pytest.mark.parametrize("rows", [1, 9])
def test_bf16_dot_product_attention_is_fp32_attention_within_bf16_rounding(head_dim, context, rows):
    ours = _attention_outputs(torch.bfloat16, head_dim, context, rows, seed=context + rows)
    exact = _attention_outputs(torch.float32, head_dim, context, rows, seed=context + rows)
    relative = (ours - exact).norm(dim=-1) / exact.norm(dim=-1)
    assert exact.abs().mean() > 0.1  # the outputs are of the values' order, not averaged away
    assert relative.max() < 2e-2, relative


def _bf16_dot_scores(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """queries . keys in bf16 dot-product arithmetic, in float32 numpy: the queries rounded to bf16; lane l of 16
    sums dims 32c + 2l + 1, then 32c + 2l, for c = 0, 1, ... (each product of two bf16 exact in float32, so each
    addition is the fma's one rounding); then the lanes paired down, adjacent ones first."""
    q = queries.to(torch.bfloat16).float().numpy()
    k = keys.float().numpy()
    lanes = np.zeros((q.shape[0], k.shape[0], 16), np.float32)
    for c in range(q.shape[1] // 32):
        for parity in (1, 0):
            dims = 32 * c + 2 * np.arange(16) + parity
            lanes = lanes + q[:, None, dims] * k[None, :, dims]
    while lanes.shape[-1] > 1:
        lanes = lanes[..., 0::2] + lanes[..., 1::2]
    return torch.from_numpy(lanes[..., 0])


@pytest.mark.parametrize("head_dim", [64, 96, 128])
def test_scores_are_the_bf16_dot_arithmetic_however_many_queries_share_a_pass(head_dim, cpu_isa):
    """13 queries at once (on AVX2 past COLUMNS_FROM: the keys widened and transposed once for all) and one at a
    time (each tile read by the query alone) give the same bits, and those of the arithmetic itself."""
    generator = torch.Generator().manual_seed(head_dim)
    queries = torch.randn(13, head_dim, generator=generator)
    keys = torch.randn(160, head_dim, generator=generator).to(torch.bfloat16)
    native = cpu_decoder()
    together = native.bf16_scores(queries, keys)
    assert torch.equal(together, _bf16_dot_scores(queries, keys))
    for i in range(len(queries)):
        assert torch.equal(native.bf16_scores(queries[i : i + 1], keys)[0], together[i]), i
