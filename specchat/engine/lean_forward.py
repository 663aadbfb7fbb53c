"""The target's forward on a CPU without transformers' module machinery: a Llama-family decoder in one call.

A decode step of the default model on 2 cores is about 4.5 ms of 4-bit matmuls; run as transformers' modules
it took 14 ms, and as a loop of torch calls from Python 11 ms: the hundreds of small operations between the
matmuls cost more than the matmuls. Here every layer runs inside the compiled CPU decoder
(`specchat.kernels.cpu_decoder`): ATen's matmuls on the model's own weights (q/k/v and gate/up fused by
`fuse_projections`), everything else in plain loops, tree attention read from the engine's cache in an order
fixed by each row's position (so a verified node computes bitwise what a decode step computes).

It serves models whose attention is canonical (CPU, bf16 / fp16 activations) and whose layers are plain
Llama ones (llama, mistral without a sliding window, qwen2); `lean_forward` returns None for the rest, and
when the decoder cannot be compiled here (with a warning), which keep transformers' forward.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from specchat.engine.attention import CANONICAL
from specchat.kernels.cpu_decoder import cpu_decoder
from specchat.quant.fused import Side, fuse_projections
from specchat.quant.gguf_linear import GGUFLinear
from specchat.quant.int4_linear import Int4Linear
from specchat.quant.int8_linear import Int8Linear

FAMILIES = ("llama", "mistral", "qwen2")
HEAD_DIMS = (64, 128)  # the CPU decoder is compiled for these


class LeanForward:
    def __init__(self, model, native):
        config = model.config
        self.native = native
        self.embed, self.head, self.rotary = model.model.embed_tokens, model.lm_head, model.model.rotary_emb
        self.kv_heads, self.head_dim = config.num_key_value_heads, model.model.layers[0].self_attn.head_dim
        self.decoder = native.Decoder(
            [_layer(native, layer) for layer in model.model.layers],
            model.model.norm.weight,
            config.num_attention_heads,
            self.kv_heads,
            self.head_dim,
            config.intermediate_size,
            model.model.norm.variance_epsilon,
            model.model.layers[0].self_attn.scaling,
        )
        self.angles = torch.empty(0, device=model.device)  # fp32: the rotary's cos / sin come out in fp32

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor | None, cache,
                 *, last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        """Logits [q or 1, vocab] of `tokens` [q] at `positions` [q], written after the cache's prefix, the
        last layer's output before the final norm [q, hidden_size] and its rotated queries [q, heads, D] (fp32).

        `tree_mask` [q, q] makes the forward a tree verification; without one the rows are causal (a single
        token is a decode step, several a prefill)."""
        x = self.embed(tokens)
        cos, sin = self.rotary(self.angles, positions[None])
        prefix = cache.length
        keys, values = cache.reserve(tokens.shape[0], self.kv_heads, self.head_dim, x.dtype, x.device)
        normed, hidden, queries = self.native.forward(
            self.decoder, x, cos[0], sin[0], keys, values, prefix, tree_mask, last_only
        )
        return self.head(normed), hidden, queries


def lean_forward(model) -> LeanForward | None:
    """The lean forward for `model`, or None when it cannot serve it (transformers' forward then runs)."""
    config = model.config
    if config._attn_implementation != CANONICAL or config.model_type not in FAMILIES:
        return None
    if config.hidden_act != "silu" or model.model.layers[0].self_attn.head_dim not in HEAD_DIMS:
        return None
    try:
        native = cpu_decoder()
    except RuntimeError as error:
        warnings.warn(f"{error}; running transformers' forward (slower)", stacklevel=2)
        return None
    return LeanForward(model, native)


def _layer(native, layer):
    attn, mlp = layer.self_attn, layer.mlp
    return native.Layer(
        _projection(native, fuse_projections(attn, ("q_proj", "k_proj", "v_proj"))),
        _projection(native, attn.o_proj),
        _projection(native, fuse_projections(mlp, ("gate_proj", "up_proj"))),
        _projection(native, mlp.down_proj),
        layer.input_layernorm.weight,
        layer.post_attention_layernorm.weight,
    )


def _projection(native, layer: nn.Module):
    parts = list(layer.layers) if isinstance(layer, Side) else [layer]
    if all(isinstance(part, GGUFLinear) for part in parts):  # one call over all their rows
        return native.Projection([_gguf_linear(native, parts)])
    return native.Projection([_linear(native, part) for part in parts])


def _gguf_linear(native, parts: list[GGUFLinear]):
    present = [part.bias for part in parts if part.bias is not None]
    bias = None
    if present:  # a part without a bias adds zeros
        bias = torch.cat([present[0].new_zeros(p.out_features) if p.bias is None else p.bias for p in parts])
    return native.gguf_linear([part.blocks for part in parts], [part.type_id for part in parts],
                              parts[0].in_features, bias)  # fmt: skip


def _linear(native, layer: nn.Module):
    if isinstance(layer, Int4Linear):
        return native.Linear.int4([layer.packed], [layer.scales_zeros], layer.group_size, layer.bias)
    if isinstance(layer, Int8Linear):
        planes, scales = [layer.high, layer.low], [layer.high_scales, layer.low_scales]
        return native.Linear.int4(planes, scales, layer.group_size, layer.bias)
    if isinstance(layer, GGUFLinear):
        return _gguf_linear(native, [layer])
    if isinstance(layer, nn.Linear):
        return native.Linear.dense(layer.weight, layer.bias)
    raise TypeError(f"the CPU decoder cannot run a {type(layer).__name__} layer")
