"""The CPU decoder's attention over a bf16 cache (bf16 dot products: the query and the softmax weights rounded
to bf16, value rows summed in pairs) against the same attention in fp32 on the same values: within bf16's
rounding, for a decode step and a tree, odd and even prefixes (an odd prefix's last key pairs with the tree's
first). A swapped half of a pair, a pair dropped at a prefix's end or a weight off by a row would be errors
of the order of the outputs themselves."""

from __future__ import annotations

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
