"""The Llama layout, as transformers builds it for llama, mistral, qwen2 (biases inside the q/k/v projections)
and qwen3 (a norm over each head's queries and keys): a pre-norm decoder whose layer is

    h = x + o(attention(rope(q(n1(x))), rope(k(n1(x))), v(n1(x))))      n1 = input norm
    y = h + down(silu(gate(n2(h))) * up(n2(h)))                         n2 = post-attention norm
"""

from __future__ import annotations

import torch
from torch import nn


class LlamaLayer:
    """One decoder layer's parts. Read from the module at each access: quantization and fusion replace
    projections in place."""

    def __init__(self, module: nn.Module):
        self.module = module

    @property
    def attention(self) -> nn.Module:
        """Owner of the q/k/v/o projections (where `fuse_projections` installs its views)."""
        return self.module.self_attn

    q = property(lambda self: self.module.self_attn.q_proj)
    k = property(lambda self: self.module.self_attn.k_proj)
    v = property(lambda self: self.module.self_attn.v_proj)
    o = property(lambda self: self.module.self_attn.o_proj)
    qkv_names = ("q_proj", "k_proj", "v_proj")  # on `attention`
    mlp = property(lambda self: self.module.mlp)  # callable: down(silu(gate(x)) * up(x))
    gate_up_names = ("gate_proj", "up_proj")  # on `mlp`
    down = property(lambda self: self.module.mlp.down_proj)
    input_norm = property(lambda self: self.module.input_layernorm)
    mlp_norm = property(lambda self: self.module.post_attention_layernorm)  # what the MLP reads
    attention_output_norm = mlp_output_norm = None  # a norm of each half's output before the residual (Gemma's)
    window = property(lambda self: getattr(self.module.self_attn, "window", 0))  # keys a row sees back (0: all)
    rope = 0  # which of `LlamaParts.rotaries` rotates this layer
    rotates = True  # whether RoPE rotates its queries and keys at all (SmolLM3's NoPE layers: no)

    @property
    def q_norm(self) -> nn.Module | None:
        """The norm over each head's query before RoPE (qwen3), or None."""
        return getattr(self.module.self_attn, "q_norm", None)

    @property
    def k_norm(self) -> nn.Module | None:
        """The norm over each head's key before RoPE (qwen3), or None."""
        return getattr(self.module.self_attn, "k_norm", None)

    @property
    def head_dim(self) -> int:
        return self.module.self_attn.head_dim

    @property
    def scaling(self) -> float:
        return self.module.self_attn.scaling


class LlamaParts:
    model_types = ("llama", "mistral", "qwen2", "qwen3", "granite")
    Layer = LlamaLayer

    def __init__(self, model: nn.Module):
        self.model = model

    @property
    def embed(self) -> nn.Module:
        return self.model.model.embed_tokens

    @property
    def layer_modules(self) -> nn.ModuleList:
        return self.model.model.layers

    @property
    def layers(self) -> list[LlamaLayer]:
        return [self.Layer(module) for module in self.model.model.layers]

    @property
    def query_layer(self) -> int:
        """The last layer that attends to every position (a sliding window's does not; the last where all have one):
        its query and keys rank a long context as the target reads it (SpecExtend's retrieval)."""
        windows = [layer.window for layer in self.layers]
        return max((i for i, window in enumerate(windows) if not window), default=len(windows) - 1)

    @property
    def norm(self) -> nn.Module:
        """The final norm, before the LM head."""
        return self.model.model.norm

    @property
    def head(self) -> nn.Module:
        return self.model.lm_head

    @property
    def rotary(self) -> nn.Module:
        """(x, positions [1, q]) -> cos, sin [1, q, head_dim]."""
        return self.model.model.rotary_emb

    @property
    def embedding_scale(self) -> float:
        """What the forward multiplies the embedding's rows by (Granite's multiplier: transformers' embedding module
        does not apply it, the model's forward does)."""
        return getattr(self.model.config, "embedding_multiplier", 1.0)

    @property
    def residual_scale(self) -> float:
        """What each layer's halves are multiplied by as they join the residual stream (Granite's multiplier)."""
        return getattr(self.model.config, "residual_multiplier", 1.0)

    @property
    def logit_scale(self) -> float:
        """What the LM head's logits are divided by (Granite's `logits_scaling`)."""
        return getattr(self.model.config, "logits_scaling", 1.0)

    @property
    def attention_cap(self) -> float:
        """Attention scores soft-capped to (-cap, cap) before the softmax (Gemma 2's), or 0."""
        return getattr(self.model.config, "attn_logit_softcapping", None) or 0.0

    @property
    def logit_cap(self) -> float:
        """The LM head's logits soft-capped to (-cap, cap) (Gemma 2's), or 0."""
        return getattr(self.model.config, "final_logit_softcapping", None) or 0.0

    @property
    def rotaries(self) -> list[nn.Module]:
        """Every RoPE the layers rotate by (`LlamaLayer.rope` indexes it)."""
        return [self.rotary]

    @property
    def last_rotary(self) -> nn.Module:
        """The RoPE of the last layer, whose keys LongSpec's and GLIDE's drafts attend to with their own queries: the
        model's (a NoPE layer's identity, a sliding-window layer's own)."""
        return self.rotaries[self.layers[-1].rope]

    def share_embedding_and_head(self, embed: nn.Module, head: nn.Module) -> None:
        """Use another model's embedding and LM head (a student's are its target's)."""
        self.model.model.embed_tokens = embed
        self.model.lm_head = head

    def rebuild_rotary(self, device: torch.device) -> None:
        """Rebuild the rotary tables that a construction on the meta device left empty."""
        with torch.device(device):
            self.model.model.rotary_emb = self.model.model.rotary_emb.__class__(self.model.config)

    @staticmethod
    def in_first_layers(name: str, layers: int) -> bool:
        """Whether a state-dict entry belongs to the first `layers` layers or the final norm (a student's own)."""
        if name == "model.norm.weight":
            return True
        return name.startswith("model.layers.") and int(name.split(".")[2]) < layers
