"""LongSpec's draft model: one decoder layer that reads the target's KV cache instead of keeping its own copy.

The layer (sail-sg/LongSpec, `LlamaGlideDecoderLayer`) is three pre-norm residual blocks:

    h = x + self_attn(input_layernorm(x))                      # over the draft's last `window` positions
    h = h + cross_attn(post_self_attention_layernorm(h))       # over the target's last layer, read in place
    h = h + mlp(post_cross_attention_layernorm(h))             # gate / up / down, SiLU

and its output goes straight into the target's LM head (no final norm). Self-attention has biased q/k/v;
cross-attention only projects the query (RoPE at the draft position) and the output: its keys and values
are the target's last-layer keys and values, post-RoPE, as the target cached them.

The draft's own keys and values depend only on each token and its position (the layer's input is the
token's embedding), so the draft keeps them for the last `window` positions in a ring buffer: its memory
is the same at 1K and at 100K tokens of context.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from specchat.drafters.checkpoint import load_into, read_checkpoint, strip_prefix, write_checkpoint
from specchat.drafters.draft_attention import attend, attend_prefix
from specchat.drafters.draft_layers import MLP, RMSNorm, SelfAttention, rotate
from specchat.errors import SpecchatError

WINDOW = 512  # the reference's sliding window over the draft's own states


@dataclass(frozen=True)
class LongSpecConfig:
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    window: int = WINDOW

    @classmethod
    def from_dict(cls, data: dict) -> LongSpecConfig:
        """From a checkpoint's config.json (a Llama config of the draft's shapes) or a target's config."""
        heads = data["num_attention_heads"]
        return cls(
            hidden_size=data["hidden_size"],
            num_attention_heads=heads,
            num_key_value_heads=data.get("num_key_value_heads") or heads,
            head_dim=data.get("head_dim") or data["hidden_size"] // heads,
            intermediate_size=data["intermediate_size"],
            rms_norm_eps=data.get("rms_norm_eps", 1e-6),
            window=data.get("window", WINDOW),
        )

    @classmethod
    def for_target(cls, config, *, intermediate: int = 0, **changes) -> LongSpecConfig:
        """The target's layer shapes; `intermediate` the MLP's width where not the target's (0)."""
        width = {"intermediate_size": intermediate} if intermediate else {}
        return cls.from_dict({**config.to_dict(), **width, **changes})

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


class CrossAttention(nn.Module):
    """Only the query and output projections: keys and values are the target's (checkpoints also hold
    k_proj / v_proj, which the reference never uses; the loader skips them)."""

    def __init__(self, config: LongSpecConfig):
        super().__init__()
        heads, dim = config.num_attention_heads, config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, heads * dim, bias=True)
        self.o_proj = nn.Linear(heads * dim, config.hidden_size, bias=False)


class LongSpecLayer(nn.Module):
    """The draft layer; parameter names are the released checkpoints' keys."""

    def __init__(self, config: LongSpecConfig):
        super().__init__()
        self.config = config
        self.self_attn = SelfAttention(config)
        self.cross_attn = CrossAttention(config)
        self.mlp = MLP(config)
        size, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = RMSNorm(size, eps)
        self.post_self_attention_layernorm = RMSNorm(size, eps)
        self.post_cross_attention_layernorm = RMSNorm(size, eps)

    def own_kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The draft's own keys (rotated) and values of embeddings x [q, hidden]: [kv_heads, q, head_dim] each."""
        h = self.input_layernorm(x)
        k = self._heads(self.self_attn.k_proj(h), self.config.num_key_value_heads)
        v = self._heads(self.self_attn.v_proj(h), self.config.num_key_value_heads)
        return rotate(k, cos, sin), v

    def forward(self, x, cos, sin, own_keys, own_values, own_mask, target_keys, target_values,
                target_mask=None, target_length=None) -> torch.Tensor:  # fmt: skip
        """Outputs [q, hidden] of embeddings x [q, hidden] at the positions whose rotary tables are cos / sin
        [q, head_dim].

        own_keys / own_values [kv_heads, k, head_dim] are the draft's own states the rows may see, x's own
        included, with own_mask [q, k] (True = visible); target_keys / target_values [kv_heads, n, head_dim]
        are the target's last layer, which every row sees whole at inference (target_mask [q, n] in training,
        where the target's cache lags each row). With `target_length` (an int32 tensor [1]) they are the
        target's whole cache, of which every row sees the first `target_length` slots (a CUDA graph's read).
        """
        config = self.config
        h = self.input_layernorm(x)
        q = rotate(self._heads(self.self_attn.q_proj(h), config.num_attention_heads), cos, sin)
        x = x + self.self_attn.o_proj(self._merge(attend(q, own_keys, own_values, own_mask)))
        h = self.post_self_attention_layernorm(x)
        q = rotate(self._heads(self.cross_attn.q_proj(h), config.num_attention_heads), cos, sin)
        if target_length is None:
            read = attend(q, target_keys, target_values, target_mask)
        else:
            read = attend_prefix(q, target_keys, target_values, target_length)
        x = x + self.cross_attn.o_proj(self._merge(read))
        return x + self.mlp(self.post_cross_attention_layernorm(x))

    def _heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        return x.view(x.shape[0], heads, self.config.head_dim).transpose(0, 1)  # [heads, q, head_dim]

    @staticmethod
    def _merge(x: torch.Tensor) -> torch.Tensor:
        return x.transpose(0, 1).reshape(x.shape[1], -1)


