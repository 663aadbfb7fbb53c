"""The Llama family's model as plain torch modules, for the weights specchat places itself (a GGUF file's blocks).

The module tree and names are those of transformers' `*ForCausalLM` (`model.layers[i].self_attn.q_proj`, ...), so
`LlamaParts` reaches into either, and the norms, the MLP and the rotary embedding compute what transformers'
compute, op for op. There is no model forward: the engine's forwards (the CPU decoder, the torch decoder) read
the parts. What this saves is transformers' model and config classes, whose import is about 2.5 s of every
launch (they pull in its loading, kernel-hub and tensor-parallel machinery); transformers still converts a
file's tokenizer and config once, and stays the reference the tests compare against.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from specchat.architectures.rope import (
    attention_scaling,
    inverse_frequencies,
    rope_parameters,
    rotary_dims,
    uses_long_factors,
)
from specchat.kernels.cpu.cpu_decoder import DENSE_PRODUCT, cpu_decoder


class ModelConfig:
    """A config.json's fields as attributes (transformers writes every field of a Llama-family config there)."""

    def __init__(self, fields: dict):
        self.__dict__.update(fields)
        heads = fields["num_attention_heads"]
        self.num_key_value_heads = fields.get("num_key_value_heads") or heads
        self.head_dim = fields.get("head_dim") or fields["hidden_size"] // heads

    @classmethod
    def from_dir(cls, directory: str) -> ModelConfig:
        return cls(json.loads((Path(directory) / "config.json").read_text()))

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class GenerationConfig:
    """What the engine reads of transformers' generation config: a GGUF file names no sampling defaults."""

    eos_token_id: int | list[int] | None = None
    do_sample: bool = False


class Slot(nn.Module):
    """Where a loader places a weight matrix's layer: its shape, on the meta device (`nn.Linear` and `nn.Embedding`
    would draw random values first: on the meta device that imports torch's compiler, 1.5 s). An embedding's rows
    may come out times `scale` (Gemma's sqrt(hidden))."""

    def __init__(self, out_features: int, in_features: int, *, embedding: bool = False, scale: float = 1.0):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device="meta"), requires_grad=False)
        self.embedding, self.scale = embedding, scale


