"""A transformers config for a GGUF file of the llama family (llama, qwen2, qwen3, mistral, phi3, granite, smollm3) or
Gemma 3 and 2, read from its header.

A GGUF file's metadata is its model's config under llama.cpp's key names (`qwen2.embedding_length`, ...). transformers
reads it through gguf-py, which parses the tokenizer's 150K strings on the way (10-12 s for a 1.5B's file, twice per
conversion); the header walk here takes a fraction of a second. Its RoPE scaling is the file's too: `rope.scaling.*` for
linear and YaRN scaling, a `rope_freqs` tensor for Llama 3.1's (transformers reads none of them); Phi-3's LongRoPE as
its `rope_factors_long` / `_short` tensors. Gemma 3's file leaves some of its config to llama.cpp's code (the sliding
window's pattern and RoPE base, the query scale): they are taken as llama.cpp takes them.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specchat.architectures.rope import rope_of_frequency_factors
from specchat.gguf_header import header_fields, tensor_table

ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral", "phi3", "granite", "smollm3", "gemma3", "gemma2")
# Granite's scalars: its config's names for llama.cpp's keys
GRANITE_SCALES = {"embedding_multiplier": "embedding_scale", "residual_multiplier": "residual_scale",
                  "attention_multiplier": "attention.scale", "logits_scaling": "logit_scale"}  # fmt: skip
GEMMA3_PATTERN = 6  # llama.cpp's default: every sixth layer attends over everything, the others over a window
GEMMA3_LOCAL_BASE = 10000.0  # the sliding-window layers' RoPE base, where the file names none
GEMMA3_27B_LAYERS = 62  # whose queries are scaled by (hidden / heads)^-1/2, not head_dim^-1/2 (llama.cpp's rule)
GEMMA2_27B_LAYERS = 46  # the same for Gemma 2
TOKEN_IDS = {"bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id", "pad_token_id": "padding_token_id",
             "unk_token_id": "unknown_token_id"}  # fmt: skip


def gguf_config(path: Path):
    """The config of the model in the GGUF file at `path`; a ValueError naming what the file lacks or has that
    specchat does not run (another architecture, a RoPE scaling other than linear, YaRN or Llama 3's)."""
    from transformers import AutoConfig

    fields = header_fields(path)
    tensors = {row[0]: row for row in tensor_table(path)}
    architecture = fields.get("general.architecture")
    if architecture not in ARCHITECTURES:
        raise ValueError(f"{path.name} is a {architecture} model; specchat runs {', '.join(ARCHITECTURES)} GGUF files")

    def field(name: str, default=None):
        value = fields.get(f"{architecture}.{name}", default)
        if value is None:
            raise ValueError(f"{path.name} has no '{architecture}.{name}' field")
        return value

    heads, hidden = field("attention.head_count"), field("embedding_length")
    head_dim = field("attention.key_length", hidden // heads)
    if "token_embd.weight" not in tensors:
        raise ValueError(f"{path.name} has no token embedding (tensor 'token_embd.weight')")
    config = {
        "max_position_embeddings": field("context_length"),
        "hidden_size": hidden,
        "intermediate_size": field("feed_forward_length"),
        "num_hidden_layers": field("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": field("attention.head_count_kv", heads),
        "head_dim": head_dim,
        "rms_norm_eps": field("attention.layer_norm_rms_epsilon"),
        "rope_parameters": _rope(path, fields, architecture, head_dim, field("context_length"),
                                 tensors.get("rope_freqs.weight")),
        "vocab_size": tensors["token_embd.weight"][2][1],  # GGUF shapes list the row length first
        "tie_word_embeddings": "output.weight" not in tensors,  # llama.cpp writes no head tied to the embedding
    }
    rope = config["rope_parameters"]
    if rope["rope_type"] == "yarn":  # its window is the stretched one (as vLLM reads a YaRN config)
        stretched = int(rope["original_max_position_embeddings"] * rope["factor"])
        config["max_position_embeddings"] = max(config["max_position_embeddings"], stretched)
    for name, key in TOKEN_IDS.items():  # those the file names (else the config class's defaults, as transformers')
        if f"tokenizer.ggml.{key}" in fields:
            config[name] = fields[f"tokenizer.ggml.{key}"]
    if architecture == "gemma3":
        return AutoConfig.for_model("gemma3_text", **{**config, **_gemma3(fields, field, rope)})
    if architecture == "gemma2":
        return AutoConfig.for_model("gemma2", **{**config, **_gemma2(fields, field)})
    config["sliding_window"] = fields.get(f"{architecture}.attention.sliding_window") or None  # every layer's
    if architecture == "granite":
        scales = {name: f"granite.{key}" for name, key in GRANITE_SCALES.items()}
        config.update({name: fields[key] for name, key in scales.items() if key in fields})
    if architecture == "phi3":
        config.pop("head_dim")  # Phi3Config derives it from hidden / heads
        config["rope_parameters"] = _phi3_rope(path, fields, tensors, rope, head_dim, field("context_length"))
        config["original_max_position_embeddings"] = config["rope_parameters"]["original_max_position_embeddings"]
    return AutoConfig.for_model(architecture, **config)


def _phi3_rope(path: Path, fields: dict, tensors: dict, rope: dict, head_dim: int, context_length: int) -> dict:
    """Phi-3's RoPE: the rotated share of a head (`rope.dimension_count`) and, where the file has the factors
    tensors, LongRoPE (its attention factor as the converter computed it, else 1)."""
    rotated = fields.get("phi3.rope.dimension_count", head_dim)
    original = fields.get("phi3.rope.scaling.original_context_length", context_length)
    rope = {**rope, "original_max_position_embeddings": original}
    if rotated != head_dim:
        rope["partial_rotary_factor"] = rotated / head_dim
    rows = [tensors.get(f"rope_factors_{kind}.weight") for kind in ("long", "short")]
    if rows[0] is None or rows[1] is None:
        return rope
    long, short = (_f32_tensor(path, row).tolist() for row in rows)
    attention = fields.get("phi3.rope.scaling.attn_factor", 1.0)
    return {**rope, "rope_type": "longrope", "long_factor": long, "short_factor": short, "attention_factor": attention}


def _f32_tensor(path: Path, row: list) -> torch.Tensor:
    """A small F32 tensor of the file (its table row), read from disk."""
    name, kind, _, offset, size = row
    if kind != 0:
        raise ValueError(f"{path.name}: its {name} tensor is not float32")
    with path.open("rb") as file:
        file.seek(offset)
        return torch.frombuffer(bytearray(file.read(size)), dtype=torch.float32)


def _gemma3(fields: dict, field, rope: dict) -> dict:
    """What a Gemma 3 config has besides a Llama one: its windows, their layers and RoPE (`rope` the others'),
    the query scale."""
    layers, window = field("block_count"), fields.get("gemma3.attention.sliding_window", 0)
    pattern = fields.get("gemma3.attention.sliding_window_pattern", GEMMA3_PATTERN)
    if isinstance(pattern, list):  # a flag per layer
        sliding = [bool(flag) for flag in pattern]
    else:
        sliding = [pattern == 0 or i % pattern < pattern - 1 for i in range(layers)]
    if not window:
        sliding = [False] * layers
    heads, hidden, head_dim = field("attention.head_count"), field("embedding_length"), field("attention.key_length")
    if fields.get("gemma3.final_logit_softcapping"):
        raise ValueError("its logits are soft-capped (final_logit_softcapping), which specchat does not compute")
    return {
        "hidden_activation": "gelu_pytorch_tanh",
        "sliding_window": window or None,
        "layer_types": ["sliding_attention" if flag else "full_attention" for flag in sliding],
        "query_pre_attn_scalar": hidden // heads if layers == GEMMA3_27B_LAYERS else head_dim,
        "rope_parameters": {"full_attention": rope, "sliding_attention": {
            "rope_type": "default", "rope_theta": fields.get("gemma3.rope.freq_base_swa", GEMMA3_LOCAL_BASE)}},
    }


def _gemma2(fields: dict, field) -> dict:
    """What a Gemma 2 config has besides a Llama one: a window on every other layer (the first's), the query scale,
    the scores' and logits' soft caps."""
    layers, window = field("block_count"), fields.get("gemma2.attention.sliding_window", 0)
    heads, hidden, head_dim = field("attention.head_count"), field("embedding_length"), field("attention.key_length")
    return {
        "hidden_activation": "gelu_pytorch_tanh",
        "sliding_window": window or None,
        "layer_types": ["sliding_attention" if window and i % 2 == 0 else "full_attention" for i in range(layers)],
        "query_pre_attn_scalar": hidden // heads if layers == GEMMA2_27B_LAYERS else head_dim,
        "attn_logit_softcapping": fields.get("gemma2.attn_logit_softcapping"),
        "final_logit_softcapping": fields.get("gemma2.final_logit_softcapping"),
    }


def _rope(path: Path, fields: dict, architecture: str, head_dim: int, context_length: int,
          factors_row: list | None) -> dict:  # fmt: skip
    rope = {"rope_type": "default", "rope_theta": fields.get(f"{architecture}.rope.freq_base", 10000.0)}
    scaling = fields.get(f"{architecture}.rope.scaling.type", "none")

    def scaling_field(name: str, default=None):
        return fields.get(f"{architecture}.rope.scaling.{name}", default)

    if scaling in ("linear", "yarn"):
        rope = {**rope, "rope_type": scaling, "factor": scaling_field("factor")}
    elif scaling != "none":
        raise ValueError(f"{path.name} asks for {scaling} RoPE scaling; specchat runs linear, YaRN and Llama 3's")
    if scaling == "yarn":  # the trained window (llama.cpp's default: the file's context length), the ramp's ends
        rope["original_max_position_embeddings"] = scaling_field("original_context_length", context_length)
        for name in ("beta_fast", "beta_slow"):
            if scaling_field(f"yarn_{name}"):
                rope[name] = scaling_field(f"yarn_{name}")
    if factors_row is None:
        return rope
    factors = _f32_tensor(path, factors_row)  # F32, as llama.cpp's converter writes it
    try:
        return rope_of_frequency_factors(rope, head_dim, factors)
    except ValueError as error:
        raise ValueError(f"{path.name}: {error}") from None
