"""RoPE's inverse frequencies and attention scaling for the rope types specchat runs, computed as transformers
computes them; the rope parameters a GGUF file's `rope_freqs` tensor stands for; YaRN's stretch of a model's window.

Every forward of a target reads its frequencies from here or from the model's rotary module, which transformers
builds from the same `config.rope_parameters`: so the config is where a model's RoPE is said, for every decoder.
"""

from __future__ import annotations

import math

import torch

from specchat.errors import SpecchatError

# Llama 3.1's and 3.2's RoPE scaling, besides the factor (8 and 32): what llama.cpp's converter turns into a
# GGUF file's `rope_freqs` tensor
LLAMA3_SCALING = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def rope_parameters(config, layer_type: str = "full_attention") -> dict:
    """The config's RoPE: its type, base and scaling; where the config gives each kind of layer its own (Gemma 3's
    sliding-window layers rotate by another base), the RoPE of the `layer_type` layers."""
    rope = getattr(config, "rope_parameters", None) or {"rope_type": "default", "rope_theta": config.rope_theta}
    return rope[layer_type] if layer_type in rope else rope


def rotary_dims(config) -> int:
    """How many of a head's dims RoPE rotates (the first ones; Phi-4-mini rotates 3/4 of them)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return int(head_dim * rope_parameters(config).get("partial_rotary_factor", 1.0))


def uses_long_factors(rope: dict, capacity: int) -> bool:
    """Whether LongRoPE takes its long factors for a cache of `capacity` positions: past the trained window, as
    llama.cpp chooses by its context size (transformers by each forward's length, which would rotate one
    position two ways)."""
    return rope.get("rope_type") == "longrope" and capacity > rope["original_max_position_embeddings"]


def per_layer_type(config) -> bool:
    """Whether the config's RoPE is given per kind of layer."""
    return "full_attention" in (getattr(config, "rope_parameters", None) or {})


def inverse_frequencies(rope: dict, head_dim: int, *, long: bool = False) -> torch.Tensor:
    """RoPE's inverse frequencies `[head_dim / 2]` (fp32; `head_dim` the rotated dims, `rotary_dims`) for rope
    types default, linear, llama3 (Llama 3.1), yarn and longrope (Phi-3's: each pair's frequency divided by its
    short factor, or with `long` its long one)."""
    kind = rope.get("rope_type", "default")
    base = rope["rope_theta"]
    if kind == "longrope":
        factors = torch.tensor(rope["long_factor" if long else "short_factor"], dtype=torch.float32)
        return 1.0 / (factors * base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
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
    if kind == "yarn":
        return _yarn_frequencies(rope, head_dim)
    raise SpecchatError(f"specchat has no '{kind}' RoPE scaling (default, linear, llama3, yarn, longrope)")


def attention_scaling(rope: dict, max_positions: int | None = None) -> float:
    """What RoPE's cos and sin are multiplied by: YaRN's temperature (`0.1 ln(factor) + 1` unless the config says
    otherwise), which keeps attention's entropy where training left it over the stretched window; LongRoPE's
    (the config's `attention_factor`, else `sqrt(1 + ln f / ln n)` for a window f times its trained n, as
    transformers computes it from `max_positions`); else 1."""
    if rope.get("rope_type", "default") == "longrope":
        if rope.get("attention_factor") is not None:
            return float(rope["attention_factor"])
        trained = rope["original_max_position_embeddings"]
        factor = rope.get("factor") or (max_positions or trained) / trained
        return math.sqrt(1 + math.log(factor) / math.log(trained)) if factor > 1 else 1.0
    if rope.get("rope_type", "default") != "yarn":
        return 1.0
    if rope.get("attention_factor") is not None:
        return float(rope["attention_factor"])
    factor, mscale, mscale_all_dim = rope["factor"], rope.get("mscale"), rope.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
    return _yarn_mscale(factor)


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn_frequencies(rope: dict, head_dim: int) -> torch.Tensor:
    """YaRN: the fast-turning pairs (more than `beta_fast` turns over the trained window) keep their frequency, the
    slow ones (under `beta_slow` turns) are divided by the factor, those between blend along a linear ramp."""
    factor, base, window = rope["factor"], rope["rope_theta"], rope["original_max_position_embeddings"]

    def pair_of(turns: float) -> float:  # the rotary pair that turns `turns` times over the trained window
        return head_dim * math.log(window / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = pair_of(rope.get("beta_fast") or 32), pair_of(rope.get("beta_slow") or 1)
    if rope.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / ((high - low) or 0.001)).clamp(0, 1)
    kept = 1 - ramp  # the share of each pair's own frequency
    divisors = base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)  # 1 / plain RoPE's
    return 1.0 / (factor * divisors) * (1 - kept) + 1.0 / divisors * kept


def stretch_with_yarn(config, factor: float | None) -> None:
    """Stretch `config`'s window `factor` times with YaRN (static, as Qwen2.5's model cards, vLLM and llama.cpp's
    `--rope-scaling yarn` run it: every position is scaled, short texts' too); None leaves it as it is. `config`:
    transformers' or specchat's, before the model is built from it. A model whose RoPE is scaled already is a
    SpecchatError."""
    if factor is None:
        return
    if per_layer_type(config):
        raise SpecchatError("--yarn stretches one RoPE; this model rotates its kinds of layers by their own")
    rope = rope_parameters(config)
    kind = rope.get("rope_type", "default")
    if kind != "default":
        raise SpecchatError(f"--yarn stretches plain RoPE; this model's is scaled already ({kind})")
    if not factor > 1:
        raise SpecchatError(f"--yarn must be above 1 (the window's multiple), not {factor:g}")
    window = config.max_position_embeddings
    config.rope_parameters = {**rope, "rope_type": "yarn", "factor": float(factor),
                              "original_max_position_embeddings": window}  # fmt: skip
    config.max_position_embeddings = int(window * factor)


def rope_of_frequency_factors(rope: dict, head_dim: int, factors: torch.Tensor) -> dict:
    """`rope` scaled as a GGUF file's `rope_freqs` says: llama.cpp divides each rotary pair's frequency by its
    factor, and its converter writes the factors only for Llama 3's scaling. So these are Llama 3's parameters with
    the file's largest factor, checked against every factor (a ValueError if they are not Llama 3's)."""
    scaled = {**rope, "rope_type": "llama3", "factor": float(factors.max()), **LLAMA3_SCALING}
    base, llama3 = inverse_frequencies(rope, head_dim), inverse_frequencies(scaled, head_dim)
    if factors.shape != base.shape or not torch.allclose(llama3, base / factors, rtol=1e-5):
        raise ValueError(f"its rope_freqs tensor ({factors.numel()} factors) is not Llama 3's RoPE scaling, the one "
                         "specchat reads from a GGUF file")  # fmt: skip
    return scaled
