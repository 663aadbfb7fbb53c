"""RoPE's inverse frequencies for the rope types specchat runs, computed as transformers computes them, and the
rope parameters a GGUF file's `rope_freqs` tensor stands for.

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


def rope_parameters(config) -> dict:
    """The config's RoPE: its type, base and scaling."""
    return getattr(config, "rope_parameters", None) or {"rope_type": "default", "rope_theta": config.rope_theta}


def inverse_frequencies(rope: dict, head_dim: int) -> torch.Tensor:
    """RoPE's inverse frequencies `[head_dim / 2]` (fp32) for rope types default, linear and llama3 (Llama 3.1)."""
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
    raise SpecchatError(f"specchat has no '{kind}' RoPE scaling (default, linear, llama3)")


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
