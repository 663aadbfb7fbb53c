"""Gemma 3's and Gemma 2's text models as plain torch modules, for the weights of a GGUF file (`quant.gguf_model`).

Llama's layer with three differences: each half's output is normed before it joins the residual stream
(`post_attention_layernorm`, `post_feedforward_layernorm`; the MLP reads `pre_feedforward_layernorm`), the MLP
gates with GELU's tanh form, and some layers attend over a sliding window (`config.layer_types`): Gemma 3's five in
six, with a RoPE of their own (`rope_parameters` per kind of layer) and a norm over each head's query and key;
Gemma 2's one in two, whose attention scores and logits are soft-capped (`attn_logit_softcapping`,
`final_logit_softcapping`: cap * tanh(x / cap)). The token embedding is scaled by sqrt(hidden), and queries by
`query_pre_attn_scalar`^-1/2. The module tree and names are transformers' `Gemma3ForCausalLM`'s and
`Gemma2ForCausalLM`'s, which stay the reference; as in `llama_model`, there is no model forward.

A norm's weight is held as llama.cpp's converter writes it, 1 + w (transformers keeps w and adds the 1), in fp32:
Gemma's RMSNorm rounds once, after the weight.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from specchat.architectures import llama_model
from specchat.architectures.gemma3 import GEMMA3, SLIDING
from specchat.architectures.llama_model import Attention, ModelConfig, RotaryEmbedding, Slot


class RMSNorm(nn.Module):
    weight_dtype = torch.float32  # the loader's: a norm weight kept in fp32, whatever the activations
    checkpoint_offset = 1.0  # what the loader adds to a transformers checkpoint's w (a GGUF file holds 1 + w)

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(size, device="meta"), requires_grad=False)
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon) * self.weight).to(x.dtype)


class GemmaAttention(Attention):
    def __init__(self, config: ModelConfig, index: int):
        super().__init__(config, index)
        self.layer_type = config.layer_types[index]
        if config.model_type == GEMMA3:
            self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
        self.scaling = config.query_pre_attn_scalar**-0.5
        self.sliding_window = config.sliding_window if self.layer_type == SLIDING else None
        self.window = self.sliding_window or 0


class MLP(llama_model.MLP):
    activation = staticmethod(functools.partial(F.gelu, approximate="tanh"))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, index: int):
        super().__init__()
        self.self_attn = GemmaAttention(config, index)
        self.mlp = MLP(config)
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):  # fmt: skip
            setattr(self, name, RMSNorm(config.hidden_size, config.rms_norm_eps))


class Decoder(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = Slot(config.vocab_size, config.hidden_size, embedding=True, scale=config.hidden_size**0.5)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config)
        if config.model_type == GEMMA3:
            self.rotary_emb_local = RotaryEmbedding(config, SLIDING)


class CausalLM(llama_model.CausalLM):
    """Llama's `CausalLM` (the decoder and its LM head on the meta device until a loader places them) with Gemma's
    decoder."""

    Decoder = Decoder

    @staticmethod
    def check(config: ModelConfig) -> None:
        if config.hidden_activation != "gelu_pytorch_tanh":
            raise ValueError(f"its MLP's activation is {config.hidden_activation}; specchat runs GELU (tanh) here")
        if config.model_type == GEMMA3 and (getattr(config, "final_logit_softcapping", None) or
                                            getattr(config, "attn_logit_softcapping", None)):  # fmt: skip
            raise ValueError("it soft-caps its logits as Gemma 2 does, which specchat computes only for Gemma 2")
