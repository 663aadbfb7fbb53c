"""Dynamic draft trees (OPT-Tree, as SpecExtend drafts): the n nodes with the highest probability of being
accepted, grown one depth per draft forward while a depth still adds enough.

A node's value is the product of the draft's probabilities along its path: under the draft's own
distribution, the chance verification reaches it, so the expected accepted length of a tree is the sum of
its nodes' values and the best tree of n nodes is the n best nodes found (a child never beats its parent, so
they form a tree). Each depth runs one draft forward over the newest depth's nodes in that tree and adds
their best children to the candidates; growth stops at `max_depth`, or when a depth raised the expected
length by no more than `threshold`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specchat.engine.host_data import to_host
from specchat.engine.tree import ROOT, DraftTree

MAX_NODES = 50
MAX_DEPTH = 10
THRESHOLD = 0.7
CHILDREN = 8  # candidates per expanded node: the draft's top tokens there
Children = Callable[[torch.Tensor, int, int], tuple[torch.Tensor, torch.Tensor]] | None


def grow_tree(root_probs: torch.Tensor, expand: Callable[[list[int], list[int]], torch.Tensor], budget: int,
              origin: str, *, children: Children = None, max_depth: int = MAX_DEPTH,
              threshold: float = THRESHOLD) -> DraftTree:  # fmt: skip
    """The tree of at most min(budget, MAX_NODES) nodes below the root, whose draft distribution over the
    target's vocabulary is `root_probs` [vocab]. `expand(tokens, parents)` runs the draft over new nodes
    (their tokens; their parents as indices into the list of nodes expanded before, ROOT for the root) and
    returns their distributions [len(tokens), vocab]. `children(probs [n, vocab], depth, k)` gives the k
    candidates below each of n nodes whose children are at `depth`, as (values, tokens) [n, k]: by default the
    likeliest, valued at their probabilities."""
    size = min(budget, MAX_NODES)
    tokens: list[int] = []
    parents: list[int] = []  # candidate index, ROOT
    values: list[float] = []
    depths: list[int] = []
    expanded: dict[int, int] = {ROOT: ROOT}  # candidate -> index among expanded nodes

    children = children or _likeliest

    def add_children(candidates: list[int], probs: torch.Tensor, depth: int) -> None:
        """The best children of `candidates` (ROOT, or nodes at depth - 1) by their draft distributions `probs`."""
        best_values, best_tokens = children(probs.float(), depth, min(CHILDREN, size, probs.shape[-1]))
        for candidate, row_values, row_tokens in zip(candidates, *to_host(best_values, best_tokens)):
            base = 1.0 if candidate == ROOT else values[candidate]
            for p, token in ((p, token) for p, token in zip(row_values, row_tokens) if p > 0):
                tokens.append(token)
                parents.append(candidate)
                values.append(base * p)
                depths.append(depth)

    add_children([ROOT], root_probs[None], 1)
    chosen = _best(values, depths, size)
    expected = gain = sum(values[c] for c in chosen)
    for depth in range(1, max_depth):
        frontier = [c for c in chosen if depths[c] == depth]
        if gain <= threshold or not frontier:
            break
        for candidate in frontier:
            expanded[candidate] = len(expanded) - 1
        probs = expand([tokens[c] for c in frontier], [expanded[parents[c]] for c in frontier])
        add_children(frontier, probs, depth + 1)
        chosen = _best(values, depths, size)
        total = sum(values[c] for c in chosen)
        gain, expected = total - expected, total
    index = {candidate: i for i, candidate in enumerate(chosen)}
    return DraftTree([tokens[c] for c in chosen], [ROOT if parents[c] == ROOT else index[parents[c]] for c in chosen],
                     [origin] * len(chosen))  # fmt: skip


def _likeliest(probs: torch.Tensor, depth: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    return probs.topk(k, dim=-1)


def _best(values: list[float], depths: list[int], size: int) -> list[int]:
    """The `size` candidates of highest value, parents before children (ties go to the shallower node)."""
    ranked = sorted(range(len(values)), key=lambda c: (-values[c], depths[c]))[:size]
    return sorted(ranked, key=lambda c: (depths[c], -values[c]))