def dense_linear(weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> nn.Linear:
    """An `nn.Linear` over `weight` and `bias` in `dtype` (no copy where they are in it already: a file's mapped
    memory stays the weight), built without the random values its constructor draws (a billion take seconds); an
    fp16 weight beside bf16 or fp32 activations on a CPU stays fp16 (`HalfLinear`)."""
    half = weight.dtype == torch.float16 and dtype in (torch.bfloat16, torch.float32) and weight.device.type == "cpu"
    kind = HalfLinear if half else nn.Linear
    layer = kind.__new__(kind)
    nn.Module.__init__(layer)
    layer.out_features, layer.in_features = weight.shape
    layer.weight = nn.Parameter(weight if half else weight.to(dtype), requires_grad=False)
    layer.register_parameter("bias", None if bias is None else nn.Parameter(bias.to(dtype), requires_grad=False))
    return layer


class HalfLinear(nn.Linear):
    """A matrix in fp16 as an F16 file or checkpoint holds it, beside bf16 or fp32 activations: the CPU decoder's
    product converts each weight exactly (rounded to bf16 it would lose three of its eleven bits, and be a copy);
    elsewhere the weight is converted to the activations' dtype for the product."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in (torch.bfloat16, torch.float32) or x.device.type != "cpu" or not DENSE_PRODUCT \
                or self.in_features % 32:  # fmt: skip
            return F.linear(x, self.weight.to(x.dtype), self.bias)
        out = cpu_decoder().dense_matmul(x.reshape(-1, self.in_features), self.weight).to(x.dtype)
        out = out.view(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias


class ScaledEmbedding(nn.Embedding):
    """Rows times `scale` (Gemma's sqrt(hidden)) as they are looked up, the table left unscaled (a tied LM head shares
    it): multiplied in fp32 and rounded once to `dtype`, as llama.cpp scales a GGUF file's rows, or with `as_weight`
    in the weight's dtype by the scale rounded to it, as transformers' Gemma does."""

    def __init__(self, weight: torch.Tensor, scale: float, dtype: torch.dtype, *, as_weight: bool = False):
        super().__init__(*weight.shape, _weight=weight, _freeze=True)
        self.scale, self.out_dtype, self.as_weight = scale, dtype, as_weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = super().forward(ids)
        if self.as_weight:
            return rows * torch.tensor(self.scale, dtype=rows.dtype)
        return (rows.float() * self.scale).to(self.out_dtype)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(size, device="meta"), requires_grad=False)  # the loader's to place
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """In fp32, the weight applied in the input's dtype (transformers' rounding)."""
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """(x, positions [batch, q]) -> cos, sin [batch, q, rotated dims] in x's dtype (scaled by YaRN's or LongRoPE's
    factor), for the layers of `layer_type` where the config says RoPE per kind of layer."""

    def __init__(self, config: ModelConfig, layer_type: str = "full_attention"):
        super().__init__()
        self.rope, self.dims = rope_parameters(config, layer_type), rotary_dims(config)
        self.register_buffer("inv_freq", inverse_frequencies(self.rope, self.dims), persistent=False)
        self.attention_scaling = attention_scaling(self.rope, config.max_position_embeddings)

    def fit(self, capacity: int) -> None:
        """Rotate as a cache of `capacity` positions is to be rotated (LongRoPE's long or short factors)."""
        long = uses_long_factors(self.rope, capacity)
        self.inv_freq = inverse_frequencies(self.rope, self.dims, long=long).to(self.inv_freq.device)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin = angles.cos(), angles.sin()
        if self.attention_scaling != 1.0:  # YaRN's temperature (times 1 is exact: skipped in the decode loop)
            cos, sin = cos * self.attention_scaling, sin * self.attention_scaling
        return cos.to(x.dtype), sin.to(x.dtype)


class Attention(nn.Module):
    """The projections' places (their weights, and biases where a model has them, are the file's)."""

    def __init__(self, config: ModelConfig, index: int):
        super().__init__()
        hidden, dim = config.hidden_size, config.head_dim
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.q_proj = Slot(heads * dim, hidden)
        self.k_proj = Slot(kv_heads * dim, hidden)
        self.v_proj = Slot(kv_heads * dim, hidden)
        self.o_proj = Slot(hidden, heads * dim)
        if config.model_type == "qwen3":  # a norm over each head's queries and keys, before RoPE
            self.q_norm = RMSNorm(dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(dim, config.rms_norm_eps)
        self.head_dim = dim
        self.scaling = getattr(config, "attention_multiplier", None) or dim**-0.5  # Granite's, else D^-1/2
        flags = getattr(config, "no_rope_layers", None)  # SmolLM3's: 0 for a layer without RoPE (NoPE)
        self.use_rope = bool(flags[index]) if flags else True
        self.window = (getattr(config, "sliding_window", None) or 0) if _sliding(config, index) else 0  # 0: none


class MLP(nn.Module):
    activation = staticmethod(F.silu)  # of the gate

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_proj = Slot(config.intermediate_size, config.hidden_size)
        self.up_proj = Slot(config.intermediate_size, config.hidden_size)
        self.down_proj = Slot(config.hidden_size, config.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.activation(self.gate_proj(x)) * self.up_proj(x))


def _sliding(config: ModelConfig, index: int) -> bool:
    """Whether layer `index` has the config's sliding window: as `layer_types` says (Qwen2's from `max_window_layers`
    on), else every layer (Mistral's, Phi-3's) unless `use_sliding_window` is false."""
    kinds = getattr(config, "layer_types", None)
    return kinds[index] == "sliding_attention" if kinds else getattr(config, "use_sliding_window", True) is not False


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, index: int):
        super().__init__()
        self.self_attn = Attention(config, index)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class Decoder(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = Slot(config.vocab_size, config.hidden_size, embedding=True)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config)


class CausalLM(nn.Module):
    """The decoder and its LM head, every weight on the meta device until a loader places it. `dtype` is the
    activations' (the weights may be blocks of bytes); `name_or_path` the directory of its config (calibrations
    are kept by it). Another architecture's model is this one with its own `Decoder` and `check`."""

    Decoder = Decoder

    def __init__(self, config: ModelConfig, dtype: torch.dtype, name_or_path: str = ""):
        super().__init__()
        self.check(config)
        self.config = config
        self.generation_config = GenerationConfig(eos_token_id=getattr(config, "eos_token_id", None))
        self.dtype, self.name_or_path = dtype, name_or_path
        self.model = self.Decoder(config)
        self.lm_head = Slot(config.vocab_size, config.hidden_size)

    @staticmethod
    def check(config: ModelConfig) -> None:
        """A ValueError for a config these modules do not compute."""
        if config.hidden_act != "silu":
            raise ValueError(f"its MLP's activation is {config.hidden_act}; specchat runs SiLU MLPs")

    @property
    def device(self) -> torch.device:
        return self.model.norm.weight.device
