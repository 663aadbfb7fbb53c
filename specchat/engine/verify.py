"""Verification of a draft tree against the target's distributions: pure, tensors and lists in and out.

Terms, used throughout:
- the *choice* at a verified row (the root or a node) is the token the target picks there: the argmax of
  the processed logits when greedy, else one draw from the processed distribution keyed by the row's place in
  the text (`PositionNoise`) — one draw per node, never per path;
- a node is *accepted* when its parent is accepted (the root always is) and its token equals the parent's
  choice; siblings are distinct, so at most one child of a node can be accepted;
- the *bonus* is the choice at the deepest accepted row: always committed after the accepted path.
Every committed token is then a choice of the target at its own position, so greedy output equals
target-only greedy decoding and sampled output is distributed exactly as target-only sampling, whatever the
drafter proposed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specchat.engine.tree import ROOT, DraftTree


@dataclass(frozen=True)
class Verdict:
    path: list[int]  # accepted node indices, the root's child first
    bonus: int  # the target's token after the path


def verify(tree: DraftTree, choices: torch.Tensor) -> Verdict:
    """Accepted path and bonus for a tree, from its rows' choices [n + 1] (`sampling.choose`): the step's one wait
    for the device, where the tree or the choices are still there."""
    return accept(tree, tree.read_with(choices))


def accept(tree: DraftTree, choices: list[int]) -> Verdict:
    """Walk from the root along children whose token is their parent's choice (row 0 = root)."""
    children: dict[tuple[int, int], int] = {(p, t): i for i, (p, t) in enumerate(zip(tree.parents, tree.tokens))}
    path, node = [], ROOT
    while (child := children.get((node, choices[node + 1]))) is not None:
        path.append(child)
        node = child
    return Verdict(path, choices[node + 1])