class RingKV:
    """The draft's own keys and values for the last `window` positions: position p lives in slot p % window."""

    def __init__(self, window: int, kv_heads: int, head_dim: int, *, dtype: torch.dtype, device: torch.device):
        self.window = window
        self.keys = torch.zeros(kv_heads, window, head_dim, dtype=dtype, device=device)
        self.values = torch.zeros_like(self.keys)
        self.positions = torch.full((window,), -1, dtype=torch.long, device=device)  # -1: empty slot
        self.length = 0  # positions [0, length) have been written (the last `window` of them are kept)

    def write(self, start: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Keys / values [kv_heads, q, D] of positions start, start + 1, ... (the last `window` are kept)."""
        count = keys.shape[1]
        keep = min(count, self.window)
        positions = torch.arange(start + count - keep, start + count, device=self.keys.device)
        slots = positions % self.window
        self.keys[:, slots] = keys[:, count - keep :]
        self.values[:, slots] = values[:, count - keep :]
        self.positions[slots] = positions
        self.length = start + count

    def truncate(self, length: int) -> None:
        """Drop positions >= `length` (a request that shares only part of what was written)."""
        self.positions[self.positions >= length] = -1
        self.length = min(self.length, length)

    def visible(self, query_positions: torch.Tensor) -> torch.Tensor:
        """[q, window] which slots each query sees: written, not after it, and inside its window."""
        slots = self.positions[None]
        queries = query_positions[:, None]
        return (slots >= 0) & (slots <= queries) & (slots > queries - self.window)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.keys, self.values, self.positions))


def load_longspec(path: Path, target_config) -> tuple[LongSpecLayer, torch.Tensor | None]:
    """The draft layer of the checkpoint at `path` and its draft vocabulary (None: the target's whole one).

    Released checkpoints name tensors without a prefix, the reference trainer with `draft_model.`; both load.
    `cross_attn.k_proj` / `v_proj` are skipped (unused). The draft must match the target's attention shapes:
    it reads the target's keys and values and feeds the target's LM head.
    """
    data, tensors = read_checkpoint(path)
    tensors = strip_prefix(tensors, ("draft_model.",))
    tensors = {k: v for k, v in tensors.items() if not k.startswith(("cross_attn.k_proj.", "cross_attn.v_proj."))}
    draft_vocab = tensors.pop("draft_vocab", None)
    try:
        config = LongSpecConfig.from_dict(data)
    except KeyError as missing:
        raise SpecchatError(f"{path}: config.json lacks {missing}") from None
    target = LongSpecConfig.for_target(target_config)
    shape = lambda c: (f"hidden {c.hidden_size}, {c.num_attention_heads} heads, "  # noqa: E731
                       f"{c.num_key_value_heads} KV heads of {c.head_dim}")
    if shape(config) != shape(target):
        raise SpecchatError(f"{path}: the longspec draft has {shape(config)}; the target has {shape(target)}")
    with torch.device("meta"):  # every weight comes from the file
        layer = LongSpecLayer(config)
    load_into(layer, tensors, path)
    return layer, draft_vocab


def save_longspec(path: Path, layer: LongSpecLayer, draft_vocab: torch.Tensor | None = None,
                  dtype: torch.dtype | None = None) -> None:  # fmt: skip
    """A checkpoint `load_longspec` reads: config.json and model.safetensors (with `draft_vocab` when reduced),
    the weights in `dtype` when given (a trained draft ships in bf16, the precision it runs in)."""
    tensors = {name: tensor.to(dtype or tensor.dtype) for name, tensor in layer.state_dict().items()}
    if draft_vocab is not None:
        tensors["draft_vocab"] = draft_vocab.long()
    write_checkpoint(path, {"model_type": "longspec", **layer.config.to_dict()}, tensors)
