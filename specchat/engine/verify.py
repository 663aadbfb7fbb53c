"""Verification of a draft tree against the target's distributions: pure, tensors and lists in and out.

Terms, used throughout:
- the *choice* at a verified row (the root or a node) is the token the target picks there: the argmax of
  the processed logits when greedy, else one draw from the processed distribution — one draw per node,
  never per path;
- a node is *accepted* when its parent is accepted (the root always is) and its token equals the parent's
  choice; siblings are distinct, so at most one child of a node can be accepted;
- the *bonus* is the choice at the deepest accepted row: always committed after the accepted path.
Every committed token is then a choice of the target at its own position, so greedy output equals
target-only greedy decoding and sampled output is distributed exactly as target-only sampling, whatever the
drafter proposed.

When a drafter *sampled* a node's children from its own distributions (the tree carries `draft_probs`),
`accept_sampled` tries them by recursive rejection sampling instead, which accepts more: child i, drawn
from q_i, is accepted with probability min(1, r(x_i) / q_i(x_i)); on rejection r <- norm(max(r - q_i, 0));
if every child is rejected the bonus is drawn from the final r (r starts as the target's p). With
siblings drawn without replacement (q_{i+1} = q_i without x_i, renormalised) this is still exact
(SpecInfer's multi-round rejection, Sequoia's without-replacement form).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specchat.engine.sampling import Processed, SamplingConfig, sample
from specchat.engine.tree import ROOT, DraftTree


@dataclass(frozen=True)
class Verdict:
    path: list[int]  # accepted node indices, the root's child first
    bonus: int  # the target's token after the path


def verify(tree: DraftTree, processed: Processed, sampling: SamplingConfig, generator,
           choices: torch.Tensor | None = None) -> Verdict:  # fmt: skip
    """Accepted path and bonus for a tree, from the processed target logits of its rows [n + 1, vocab].

    `choices` are the rows' choices when the caller drew them (`PositionNoise`: keyed draws); sampled trees
    are then verified by those draws too, so the output is the same whatever the tree."""
    if choices is not None:
        return accept(tree, tree.read_with(choices))
    if sampling.greedy or tree.draft_probs is None:  # a queued tree comes to the host with the choices
        return accept(tree, tree.read_with(sample(processed, sampling, generator)))
    return accept_sampled(tree, processed.logits.softmax(dim=-1), generator)


def accept(tree: DraftTree, choices: list[int]) -> Verdict:
    """Walk from the root along children whose token is their parent's choice (row 0 = root)."""
    children: dict[tuple[int, int], int] = {(p, t): i for i, (p, t) in enumerate(zip(tree.parents, tree.tokens))}
    path, node = [], ROOT
    while (child := children.get((node, choices[node + 1]))) is not None:
        path.append(child)
        node = child
    return Verdict(path, choices[node + 1])


def accept_sampled(tree: DraftTree, probs: torch.Tensor, generator) -> Verdict:
    """Walk down with recursive rejection sampling wherever all children were sampled by the drafter
    (their `draft_probs` rows are distributions), with one target draw per node elsewhere.

    Args:
        probs: [n + 1, vocab] target distributions, row 0 = root, row i + 1 = node i.
    """
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(tree.parents):
        children.setdefault(parent, []).append(i)
    sampled = tree.draft_probs.sum(dim=-1) > 0  # [n] rows of deterministic nodes are all zero
    path, node = [], ROOT
    while True:
        residual = probs[node + 1]
        kids = children.get(node, [])
        if not kids or not all(sampled[kid] for kid in kids):
            token = _draw(residual, generator)
            child = next((kid for kid in kids if tree.tokens[kid] == token), None)
            if child is None:
                return Verdict(path, token)
        else:
            child = None
            for kid in kids:
                q, token = tree.draft_probs[kid], tree.tokens[kid]
                if torch.rand((), generator=generator, device=q.device) * q[token] < residual[token]:
                    child = kid
                    break
                residual = (residual - q).clamp_(min=0)
                total = residual.sum()
                if total <= 0:  # r equalled q up to rounding: the rejection had probability ~0
                    child = kid
                    break
                residual = residual / total
            if child is None:
                return Verdict(path, _draw(residual, generator))
        path.append(child)
        node = child


def _draw(probs: torch.Tensor, generator) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))
