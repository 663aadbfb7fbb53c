"""Gemma 2's layout: Gemma 3's (`gemma3`) with one RoPE for every layer, no norm over each head's query and key
(its modules have none: `LlamaLayer.q_norm` finds none), and its attention scores and logits soft-capped
(`LlamaParts.attention_cap`, `logit_cap`)."""

from __future__ import annotations

from specchat.architectures.gemma3 import Gemma3Layer, Gemma3Parts


class Gemma2Layer(Gemma3Layer):
    rope = 0  # the one RoPE


class Gemma2Parts(Gemma3Parts):
    model_types = ("gemma2",)
    Layer = Gemma2Layer

    @property
    def rotaries(self) -> list:
        return [self.model.model.rotary_emb]
