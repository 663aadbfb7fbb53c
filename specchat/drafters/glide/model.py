"""GLIDE's draft model: a small decoder whose layers cross-attend to the target's KV cache, read in place.

The draft (NonvolatileMemory/GliDe_with_a_CaPE_ICML_24, `glide/glideModel.py`) has its own embedding, final
norm and LM head over the target's vocabulary, and N_D layers. A draft trained here shares the target's
embedding and LM head instead (`shared_vocab`: they are frozen copies of the target's in training, so they
are not stored; for a 1.5B target they are 470 MB in bf16). Layer m is

    h = x + self_attn(input_layernorm(x))          # causal, over the draft's own keys / values
    h = h + cross_attn(h)                          # no pre-norm; over the target's layer N_T - N_D + m
    h = h + mlp(post_attention_layernorm(h))       # gate / up / down, SiLU

Self-attention has q / k / v / o without bias and its own rotary embedding (the draft's head_dim and
rope_theta). Cross-attention only projects the query (rotated at the draft position with the target's
rotary module, so it matches the target's post-RoPE keys) and the output: keys and values are the target's,
so its heads, KV heads and head_dim are the target's. The `remap` variant maps the target's keys and values
through a linear layer each (`cross_attn.remap_k` / `remap_v`) before attending.

Row p of a forward sees the draft's own states of positions <= p and the target's of positions < p: the
target has cached every committed position but the newest, so a committed token's draft state is the same
whether it was computed as the root of a tree or caught up later.
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

PREFIXES = ("draft_model.", "small_model.", "module.")  # training wrappers' names, stripped when present


@dataclass(frozen=True)
class GlideConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int  # the draft's own self-attention
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    vocab_size: int
    rope_theta: float  # the draft's own self-attention
    cross_heads: int  # the cross-attention: the target's attention shapes
    cross_kv_heads: int
    cross_head_dim: int
    remap: int = 0  # 0: no remap; else the width remap_k / remap_v act on (head_dim, or kv_heads * head_dim)
    shared_vocab: bool = False  # the target's embedding and LM head, none of its own

    @classmethod
    def from_dict(cls, data: dict, target_config, **changes) -> GlideConfig:
        """The draft of a checkpoint's config.json (a Llama config of the draft's shapes) for this target:
        the cross-attention takes the target's shapes."""
        heads = data["num_attention_heads"]
        target = _attention(target_config.to_dict())
        values = {
            "hidden_size": data["hidden_size"],
            "intermediate_size": data["intermediate_size"],
            "num_hidden_layers": data["num_hidden_layers"],
            "num_attention_heads": heads,
            "num_key_value_heads": data.get("num_key_value_heads") or heads,
            "head_dim": data.get("head_dim") or data["hidden_size"] // heads,
            "rms_norm_eps": data.get("rms_norm_eps", 1e-6),
            "vocab_size": data["vocab_size"],
            "rope_theta": _rope_theta(data),
            "cross_heads": target[0],
            "cross_kv_heads": target[1],
            "cross_head_dim": target[2],
            "shared_vocab": bool(data.get("shared_vocab", False)),
        }
        return cls(**{**values, **changes})

    @classmethod
    def for_target(cls, target_config, **changes) -> GlideConfig:
        """A draft with the target's shapes (its layer count unless `num_hidden_layers` is given)."""
        return cls.from_dict(target_config.to_dict(), target_config, **changes)

    def to_dict(self) -> dict:
        """config.json: the draft's own shapes, and the target attention it reads under the reference's names."""
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["large_num_attention_heads"] = data.pop("cross_heads")
        data["large_num_key_value_heads"] = data.pop("cross_kv_heads")
        data["large_head_dim"] = data.pop("cross_head_dim")
        data["large_hidden_size"] = self.cross_heads * self.cross_head_dim
        data["use_remap"] = data.pop("remap")
        return data


def _attention(data: dict) -> tuple[int, int, int]:
    """(heads, KV heads, head_dim) of a target's config."""
    heads = data["num_attention_heads"]
    return heads, data.get("num_key_value_heads") or heads, data.get("head_dim") or data["hidden_size"] // heads


def _rope_theta(data: dict) -> float:
    theta = data.get("rope_theta") or (data.get("rope_parameters") or {}).get("rope_theta")
    return float(theta or 10000.0)


class Remap(nn.Linear):
    """A linear map of the target's keys or values [kv_heads, n, head_dim]: over each head's head_dim (every
    head alike), or over all heads at once when its width is kv_heads * head_dim."""

    def __init__(self, width: int, bias: bool = False):
        super().__init__(width, width, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.in_features == x.shape[-1]:
            return super().forward(x)
        heads, n, dim = x.shape
        return super().forward(x.transpose(0, 1).reshape(n, heads * dim)).view(n, heads, dim).transpose(0, 1)


class CrossAttention(nn.Module):
    """Only the query and output projections (checkpoints may hold unused k_proj / v_proj: the loader skips
    them), and the optional remaps of the target's keys and values."""

    def __init__(self, config: GlideConfig, remap_bias: bool = False):
        super().__init__()
        size = config.cross_heads * config.cross_head_dim
        self.q_proj = nn.Linear(config.hidden_size, size, bias=False)
        self.o_proj = nn.Linear(size, config.hidden_size, bias=False)
        if config.remap:
            self.remap_k = Remap(config.remap, remap_bias)
            self.remap_v = Remap(config.remap, remap_bias)


class GlideLayer(nn.Module):
    def __init__(self, config: GlideConfig, remap_bias: bool = False):
        super().__init__()
        self.self_attn = SelfAttention(config, bias=False)  # GLIDE's q/k/v have no bias
        self.cross_attn = CrossAttention(config, remap_bias)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class GlideBody(nn.Module):
    def __init__(self, config: GlideConfig, remap_bias: bool = False):
        super().__init__()
        self.embed_tokens = None if config.shared_vocab else nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(GlideLayer(config, remap_bias) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class GlideKV:
    """The draft's own keys and values, `[layers, kv_heads, slots, head_dim]`, allocated once: slot p holds
    position p. Positions [0, length) are valid for the committed ids; a forward writes past them freely."""

    def __init__(self, config: GlideConfig, slots: int, *, dtype: torch.dtype, device: torch.device):
        shape = (config.num_hidden_layers, config.num_key_value_heads, slots, config.head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros_like(self.keys)
        self.length = 0

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)

    def commit(self, length: int) -> None:
        """Positions [0, length) now hold the committed ids' keys and values (a forward wrote them)."""
        self.length = length

    @property
    def slots(self) -> int:
        return self.keys.shape[2]

    def nbytes(self) -> int:
        return 2 * self.keys.numel() * self.keys.element_size()


class GlideModel(nn.Module):
    """The draft; parameter names are the released checkpoints' keys."""

    def __init__(self, config: GlideConfig, *, remap_bias: bool = False):
        super().__init__()
        self.config = config
        self.model = GlideBody(config, remap_bias)
        self.lm_head = None if config.shared_vocab else nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, x: torch.Tensor, start: int | torch.Tensor, kv: GlideKV,
                target_kv: list[tuple[torch.Tensor, torch.Tensor]], cross_rotary: tuple[torch.Tensor, torch.Tensor],
                cross_mask: torch.Tensor | None = None, target_length: torch.Tensor | None = None) -> torch.Tensor:
        """Final-normed states [q, hidden] of token embeddings `x` [q, hidden] at positions start, start + 1, ...
        (their own keys and values are written to those slots of `kv`).

        target_kv: per draft layer, the target keys / values [kv_heads, n, head_dim] it reads (post-RoPE,
        remapped when the draft remaps); row p sees those of positions < p, or those `cross_mask` [q, n]
        shows it (training's block-wise lag). cross_rotary: the target's rotary tables [q, cross_head_dim]
        at the rows' positions.

        A CUDA graph's chain step: `start` a tensor [1] (one row at a position held on the device), target_kv the
        target's whole caches, of which it sees the first `target_length` slots (an int32 tensor [1]).
        """
        config, count = self.config, x.shape[0]
        stepped = isinstance(start, torch.Tensor)
        rows = start if stepped else torch.arange(start, start + count, device=x.device)
        end = None if stepped else start + count
        own_length = (start + 1).to(torch.int32) if stepped else None
        own_cos, own_sin = self.own_rotary(rows)
        cross_cos, cross_sin = cross_rotary
        own_mask = None if count == 1 else torch.arange(end, device=rows.device) <= rows[:, None]
        for index, layer in enumerate(self.model.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = rotate(_heads(attn.q_proj(h), config.num_attention_heads), own_cos, own_sin)
            k = rotate(_heads(attn.k_proj(h), config.num_key_value_heads), own_cos, own_sin)
            v = _heads(attn.v_proj(h), config.num_key_value_heads)
            if stepped:
                kv.keys[index].index_copy_(1, rows, k)
                kv.values[index].index_copy_(1, rows, v)
                out = attend_prefix(q, kv.keys[index], kv.values[index], own_length)
            else:
                kv.keys[index, :, start:end], kv.values[index, :, start:end] = k, v
                out = attend(q, kv.keys[index, :, :end], kv.values[index, :, :end], own_mask)
            x = x + attn.o_proj(_merge(out))
            cross = layer.cross_attn
            keys, values = target_kv[index]
            q = rotate(_heads(cross.q_proj(x), config.cross_heads), cross_cos, cross_sin)
            if stepped:
                read = attend_prefix(q, keys, values, target_length)
            elif cross_mask is not None:
                read = attend(q, keys, values, cross_mask)
            else:
                keys, values = keys[:, : end - 1], values[:, : end - 1]  # the last row sees positions < end - 1
                mask = (None if start >= keys.shape[1]
                        else torch.arange(keys.shape[1], device=rows.device) < rows[:, None])  # fmt: skip
                read = attend(q, keys, values, mask)
            x = x + cross.o_proj(_merge(read))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.model.norm(x)

    def own_rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos / sin [q, head_dim] of the draft's own self-attention at `positions`."""
        dim = self.config.head_dim  # computed here in fp32: a buffer would follow the draft into bf16
        inv_freq = 1.0 / self.config.rope_theta ** (torch.arange(0, dim, 2, device=positions.device) / dim)
        freqs = positions.float()[:, None] * inv_freq[None]
        angles = torch.cat([freqs, freqs], dim=-1)
        dtype = self.model.norm.weight.dtype
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def target_kv(self, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The target's keys / values [kv_heads, n, head_dim] of the layers the draft reads, as it reads them."""
        if not self.config.remap:
            return layers
        return [
            (layer.cross_attn.remap_k(k), layer.cross_attn.remap_v(v))
            for layer, (k, v) in zip(self.model.layers, layers)
        ]


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x.view(x.shape[0], heads, -1).transpose(0, 1)  # [heads, q, head_dim]


def _merge(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(0, 1).reshape(x.shape[1], -1)


def load_glide(path: Path, target_config) -> tuple[GlideModel, torch.Tensor | None]:
    """The GLIDE draft of the checkpoint at `path`, checked against the target it drafts for, and its draft
    vocabulary (None: the whole one).

    Released checkpoints name tensors like a Llama model (`model.layers.N...`, `model.embed_tokens`,
    `model.norm`, `lm_head`); a training prefix is stripped, unused `cross_attn.k_proj` / `v_proj` and rotary
    buffers are skipped, a tied LM head is the embedding. `cross_attn.remap_k` / `remap_v` load when present.
    A draft trained here (`shared_vocab`) holds neither embedding nor head, and may hold `draft_vocab`.
    """
    data, tensors = read_checkpoint(path)
    tensors = strip_prefix(tensors, PREFIXES)
    tensors = {k: v for k, v in tensors.items() if not _unused(k)}
    draft_vocab = tensors.pop("draft_vocab", None)
    if "lm_head.weight" not in tensors and data.get("tie_word_embeddings") and "model.embed_tokens.weight" in tensors:
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    remap = tensors.get("model.layers.0.cross_attn.remap_k.weight")
    try:
        config = GlideConfig.from_dict(data, target_config, remap=0 if remap is None else remap.shape[1])
    except KeyError as missing:
        raise SpecchatError(f"{path}: config.json lacks {missing}") from None
    check_target(config, target_config, f"{path}: the glide draft", _checkpoint_cross(data, tensors, config))
    with torch.device("meta"):  # every weight comes from the file
        model = GlideModel(config, remap_bias="model.layers.0.cross_attn.remap_k.bias" in tensors)
    load_into(model, tensors, path)
    return model, draft_vocab


def _unused(name: str) -> bool:
    return ".cross_attn.k_proj." in name or ".cross_attn.v_proj." in name or name.endswith("rotary_emb.inv_freq")


def _checkpoint_cross(data: dict, tensors: dict, config: GlideConfig) -> tuple[int, int | None, int]:
    """(heads, KV heads or None, head_dim) the checkpoint's cross-attention was trained with, from its config
    (the reference's `large_*` keys) or else the width of its cross-attention query."""
    heads = data.get("large_num_attention_heads")
    if heads:
        size = data.get("large_hidden_size")
        dim = size // heads if size else data.get("large_head_dim") or config.cross_head_dim
        return heads, data.get("large_num_key_value_heads"), dim
    query = tensors.get("model.layers.0.cross_attn.q_proj.weight")
    if query is not None and query.shape[0] != config.cross_heads * config.cross_head_dim:
        return query.shape[0] // config.cross_head_dim, None, config.cross_head_dim
    return config.cross_heads, None, config.cross_head_dim


def check_target(config: GlideConfig, target_config, source: str, cross: tuple | None = None) -> None:
    """One-line errors for a draft that cannot read this target's cache or speak its vocabulary."""
    layers, vocab = target_config.num_hidden_layers, target_config.vocab_size
    if config.vocab_size != vocab:
        raise SpecchatError(f"{source} has a vocabulary of {config.vocab_size} tokens; the target has {vocab}")
    if config.num_hidden_layers > layers:
        raise SpecchatError(f"{source} has {config.num_hidden_layers} layers; the target has only {layers} to read")
    heads, kv, dim = cross or (config.cross_heads, config.cross_kv_heads, config.cross_head_dim)
    target = _attention(target_config.to_dict())
    if (heads, kv or target[1], dim) != target:
        theirs, ours = _shape(heads, kv, dim), _shape(*target)
        raise SpecchatError(f"{source}'s cross-attention has {theirs}; the target's attention has {ours}")


def _shape(heads: int, kv: int | None, dim: int) -> str:
    return f"{heads} heads, {kv} KV heads of {dim}" if kv else f"{heads} heads of {dim}"


def save_glide(path: Path, model: GlideModel, *, dtype: torch.dtype | None = None,
               draft_vocab: torch.Tensor | None = None) -> None:  # fmt: skip
    """A checkpoint `load_glide` reads: config.json and model.safetensors, the weights in `dtype` when given;
    `draft_vocab`: the ids a shared-vocabulary draft predicts over, where fewer than the target's."""
    tensors = {name: tensor.to(dtype or tensor.dtype) for name, tensor in model.state_dict().items()}
    if draft_vocab is not None:
        tensors["draft_vocab"] = draft_vocab.long()
    write_checkpoint(path, {"model_type": "glide", **model.config.to_dict()}, tensors)
