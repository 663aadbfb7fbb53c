"""A Llama-family decoder of our own in torch (llama, mistral, qwen2, qwen3): the GPU target's forward.

transformers' modules cost about 1000 kernel launches per forward and cannot be captured whole (their cache
and mask code runs on the host). Here a layer is four matmuls over fused weights (q/k/v and gate/up each one
matrix; the residual added inside the output projections' matmuls) and four custom ops (`decoder_ops`): RMSNorm,
RoPE with the KV write, hybrid tree attention, SiLU-and-multiply. Everything a forward reads (tokens, positions,
tree mask, the cache's length) is a tensor, so a CUDA graph of it replays at any context length
(`specchat.engine.cuda_graphs`), and `torch.compile(fullgraph=True)` traces it without a break.

transformers only supplies the config and the weights (`from_model`, `from_state_dict`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specchat.architectures.llama import LlamaParts
from specchat.engine import decoder_ops as ops
from specchat.engine.attention import sliding_window
from specchat.engine.static_cache import StaticCache
from specchat.errors import SpecchatError


@dataclass
class DecoderOutput:
    logits: torch.Tensor  # [rows or 1, vocab], the weights' dtype
    hidden: torch.Tensor  # [rows, hidden_size]: the last layer's output, before the final norm
    queries: torch.Tensor  # [rows, Hq, D]: the last layer's rotated queries


@dataclass
class Layer:
    input_norm: torch.Tensor
    qkv: torch.Tensor  # [(Hq + 2 Hkv) D, hidden]: q, k, v stacked
    qkv_bias: torch.Tensor | None  # qwen2's
    qk_norm: torch.Tensor | None  # qwen3's per-head norms [2, D]: queries', keys'
    o: torch.Tensor
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: torch.Tensor  # [2 I, hidden]: gate, then up
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None


class TorchDecoder:
    def __init__(self, config, layers: list[Layer], embed: torch.Tensor, norm: torch.Tensor, head: torch.Tensor,
                 *, max_positions: int | None = None):  # fmt: skip
        check_config(config)
        self.config = config
        self.layers = layers
        self.embed, self.norm, self.head = embed, norm, head
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = config.rms_norm_eps
        self.scale = self.head_dim**-0.5
        positions = torch.arange(max_positions or config.max_position_embeddings, device=embed.device).float()
        angles = positions[:, None] * inverse_frequencies(config, self.head_dim).to(embed.device)[None]
        self.cos, self.sin = angles.cos(), angles.sin()  # [max_positions, D / 2], fp32

    @classmethod
    def from_state_dict(cls, config, state: dict[str, torch.Tensor], **kwargs) -> TorchDecoder:
        """From a transformers `*ForCausalLM` state dict (names `model.layers.{i}.self_attn.q_proj.weight`, ...)."""

        def get(name: str) -> torch.Tensor | None:
            return state.get(name)

        def cat(names: list[str]) -> torch.Tensor | None:
            parts = [get(name) for name in names]
            return None if parts[0] is None else torch.cat(parts)

        layers = []
        for i in range(config.num_hidden_layers):
            p = f"model.layers.{i}."
            qkv = [f"{p}self_attn.{name}_proj" for name in "qkv"]
            gate_up = [f"{p}mlp.gate_proj", f"{p}mlp.up_proj"]
            q_norm = get(f"{p}self_attn.q_norm.weight")
            layers.append(
                Layer(
                    input_norm=state[f"{p}input_layernorm.weight"],
                    qkv=cat([f"{name}.weight" for name in qkv]),
                    qkv_bias=cat([f"{name}.bias" for name in qkv]),
                    qk_norm=None if q_norm is None else torch.stack([q_norm, state[f"{p}self_attn.k_norm.weight"]]),
                    o=state[f"{p}self_attn.o_proj.weight"],
                    o_bias=get(f"{p}self_attn.o_proj.bias"),
                    post_norm=state[f"{p}post_attention_layernorm.weight"],
                    gate_up=cat([f"{name}.weight" for name in gate_up]),
                    gate_up_bias=cat([f"{name}.bias" for name in gate_up]),
                    down=state[f"{p}mlp.down_proj.weight"],
                    down_bias=get(f"{p}mlp.down_proj.bias"),
                )
            )
        embed = state["model.embed_tokens.weight"]
        return cls(config, layers, embed, state["model.norm.weight"], state.get("lm_head.weight", embed), **kwargs)

    @classmethod
    def from_model(cls, model, **kwargs) -> TorchDecoder:
        """From a loaded transformers model (its weights shared where not fused)."""
        return cls.from_state_dict(model.config, model.state_dict(), **kwargs)

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def new_cache(self, capacity: int) -> StaticCache:
        return StaticCache(len(self.layers), self.kv_heads, self.head_dim, capacity, self.embed.dtype, self.device)

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, cache: StaticCache,
                 tree_mask: torch.Tensor | None = None, *, last_only: bool = False) -> DecoderOutput:  # fmt: skip
        """`tokens` [rows] at `positions` [rows], their keys and values written after the cache's committed prefix
        (whose length is read from `cache.length_tensor`; the bookkeeping is the caller's). `tree_mask` [rows, rows]
        bool (True: row may attend column, the diagonal included) makes it a tree verification; without one the
        rows are causal (one row: a decode step; several: a prefill)."""
        rows = tokens.shape[0]
        if tree_mask is None:
            tree_mask = torch.ones(rows, rows, dtype=torch.bool, device=tokens.device).tril_()
        length = cache.length_tensor
        x = F.embedding(tokens, self.embed)
        for i, layer in enumerate(self.layers):
            h = ops.rms_norm(x, layer.input_norm, self.eps)
            qkv = F.linear(h, layer.qkv, layer.qkv_bias)
            q = ops.rope_write(qkv, positions, self.cos, self.sin, length, cache.keys, cache.values, i, layer.qk_norm,
                               self.eps)  # fmt: skip
            attended = ops.tree_attention(q, cache.keys, cache.values, i, length, tree_mask, self.scale)
            x = _add_projection(x, attended.view(rows, -1), layer.o, layer.o_bias)
            h = ops.rms_norm(x, layer.post_norm, self.eps)
            gated = ops.silu_mul(F.linear(h, layer.gate_up, layer.gate_up_bias))
            x = _add_projection(x, gated, layer.down, layer.down_bias)
        normed = ops.rms_norm(x[-1:] if last_only else x, self.norm, self.eps)
        return DecoderOutput(F.linear(normed, self.head), x, q)


def _add_projection(residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """`residual + x W^T (+ bias)`, the residual added by the matmul itself (one kernel)."""
    out = torch.addmm(residual, x, weight.t())
    return out if bias is None else out + bias


def check_config(config) -> None:
    """A one-line error for a config this decoder does not compute exactly."""
    family = config.model_type
    if family not in LlamaParts.model_types:
        raise SpecchatError(f"the torch decoder runs {', '.join(LlamaParts.model_types)} models, not {family}")
    if config.hidden_act != "silu":
        raise SpecchatError(f"the torch decoder runs SiLU MLPs, not {config.hidden_act}")
    if sliding_window(config):
        raise SpecchatError("the torch decoder has no sliding-window attention")
    if _rope(config).get("partial_rotary_factor", 1.0) != 1.0:
        raise SpecchatError("the torch decoder rotates whole heads (partial_rotary_factor 1)")


def _rope(config) -> dict:
    return getattr(config, "rope_parameters", None) or {"rope_type": "default", "rope_theta": config.rope_theta}


def inverse_frequencies(config, head_dim: int) -> torch.Tensor:
    """RoPE's inverse frequencies `[head_dim / 2]` (fp32) for rope types default, linear and llama3 (Llama 3.1),
    computed as transformers computes them."""
    rope = _rope(config)
    kind = rope.get("rope_type", "default")
    base = rope["rope_theta"]
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / rope["factor"]
    if kind == "llama3":
        factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
        old_context = rope["original_max_position_embeddings"]
        wavelength = 2 * math.pi / inv_freq
        scaled = torch.where(wavelength > old_context / low, inv_freq / factor, inv_freq)
        smooth = (old_context / wavelength - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelength < old_context / high) * ~(wavelength > old_context / low)
        return torch.where(medium, smoothed, scaled)
    raise SpecchatError(f"the torch decoder has no '{kind}' RoPE scaling (default, linear, llama3)")
