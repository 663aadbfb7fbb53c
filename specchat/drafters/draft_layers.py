"""The draft layers' building blocks (LongSpec's, GLIDE's, TokenSwift's heads): Llama's pre-norm, attention
projections, SiLU MLP and rotary embedding, with the parameter names of the released checkpoints."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * F.rms_norm(x.float(), x.shape[-1:], eps=self.eps).to(x.dtype)


class SelfAttention(nn.Module):
    """q/k/v/o projections of a draft layer's self-attention (LongSpec's q/k/v have a bias; GLIDE's do not)."""

    def __init__(self, config, *, bias: bool = True):
        super().__init__()
        heads, kv, dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, heads * dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, kv * dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, kv * dim, bias=bias)
        self.o_proj = nn.Linear(heads * dim, config.hidden_size, bias=False)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [heads, q, D] with the target's tables cos / sin [q, R]: the first R dims turned (R
    < D where a model rotates part of each head, as Phi-4-mini), the rest passed."""
    if cos.shape[-1] < x.shape[-1]:
        turned, passed = x.split([cos.shape[-1], x.shape[-1] - cos.shape[-1]], dim=-1)
        return torch.cat([rotate(turned, cos, sin), passed], dim=-1)
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin
