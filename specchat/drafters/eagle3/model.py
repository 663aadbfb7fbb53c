"""EAGLE-3's draft model: one decoder layer over the target's fused features and the next token's embedding.

    h0 = fc([f_low; f_mid; f_high])                 # the target's residual stream entering three layers: 3H -> H
    x  = [input_layernorm(e(token)); hidden_norm(h0)]   # 2H: attention projects from both
    h  = h0 + o(attention(q(x), k(x), v(x)))        # causal over the draft's own keys, RoPE at the row's position
    h  = h + mlp(post_attention_layernorm(h))
    logits = lm_head(norm(h))                       # over the draft vocabulary: target id = draft id + d2t[id]

The row of position p reads the target's features of p and the embedding of token p + 1 (the target's own
embedding, not stored) and guesses token p + 2. A draft a depth further reads, instead of fc's output, the
layer's own output h of the row before: training-time test trains it on exactly that (`objective.py`).

Parameter names and `config.json` are the published checkpoints' (EAGLE-3's `LlamaForCausalLMEagle3`), so
released drafts load (`load_eagle3`) and the drafts trained here load in vLLM and SGLang.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from specchat.architectures.rope import attention_scaling, inverse_frequencies, rope_parameters
from specchat.drafters.checkpoint import load_into, read_checkpoint, strip_prefix, write_checkpoint
from specchat.drafters.draft_attention import attend
from specchat.drafters.draft_layers import MLP, RMSNorm, rotate
from specchat.errors import SpecchatError

ARCHITECTURE = "LlamaForCausalLMEagle3"


def default_feature_layers(layers: int) -> tuple[int, int, int]:
    """EAGLE-3's low, middle and high layers of a target of `layers` layers (the stream entering each; a target
    of fewer than 5 layers, a test's, gets them clamped into its own)."""
    return (min(2, layers), layers // 2, max(layers - 3, 0))


@dataclass(frozen=True)
class Eagle3Config:
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    vocab_size: int  # the target's
    draft_vocab_size: int
    target_hidden_size: int
    feature_layers: tuple[int, ...] | None  # None: EAGLE-3's default for the target it drafts for
    rope: dict = field(default_factory=lambda: {"rope_type": "default", "rope_theta": 10000.0})
    norm_before_residual: bool = False  # some released drafts add the normed h0 back, not h0

    @classmethod
    def from_dict(cls, data: dict) -> Eagle3Config:
        """From a checkpoint's config.json (EAGLE-3's Llama config of the draft layer)."""
        heads = data["num_attention_heads"]
        rope = dict(data.get("rope_scaling") or {})
        rope["rope_type"] = rope.get("rope_type") or rope.get("type") or "default"
        rope["rope_theta"] = data.get("rope_theta", 10000.0)
        layers = (data.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        return cls(
            hidden_size=data["hidden_size"],
            num_attention_heads=heads,
            num_key_value_heads=data.get("num_key_value_heads") or heads,
            head_dim=data.get("head_dim") or data["hidden_size"] // heads,
            intermediate_size=data["intermediate_size"],
            rms_norm_eps=data.get("rms_norm_eps", 1e-6),
            vocab_size=data["vocab_size"],
            draft_vocab_size=data.get("draft_vocab_size") or data["vocab_size"],
            target_hidden_size=data.get("target_hidden_size") or data["hidden_size"],
            feature_layers=tuple(layers) if layers else None,
            rope=rope,
            norm_before_residual=bool(data.get("norm_before_residual", False)),
        )

    @classmethod
    def for_target(cls, config, *, intermediate: int, draft_vocab_size: int) -> Eagle3Config:
        """A draft of the target's width, heads and RoPE, an MLP `intermediate` wide, over `draft_vocab_size`."""
        heads = config.num_attention_heads
        rope = rope_parameters(config)
        return cls(
            hidden_size=config.hidden_size,
            num_attention_heads=heads,
            num_key_value_heads=config.num_key_value_heads or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            intermediate_size=intermediate,
            rms_norm_eps=config.rms_norm_eps,
            vocab_size=config.vocab_size,
            draft_vocab_size=draft_vocab_size,
            target_hidden_size=config.hidden_size,
            feature_layers=default_feature_layers(config.num_hidden_layers),
            rope=dict(rope),
        )

    def layers_for(self, target_layers: int) -> tuple[int, ...]:
        """The target layers whose input states the draft reads."""
        return self.feature_layers or default_feature_layers(target_layers)

    def to_dict(self) -> dict:
        """config.json as released drafts write it, so other engines load ours."""
        rope = {key: value for key, value in self.rope.items() if key != "rope_theta"}
        return {
            "architectures": [ARCHITECTURE], "model_type": "llama", "hidden_act": "silu", "num_hidden_layers": 1,
            "hidden_size": self.hidden_size, "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size, "rms_norm_eps": self.rms_norm_eps,
            "vocab_size": self.vocab_size, "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.target_hidden_size, "rope_theta": self.rope["rope_theta"],
            "rope_scaling": rope if rope.get("rope_type", "default") != "default" else None,
            "norm_before_residual": self.norm_before_residual,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.feature_layers or ()),
                             "use_aux_hidden_state": True},
        }  # fmt: skip


class Attention(nn.Module):
    """q / k / v from the 2H input (embedding and hidden state side by side), o back to H; no biases."""

    def __init__(self, config: Eagle3Config):
        super().__init__()
        heads, kv, dim, width = (config.num_attention_heads, config.num_key_value_heads, config.head_dim,
                                 config.hidden_size)
        self.q_proj = nn.Linear(2 * width, heads * dim, bias=False)
        self.k_proj = nn.Linear(2 * width, kv * dim, bias=False)
        self.v_proj = nn.Linear(2 * width, kv * dim, bias=False)
        self.o_proj = nn.Linear(heads * dim, width, bias=False)
        self.qkv_proj: nn.Linear | None = None  # q, k, v stacked in place of the three (`Eagle3Draft.fused`)
        self.sizes = [heads * dim, kv * dim, kv * dim]

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.qkv_proj is None:
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        return self.qkv_proj(x).split(self.sizes, dim=-1)


class FusedMLP(nn.Module):
    """The MLP with gate and up stacked: one matmul where there were two (a draft step is a few rows, each
    matmul a read of its weights plus a call's overhead)."""

    def __init__(self, mlp: MLP):
        super().__init__()
        self.gate_up_proj = _stacked(mlp.gate_proj, mlp.up_proj)
        self.down_proj = mlp.down_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


def _stacked(*layers: nn.Linear) -> nn.Linear:
    stacked = nn.Linear(layers[0].in_features, sum(layer.out_features for layer in layers), bias=False)
    stacked = stacked.to(device=layers[0].weight.device, dtype=layers[0].weight.dtype).requires_grad_(False)
    stacked.weight.copy_(torch.cat([layer.weight for layer in layers]))
    return stacked


class MidLayer(nn.Module):
    def __init__(self, config: Eagle3Config):
        super().__init__()
        size, eps = config.hidden_size, config.rms_norm_eps
        self.hidden_norm = RMSNorm(size, eps)
        self.input_layernorm = RMSNorm(size, eps)
        self.post_attention_layernorm = RMSNorm(size, eps)
        self.self_attn = Attention(config)
        self.mlp = MLP(SimpleNamespace(hidden_size=size, intermediate_size=config.intermediate_size))


class Eagle3Draft(nn.Module):
    """The draft; the layer runs in two halves around its attention (`project`, `finish`), so inference attends
    over its cache and tree rows and training over its training-time-test rows with the same weights."""

    def __init__(self, config: Eagle3Config):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(3 * config.target_hidden_size, config.hidden_size, bias=False)
        self.midlayer = MidLayer(config)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        # draft id i is target id i + d2t[i]; t2d marks the target ids the draft vocabulary holds
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(config.vocab_size, dtype=torch.bool))
        # fp32 whatever the weights' dtype (not a buffer: `.to(bfloat16)` would round the angles at long contexts), on
        # the host whatever device the weights are built on (the loader's meta device)
        with torch.device("cpu"):
            self.inverse_frequencies = inverse_frequencies(config.rope, config.head_dim)
        self.attention_scaling = attention_scaling(config.rope)  # YaRN's temperature, else 1

    def set_vocab(self, draft_vocab: torch.Tensor) -> None:
        """The draft vocabulary: target ids, ascending, one per lm_head row."""
        self.d2t.copy_(draft_vocab - torch.arange(len(draft_vocab), device=draft_vocab.device))
        self.t2d.zero_()
        self.t2d[draft_vocab] = True

    @property
    def draft_vocab(self) -> torch.Tensor:
        return torch.arange(len(self.d2t), device=self.d2t.device) + self.d2t

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE's cos / sin [q, head_dim] at `positions` [q]."""
        if self.inverse_frequencies.device != positions.device:  # moved once, not copied from the host every depth
            self.inverse_frequencies = self.inverse_frequencies.to(positions.device)
        angles = positions.float()[:, None] * self.inverse_frequencies[None]
        angles = torch.cat([angles, angles], dim=-1)
        cos, sin = angles.cos() * self.attention_scaling, angles.sin() * self.attention_scaling
        return cos.to(dtype), sin.to(dtype)

    def project(self, hidden: torch.Tensor, embeds: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """The rows' queries [heads, q, D] and keys / values [kv_heads, q, D] (rotated), and the residual the
        attention's output joins: `hidden` [q, H] is fc's output (or the draft's own output a depth on),
        `embeds` [q, H] the embeddings of the tokens the rows read."""
        layer, config = self.midlayer, self.config
        normed = layer.hidden_norm(hidden)
        x = torch.cat([layer.input_layernorm(embeds), normed], dim=-1)
        q, k, v = layer.self_attn.qkv(x)
        q = rotate(_heads(q, config.num_attention_heads, config.head_dim), cos, sin)
        k = rotate(_heads(k, config.num_key_value_heads, config.head_dim), cos, sin)
        v = _heads(v, config.num_key_value_heads, config.head_dim)
        return q, k, v, normed if config.norm_before_residual else hidden

    def finish(self, residual: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The layer's output [q, H] from the attention's [heads, q, D]."""
        layer = self.midlayer
        h = residual + layer.self_attn.o_proj(attended.transpose(0, 1).reshape(attended.shape[1], -1))
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def forward(self, hidden, embeds, positions, write, mask):
        """Outputs [q, H] of rows reading `hidden` and `embeds` at `positions`: `write(keys, values)` stores the
        rows' keys and values [kv_heads, q, D] where the draft keeps them and returns every key and value the rows
        attend over, theirs included, which `mask` [q, k] (True: visible) selects."""
        cos, sin = self.tables(positions, hidden.dtype)
        q, k, v, residual = self.project(hidden, embeds, cos, sin)
        return self.finish(residual, attend(q, *write(k, v), mask))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h))

    @torch.no_grad()
    def fused(self) -> Eagle3Draft:
        """A copy for inference whose q / k / v and gate / up each run as one matmul (fewer, larger reads of
        the weights: a draft forward is a few rows)."""
        draft = copy.deepcopy(self)
        attention = draft.midlayer.self_attn
        attention.qkv_proj = _stacked(attention.q_proj, attention.k_proj, attention.v_proj)
        del attention.q_proj, attention.k_proj, attention.v_proj
        draft.midlayer.mlp = FusedMLP(draft.midlayer.mlp)
        return draft


def _heads(x: torch.Tensor, heads: int, dim: int) -> torch.Tensor:
    return x.view(x.shape[0], heads, dim).transpose(0, 1)


def load_eagle3(path: Path, target_config) -> Eagle3Draft:
    """The EAGLE-3 draft at `path`, checked against the target it drafts for (its width and vocabulary).
    Released drafts may prefix tensors with `model.` and carry the target's embedding (unused: the draft reads
    the target's own)."""
    data, tensors = read_checkpoint(path)
    tensors = strip_prefix(tensors, ("model.",))
    tensors.pop("embed_tokens.weight", None)
    try:
        config = Eagle3Config.from_dict(data)
    except KeyError as missing:
        raise SpecchatError(f"{path}: config.json lacks {missing}") from None
    if (config.target_hidden_size, config.vocab_size) != (target_config.hidden_size, target_config.vocab_size):
        raise SpecchatError(
            f"{path}: the EAGLE-3 draft is for a target of hidden size {config.target_hidden_size} and "
            f"{config.vocab_size} tokens; this one has {target_config.hidden_size} and {target_config.vocab_size}"
        )
    layers = config.layers_for(target_config.num_hidden_layers)
    if len(layers) != 3 or not all(0 <= layer <= target_config.num_hidden_layers for layer in layers):
        raise SpecchatError(f"{path}: the draft reads target layers {list(layers)}, not three of this target's")
    with torch.device("meta"):  # every weight comes from the file
        draft = Eagle3Draft(config)
    if config.draft_vocab_size == config.vocab_size:  # the whole vocabulary: no mapping needed
        tensors.setdefault("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
    if "d2t" in tensors and "t2d" not in tensors:  # t2d says what d2t says
        draft_vocab = torch.arange(len(tensors["d2t"])) + tensors["d2t"]
        tensors["t2d"] = torch.zeros(config.vocab_size, dtype=torch.bool).index_fill_(0, draft_vocab, True)
    if "t2d" in tensors:
        tensors["t2d"] = tensors["t2d"].bool()
    load_into(draft, tensors, path)
    return draft


def save_eagle3(path: Path, draft: Eagle3Draft, dtype: torch.dtype | None = None) -> None:
    """A checkpoint in the released layout (config.json and model.safetensors), weights in `dtype` when given."""
    tensors = {
        name: tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor
        for name, tensor in draft.state_dict().items()
    }
    write_checkpoint(path, draft.config.to_dict(), tensors)
