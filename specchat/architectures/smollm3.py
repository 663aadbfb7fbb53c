"""SmolLM3's layout: Llama's, with RoPE left out of some layers (NoPE; by default every fourth, `no_rope_layers`
says which). A NoPE layer rotates by the identity: cos 1 and sin 0 give each query and key back bit for bit, so the
decoders' RoPE serves it unchanged."""

from __future__ import annotations

import torch

from specchat.architectures.llama import LlamaLayer, LlamaParts
from specchat.architectures.rope import rotary_dims


class NoRotation:
    """(x, positions [batch, q]) -> cos = 1, sin = 0 [batch, q, rotated dims] in x's dtype: a rotary that rotates
    nothing."""

    def __init__(self, config):
        self.dims = rotary_dims(config)

    def __call__(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (*positions.shape, self.dims)
        return (torch.ones(shape, dtype=x.dtype, device=positions.device),
                torch.zeros(shape, dtype=x.dtype, device=positions.device))  # fmt: skip


class SmolLM3Layer(LlamaLayer):
    rotates = property(lambda self: bool(self.module.self_attn.use_rope))

    @property
    def rope(self) -> int:
        """0: the model's RoPE; 1: none (`NoRotation`)."""
        return 0 if self.rotates else 1


class SmolLM3Parts(LlamaParts):
    model_types = ("smollm3",)
    Layer = SmolLM3Layer

    @property
    def rotaries(self) -> list:
        """The model's RoPE, then the NoPE layers' identity."""
        return [self.rotary, NoRotation(self.model.config)]
