"""The target's forward on a CPU without transformers' module machinery: a Llama-family decoder in one call.

A decode step of the default model on 2 cores is about 4.5 ms of 4-bit matmuls; run as transformers' modules
it took 14 ms, and as a loop of torch calls from Python 11 ms: the hundreds of small operations between the
matmuls cost more than the matmuls. Here every layer runs inside the compiled CPU decoder
(`specchat.kernels.cpu.cpu_decoder`): the model's own weights multiplied by its own products (dense matrices, int8
codes, GGUF blocks) or torch's int4 kernel, q/k/v and gate/up fused by `fuse_projections`;
everything else in plain loops, tree attention read from the engine's cache in an order fixed by each row's position
(so a verified node computes bitwise what a decode step computes).

It serves Llama-family models on a CPU (llama, mistral, qwen2, qwen3, smollm3; Phi-3 and Granite from a GGUF file) and
Gemma 3 and 2 from a GGUF file (sliding windows included where the model is in specchat's own modules); `lean_forward`
returns None for the rest, and when the decoder cannot be compiled here (with a warning): the torch decoder runs those
(`target_forward`). It is exact (a verified row bitwise its decode step) where its products compute each row on its own:
in bf16 / fp16 activations, on the weights' own kernels (int4, int8, GGUF blocks), and on dense matrices through its own
dense product (x86: bf16, fp16 and fp32 weights).
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from specchat.architectures import parts
from specchat.architectures.llama import LlamaLayer
from specchat.architectures.rope import rotary_dims
from specchat.engine.attention import sliding_window
from specchat.engine.forward_output import ForwardOutput
from specchat.kernels.cpu.cpu_decoder import cpu_decoder
from specchat.quant.fused import Side, fuse_projections
from specchat.quant.quantized_linear import QuantizedLinear

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "granite", "smollm3", "gemma3_text", "gemma2")
HEAD_DIMS = (64, 96, 128, 256)  # the CPU decoder is compiled for these
OWN_MODULES_ONLY = ("phi3", "granite", "gemma3_text", "gemma2")
ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


class LeanForward:
    def __init__(self, model, native):
        config, decoder = model.config, parts(model)
        layers = decoder.layers
        self.native = native
        self.embed, self.rotaries = decoder.embed, decoder.rotaries
        self.head = native_projection(native, decoder.head)
        self.kv_heads, self.head_dim = config.num_key_value_heads, layers[0].head_dim
        self.decoder = native.Decoder(
            [_layer(native, layer) for layer in layers],
            decoder.norm.weight,
            config.num_attention_heads,
            self.kv_heads,
            self.head_dim,
            config.intermediate_size,
            decoder.norm.variance_epsilon,
            layers[0].scaling,
            _activation(config),
            rotary_dims(config),
            decoder.residual_scale,
            decoder.attention_cap,
        )
        self.embedding_scale, self.logit_scale = decoder.embedding_scale, decoder.logit_scale
        self.logit_cap = decoder.logit_cap
        self.query_layer = decoder.query_layer  # whose queries a forward gives back
        self.angles = torch.empty(0, device=model.device)  # fp32: the rotary's cos / sin come out in fp32

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor | None, cache,
                 *, last_only: bool = False, every_layer: bool = False,
                 feature_layers: tuple[int, ...] = ()) -> ForwardOutput:  # fmt: skip
        """`tokens` [q] at `positions` [q], written after the cache's prefix (pending); queries in fp32 (the
        `query_layer`'s, with `every_layer` every layer's); with `feature_layers` the residual stream entering those
        layers (`ForwardOutput`).

        `tree_mask` [q, q] makes the forward a tree verification; without one the rows are causal (a single
        token is a decode step, several a prefill)."""
        x = self.embed(tokens)
        x = x if self.embedding_scale == 1.0 else x * self.embedding_scale  # Granite's
        tables = [rotary(self.angles, positions[None]) for rotary in self.rotaries]
        cos, sin = torch.cat([c for c, _ in tables]), torch.cat([s for _, s in tables])  # [ropes, q, D]
        prefix = cache.length
        keys, values, scales, firsts = cache.reserve(tokens.shape[0], self.kv_heads, self.head_dim, x.dtype, x.device)
        normed, hidden, queries, features = self.native.forward(
            self.decoder, x, cos, sin, keys, values, prefix, tree_mask, last_only, scales, every_layer,
            list(feature_layers), firsts, self.query_layer,
        )
        logits = self.head(normed)
        logits = logits if self.logit_scale == 1.0 else logits / self.logit_scale  # Granite's
        logits = logits if not self.logit_cap else self.native.soft_cap(logits, self.logit_cap)  # Gemma 2's
        return ForwardOutput(logits, hidden, queries, features)


def serves(model) -> bool:
    """Whether the CPU decoder computes `model`'s forward (given that it builds): a model of `FAMILIES` on a CPU, in
    specchat's own modules or, where it does not need them (`needs_own_modules`), in transformers'."""
    from specchat.architectures import llama_model

    config = model.config
    if model.device.type != "cpu" or config.model_type not in FAMILIES or _activation(config) is None:
        return False
    if not isinstance(model, llama_model.CausalLM) and needs_own_modules(config):  # Gemma's is one too
        return False
    return parts(model).layers[0].head_dim in HEAD_DIMS


def needs_own_modules(config) -> bool:
    """Whether the CPU decoder reads `config`'s model only in specchat's own modules (a GGUF file's, or a checkpoint's
    placed there by `hf_checkpoint`): transformers keeps Phi-3's projections fused and Gemma's norm weights as w
    (the decoder reads 1 + w), and its attention modules do not name a window where `LlamaLayer.window` reads it;
    Granite's are run through its modules by the torch decoder only."""
    return config.model_type in OWN_MODULES_ONLY or sliding_window(config)


def _activation(config) -> str | None:
    """The CPU decoder's name for the MLP's activation, None for one it has not."""
    return ACTIVATIONS.get(getattr(config, "hidden_activation", None) or config.hidden_act)


def lean_forward(model) -> LeanForward | None:
    """The lean forward for `model`, or None when it cannot serve it (the torch decoder then runs)."""
    if not serves(model):
        return None
    try:
        native = cpu_decoder()
    except RuntimeError as error:
        warnings.warn(f"{error}; running the torch decoder (slower)", stacklevel=2)
        return None
    return LeanForward(model, native)


def _layer(native, layer: LlamaLayer):
    return native.Layer(
        native_projection(native, fuse_projections(layer.attention, layer.qkv_names)),
        native_projection(native, layer.o),
        native_projection(native, fuse_projections(layer.mlp, layer.gate_up_names)),
        native_projection(native, layer.down),
        layer.input_norm.weight,
        layer.mlp_norm.weight,
        *(None if norm is None else norm.weight
          for norm in (layer.q_norm, layer.k_norm, layer.attention_output_norm, layer.mlp_output_norm)),
        layer.window,
        layer.rope,
    )


def native_projection(native, layer: nn.Module):
    return native.Projection([_linear(native, part) for part in (layer.layers if isinstance(layer, Side) else [layer])])


def _linear(native, layer: nn.Module):
    if isinstance(layer, QuantizedLinear):
        return layer.native(native)
    if isinstance(layer, nn.Linear):
        return native.Linear.dense(layer.weight, layer.bias)
    raise TypeError(f"the CPU decoder cannot run a {type(layer).__name__} layer")
