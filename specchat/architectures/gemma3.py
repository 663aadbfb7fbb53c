"""Gemma 3's layout (`gemma3_model`): Llama's parts, with a norm on each half's output, sliding-window layers
and a second RoPE for those."""

from __future__ import annotations

import functools

from specchat.architectures.llama import LlamaLayer, LlamaParts

SLIDING = "sliding_attention"  # a kind of layer in `config.layer_types`; the other is "full_attention"
GEMMA3 = "gemma3_text"  # its model type; Gemma 2's is "gemma2"


class Gemma3Layer(LlamaLayer):
    mlp_norm = property(lambda self: self.module.pre_feedforward_layernorm)
    attention_output_norm = property(lambda self: self.module.post_attention_layernorm)
    mlp_output_norm = property(lambda self: self.module.post_feedforward_layernorm)

    @property
    def sliding(self) -> bool:
        return self.module.self_attn.layer_type == SLIDING

    @property
    def window(self) -> int:
        return self.module.self_attn.sliding_window or 0

    @property
    def rope(self) -> int:
        return 1 if self.sliding else 0


class Gemma3Parts(LlamaParts):
    model_types = ("gemma3_text",)
    Layer = Gemma3Layer

    @property
    def rotary(self):
        """The full-attention layers' RoPE."""
        return self.rotaries[0]

    @property
    def rotaries(self) -> list:
        """The full-attention layers' RoPE, then the sliding-window layers' (transformers' model has one module
        that takes the kind of layer)."""
        decoder = self.model.model
        if hasattr(decoder, "rotary_emb_local"):
            return [decoder.rotary_emb, decoder.rotary_emb_local]
        return [functools.partial(decoder.rotary_emb, layer_type=kind) for kind in ("full_attention", SLIDING)]
