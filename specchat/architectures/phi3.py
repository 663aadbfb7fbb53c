"""Phi-3's layout (Phi-3, Phi-3.5 and Phi-4, mini or not): Llama's layer with q/k/v in one matrix and gate/up in
another. transformers keeps them fused (`qkv_proj`, `gate_up_proj`); specchat's modules for a GGUF file hold each
projection as a view of its rows (`quant.fused.Rows`), as `fuse_projections` leaves Llama's."""

from __future__ import annotations

from torch import nn

from specchat.architectures.llama import LlamaLayer, LlamaParts
from specchat.quant.fused import Rows

# a fused matrix's name -> the projections whose rows it stacks, in order
FUSED_PROJECTIONS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


class Phi3Layer(LlamaLayer):
    @property
    def fused(self) -> bool:
        """Whether the projections are transformers' fused modules (else views, as specchat's)."""
        return not hasattr(self.module.self_attn, "q_proj")

    def _qkv(self, index: int) -> nn.Module:
        qkv = self.module.self_attn.qkv_proj
        queries = self.module.self_attn.o_proj.in_features
        kv = (qkv.out_features - queries) // 2
        bounds = (0, queries, queries + kv, queries + 2 * kv)
        return Rows(qkv, bounds[index], bounds[index + 1])

    q = property(lambda self: self._qkv(0) if self.fused else self.module.self_attn.q_proj)
    k = property(lambda self: self._qkv(1) if self.fused else self.module.self_attn.k_proj)
    v = property(lambda self: self._qkv(2) if self.fused else self.module.self_attn.v_proj)
    qkv_names = property(lambda self: ("qkv_proj",) if self.fused else LlamaLayer.qkv_names)
    gate_up_names = property(lambda self: ("gate_up_proj",) if self.fused else LlamaLayer.gate_up_names)


class Phi3Parts(LlamaParts):
    model_types = ("phi3",)
    Layer = Phi3Layer
