"""The logits pipeline that defines the target distribution: penalty, temperature, top-k, top-p, min-p.

Speculative verification draws from exactly this distribution at every tree node, so spec decoding and
autoregressive decoding share one definition. History-dependent steps (the penalty window) take each row's
own history, which for a tree node is the committed text plus the node's ancestors.
"""

from __future__ import annotations

import torch

from specchat.engine.sampling_config import SamplingConfig


def apply_penalty(logits: torch.Tensor, history: torch.Tensor, penalty: float) -> torch.Tensor:
    """Divide positive (multiply negative) logits of tokens seen in each row's history by `penalty`.

    Args:
        logits: [n, vocab]
        history: [n, W] token ids, -1 = padding (rows may have shorter histories)
    """
    n, vocab = logits.shape
    seen = torch.zeros(n, vocab + 1, dtype=torch.bool, device=logits.device)  # column 0 absorbs padding
    seen.scatter_(1, history.to(logits.device) + 1, True)
    seen = seen[:, 1:]
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def apply_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[:, -1:]  # [n, 1]
    return logits.masked_fill(logits < kth, float("-inf"))


def apply_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches p (a token is kept while the mass
    strictly above it is still < p)."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    mass_above = probs.cumsum(dim=-1) - probs
    drop_sorted = mass_above >= p
    drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def apply_min_p(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Drop tokens whose probability is below min_p times the most likely token's."""
    if min_p <= 0:
        return logits
    probs = logits.softmax(dim=-1)
    threshold = min_p * probs.max(dim=-1, keepdim=True).values
    return logits.masked_fill(probs < threshold, float("-inf"))


def process_logits(logits: torch.Tensor, config: SamplingConfig, history: torch.Tensor | None = None) -> torch.Tensor:
    """Raw logits [n, vocab] -> the processed logits whose softmax (or argmax, when greedy) is the target."""
    logits = logits.float()
    if config.uses_history and history is not None:
        logits = apply_penalty(logits, history, config.penalty)
    if config.greedy:
        return logits
    logits = logits / config.temperature
    logits = apply_top_k(logits, config.top_k)
    logits = apply_top_p(logits, config.top_p)
    return apply_min_p(logits, config.min_p)


def sample(logits: torch.Tensor, config: SamplingConfig, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of processed logits [n, vocab] -> [n]; greedy takes the argmax.

    Sampling is an exponential race, argmax(p / E) with E ~ Exp(1): exact and free of host syncs.
    """
    if config.greedy:
        return logits.argmax(dim=-1)
    probs = logits.softmax(dim=-1)
    race = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return (probs / race).argmax(dim=-1)


def make_generator(config: SamplingConfig, device: torch.device) -> torch.Generator:
    generator = torch.Generator(device=device)
    if config.seed is None:
        generator.seed()
    else:
        generator.manual_seed(config.seed)
    return generator
