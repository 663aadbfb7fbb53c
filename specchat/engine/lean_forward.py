"""The target's forward on a CPU without transformers' module machinery: a Llama-family decoder in one loop.

A decode step of the default model on 2 cores is about 4 ms of 4-bit matmuls and 3 ms of attention; through
transformers' modules it took 14 ms. This forward runs the same modules' weights with what a step needs and
nothing else: one product for q/k/v and one for gate/up (`fuse_projections`), one rotary pass over q and k
together, RMSNorm as one fused call, canonical tree attention on the engine's cache, and the LM head on the
rows asked for. Prefill (many rows, no tree) attends causally through SDPA.

It serves models whose attention is canonical (CPU, bf16 / fp16 activations) and whose layers are plain
Llama ones (llama, mistral without a sliding window, qwen2); `lean_forward` returns None for the rest, which
keep transformers' forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specchat.engine.attention import CANONICAL
from specchat.kernels.canonical_attention import canonical_tree_attention
from specchat.quant.fused import fuse_projections

FAMILIES = ("llama", "mistral", "qwen2")


class LeanForward:
    def __init__(self, model):
        config = model.config
        self.embed, self.norm, self.head = model.model.embed_tokens, model.model.norm, model.lm_head
        self.rotary = model.model.rotary_emb
        self.layers = [_Layer(layer, config) for layer in model.model.layers]
        self.one_node = torch.ones(1, 1, dtype=torch.bool, device=model.device)

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor | None, cache,
                 *, last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Logits [q or 1, vocab] of `tokens` [q] at `positions` [q], written after the cache's prefix, and the
        last layer's output before the final norm [q, hidden_size].

        `tree_mask` [q, q] makes the forward a tree verification; without one, a single token is a decode
        step and several are a causal prefill."""
        rows = tokens.shape[0]
        if tree_mask is None and rows == 1:
            tree_mask = self.one_node
        x = self.embed(tokens)[None]  # [1, q, hidden]
        cos, sin = self.rotary(x, positions[None])
        cos, sin = cos[:, :, None], sin[:, :, None]  # [1, q, 1, D]: broadcast over heads
        for layer, cache_layer in zip(self.layers, cache.layers):
            x = layer(x, cos, sin, cache_layer, tree_mask)
        last = x[:, -1:] if last_only else x
        return self.head(_rms_norm(last, self.norm))[0], x[0]


class _Layer:
    """One decoder layer's weights, read from the model's modules (q/k/v and gate/up fused)."""

    def __init__(self, layer, config):
        attn, mlp = layer.self_attn, layer.mlp
        self.head_dim = attn.head_dim
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.scale = attn.scaling
        self.attention_norm, self.mlp_norm = layer.input_layernorm, layer.post_attention_layernorm
        # bound `forward`s: nn.Module's call machinery (hooks) costs microseconds a call, hundreds of calls a step
        self.qkv = fuse_projections(attn, ("q_proj", "k_proj", "v_proj")).forward
        self.gate_up = fuse_projections(mlp, ("gate_proj", "up_proj")).forward
        self.o_proj, self.down_proj, self.act = attn.o_proj.forward, mlp.down_proj.forward, mlp.act_fn.forward
        self.intermediate = config.intermediate_size

    def __call__(self, x, cos, sin, cache_layer, tree_mask):
        batch, rows, _ = x.shape
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        qkv = self.qkv(_rms_norm(x, self.attention_norm)).view(batch, rows, heads + 2 * kv_heads, dim)
        qk = _rotate(qkv[:, :, : heads + kv_heads], cos, sin)
        q = qk[:, :, :heads].transpose(1, 2)  # [1, H, q, D]
        keys, values = cache_layer.update(qk[:, :, heads:].transpose(1, 2), qkv[:, :, heads + kv_heads :].transpose(1, 2))
        out = x.new_empty(batch, rows, heads, dim)
        if tree_mask is None:
            _causal_attention(q, keys, values, self.scale, out=out.transpose(1, 2))
        else:
            canonical_tree_attention(q, keys, values, keys.shape[2] - rows, tree_mask, self.scale, out=out.transpose(1, 2))
        x = x + self.o_proj(out.view(batch, rows, heads * dim))
        gate, up = self.gate_up(_rms_norm(x, self.mlp_norm)).split(self.intermediate, dim=-1)
        return x + self.down_proj(self.act(gate) * up)


def lean_forward(model) -> LeanForward | None:
    """The lean forward for `model`, or None when it cannot serve it (transformers' forward then runs)."""
    config = model.config
    if config._attn_implementation != CANONICAL or config.model_type not in FAMILIES:
        return None
    return LeanForward(model)


def _rms_norm(x: torch.Tensor, norm) -> torch.Tensor:
    """Llama's RMSNorm (normalise in fp32, round, scale) in one fused call and a product."""
    return norm.weight * F.rms_norm(x.float(), x.shape[-1:], eps=norm.variance_epsilon).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [1, q, heads, D] (the two halves of each head rotate together)."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin


def _causal_attention(q, keys, values, scale: float, *, out: torch.Tensor) -> None:
    """Prefill: each of the q rows sees the cached prefix and the rows up to itself."""
    rows, total = q.shape[2], keys.shape[2]
    mask = torch.ones(rows, total, dtype=torch.bool, device=q.device).tril(total - rows)
    out.copy_(F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale, enable_gqa=True))
