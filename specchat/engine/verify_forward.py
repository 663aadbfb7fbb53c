"""One verification forward at the cache's current context, committing nothing: what calibration and the
benchmarks time.

The forward is the decode loop's own (`Engine._step`): the root and the tree's nodes as one batch from
`tree_batch`, each node at position prefix + depth, under the tree's mask (none for the root alone: a decode
step). Inputs and mask are built once, when the call is made, so timing the call times the forward alone. Each
call writes its rows' keys and values after the committed prefix and drops them again (`cache.truncate`): the
context stays as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from specchat.engine.cache import TreeCache
from specchat.engine.tree import DraftTree, tree_batch


class EngineForward(Protocol):
    """The target over `tokens` [q] at `positions` [q], written right after the cached prefix (`Engine._forward`)."""

    def __call__(self, tokens: torch.Tensor, *, positions: torch.Tensor, tree_mask: torch.Tensor | None): ...


def chain_tree(nodes: int) -> DraftTree:
    """A chain of `nodes` nodes below the root (token 0 each): the tree of a given size calibration times."""
    return DraftTree([0] * nodes, list(range(-1, nodes - 1)), ["calibration"] * nodes)


def verification_forward(
    forward: EngineForward,
    cache: TreeCache,
    device: torch.device,
    *,
    tree: DraftTree | int,
    root_token: int = 0,
) -> Callable[[], object]:
    """A call that runs `forward` over the root and `tree` (a `DraftTree`, or the size of a chain) at the cache's
    current length and returns what `forward` returns, leaving the cache as it found it. Valid while the cache
    keeps that length (the call's positions start there).

    Args:
        forward: the target's forward with the engine's signature.
        cache: the cache `forward` writes into; its committed length is the context.
    """
    if isinstance(tree, int):
        tree = chain_tree(tree)
    prefix = cache.length
    batch = tree_batch(tree, root_token, prefix, device)
    mask = batch.tree_mask if len(tree) else None

    def run() -> object:
        out = forward(batch.input_ids, positions=batch.position_ids, tree_mask=mask)
        cache.truncate(cache.length)  # drop the pending rows: nothing is committed
        return out

    return run
