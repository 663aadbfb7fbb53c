"""Gemma 2's soft cap, cap * tanh(x / cap), as the CPU decoder applies it to attention scores and logits
(attention_kernels.h `soft_cap`): every value through the same vector code, so its bits do not depend on where it lies
in a row (a tree row's scores end elsewhere than its decode step's), and within a few fp32 roundings of tanh."""

from __future__ import annotations

import torch

from specchat.kernels.cpu.cpu_decoder import cpu_decoder


def test_a_capped_value_does_not_depend_on_its_rows_length(cpu_isa):
    native = cpu_decoder()
    row = torch.randn(53, generator=torch.Generator().manual_seed(0)) * 40
    whole = native.soft_cap(row, 50.0)
    for n in (1, 15, 16, 17, 40):
        assert torch.equal(native.soft_cap(row[:n], 50.0), whole[:n]), n
    assert torch.equal(native.soft_cap(-row, 50.0), -whole)  # odd, to the bit


def test_the_cap_is_accurate(cpu_isa):
    x = torch.cat([torch.linspace(-400.0, 400.0, 40001), torch.tensor([0.0, 1e-30, -1e-6])])
    for cap in (30.0, 50.0):
        exact = cap * torch.tanh(x.double() / cap)
        error = (cpu_decoder().soft_cap(x, cap).double() - exact).abs()
        assert (error <= 4e-7 * cap).all(), error.max()  # a few units of fp32's rounding at the cap
        assert (error <= 2e-6 * exact.abs() + 1e-12).all()  # relative, away from zero (tanh's cancellation there)


def test_bf16_values_are_capped_and_rounded_once():
    x = (torch.randn(300, generator=torch.Generator().manual_seed(1)) * 60).to(torch.bfloat16)
    capped = cpu_decoder().soft_cap(x, 30.0)
    assert capped.dtype == torch.bfloat16
    assert torch.equal(capped, cpu_decoder().soft_cap(x.float(), 30.0).to(torch.bfloat16))
