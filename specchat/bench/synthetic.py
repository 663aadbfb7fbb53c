"""What the synthetic benchmarks (`bench attention`, `bench verify-cost`) share: their option checks, random
draft trees, the warm-up count and figures rounded to significant digits. Inputs are random: the timings do
not depend on the values."""

from __future__ import annotations

import random

import torch

from specchat.engine.tree import DraftTree, TreeBuilder
from specchat.errors import SpecchatError

MAX_TREE = 256
WARMUP = 2  # calls before timing: Triton JIT and torch.compile run on the first


def random_tree(nodes: int, *, seed: int = 0, vocab: int = 32000) -> DraftTree:
    """A tree of `nodes` nodes, each hanging below the root or a uniformly chosen earlier node."""
    rng = random.Random(seed)
    builder = TreeBuilder()
    while len(builder) < nodes:  # a repeated (parent, token) adds nothing: draw again
        builder.add(rng.randrange(-1, len(builder)), rng.randrange(vocab), "random")
    return builder.build()


def torch_dtype(name: str) -> torch.dtype:
    """`--dtype` float32 | bfloat16 | float16 (no auto: these benches build their own random inputs)."""
    from specchat.loading import DTYPES

    if name not in DTYPES:
        raise SpecchatError(f"invalid dtype '{name}'; use {', '.join(DTYPES)}")
    return DTYPES[name]


def torch_device(name: str) -> torch.device:
    """`--device` auto | cpu | cuda | cuda:N, checked."""
    from specchat.loading import resolve_device

    return resolve_device(name)


def check_contexts(contexts: list[int]) -> None:
    if not contexts:
        raise SpecchatError("--context needs at least one length")
    if min(contexts) < 1:
        raise SpecchatError(f"each --context must be at least 1, not {min(contexts)}")


def check_range(flag: str, value: int, low: int, high: int | None = None) -> None:
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise SpecchatError(f"{flag} must be {bound}, not {value}")


def significant(value: float, digits: int = 4) -> float:
    """`value` rounded to `digits` significant digits (tiny CPU rates must not round to 0)."""
    return float(f"{value:.{digits}g}")
