"""Constrained decoding: the target's distribution restricted to the tokens a syntax allows next.

A constraint masks the logits before the sampling pipeline (`sampling.process_logits`), so the constrained
target is one distribution, and verification holds a tree to it exactly as it holds one to the plain target:
each row is masked in the state its own path leads to (the committed text, then the node's ancestors). A node
whose token the syntax refuses is never accepted (its probability is zero); its row and its descendants' rows
are left as they are, since no path reaches them.

Where a syntax leaves no choice about what comes next (a tool call's structure), the engine verifies that text as
a chain instead of the drafter's tree (`forced`), as it verifies text it knows: the target still chooses every
token, so the output is unchanged, only reached in fewer steps.
"""

from __future__ import annotations

from typing import Protocol

import torch

from specchat.engine.host_data import to_device
from specchat.engine.tree import DraftTree


class Constraint(Protocol):
    """A syntax over token ids: a state per text, the ids allowed next in a state, the state after an id."""

    start: object  # the state of an empty text

    def allowed(self, state) -> torch.Tensor:
        """[vocab] bool: the ids that may come next."""
        ...

    def advance(self, state, token: int):
        """The state after `token`, or None where it may not come."""
        ...

    def forced(self, state) -> list[int]:
        """The ids the syntax leaves no choice about from `state`, as the tokenizer spells them (may be none)."""
        ...


class ConstrainedText:
    """A text being generated under `constraint`: its state after the committed tokens."""

    def __init__(self, constraint: Constraint):
        self.constraint = constraint
        self.state = constraint.start

    def mask(self, logits: torch.Tensor, tree: DraftTree) -> torch.Tensor:
        """`logits` [rows, vocab] (the root's row, then the tree's nodes') with the refused ids at -inf."""
        states = [self.state]
        for parent, token in zip(tree.parents, tree.tokens):
            before = states[parent + 1]  # the root's state for ROOT
            states.append(None if before is None else self.constraint.advance(before, token))
        rows = [row for row, state in enumerate(states[: logits.shape[0]]) if state is not None]
        if not rows:
            return logits
        # every row's mask built on the host, then one copy to the device that the host does not wait for
        refused = to_device(~torch.stack([self.constraint.allowed(states[row]) for row in rows]), logits.device)
        index = to_device(rows, logits.device)
        masked = logits.clone()
        masked[index] = masked[index].masked_fill(refused, float("-inf"))
        return masked

    def forced(self) -> list[int]:
        return self.constraint.forced(self.state)

    def commit(self, tokens: list[int]) -> None:
        for token in tokens:
            self.state = self.constraint.advance(self.state, token)
