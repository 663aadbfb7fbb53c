"""The softmax's exponentials (attention_kernels.h `exponentials`): 16 keys at a time through vector code, the rest
one by one, and both give the same bits, so a key's weight does not depend on where its row's keys end."""

from __future__ import annotations

import math

import torch

from specchat.kernels.cpu.cpu_decoder import cpu_decoder


def test_vector_and_scalar_exponentials_give_the_same_bits(cpu_isa):
    native = cpu_decoder()
    generator = torch.Generator().manual_seed(0)
    for trial in range(50):
        row = torch.randn(16, generator=generator) * (1 + 30 * (trial % 5))
        row[15] = row[:15].min()  # the max of all 16 is the max of the first 15
        whole, _ = native.exponentials(row)  # 16 keys: the vector code
        alone, total = native.exponentials(row[:15])  # 15 keys: one by one
        assert torch.equal(whole[:15], alone)
        assert math.isclose(total, float(torch.exp(row[:15] - row[:15].max()).sum()), rel_tol=1e-5)


def test_exponentials_are_accurate(cpu_isa):
    row = torch.linspace(-86.0, 0.0, 4099)
    out, _ = cpu_decoder().exponentials(row)
    assert torch.allclose(out.double(), torch.exp(row.double()), rtol=2e-7, atol=0)
