"""Draft trees and the verification inputs built from them.

A tree hangs below the root, the last committed token (not yet in the KV cache). Nodes are stored parents
first, so `parents[i] < i`; -1 is the root. Siblings always carry distinct tokens, which makes "the child
whose token equals the target's choice" unique during verification.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from specchat.engine.host_data import to_device

ROOT = -1


class Unread(NamedTuple):
    """A queued tree's tensors, on the device until read."""

    tokens: torch.Tensor  # [n] long
    parents: torch.Tensor  # [n] long
    depth: int  # a bound on the tree's depth
    scores: torch.Tensor | None  # [n]
    kinds: torch.Tensor | None  # [n] long: each node's index into `names`
    names: tuple[str, ...]  # the origins the tree's nodes may have


class Ranked(NamedTuple):
    """A tree's nodes on the device, best first (`best_first`)."""

    tokens: torch.Tensor  # [n] long
    parents: torch.Tensor  # [n] long: places in this list, ROOT below the root
    scores: torch.Tensor  # [n]
    kinds: torch.Tensor | None  # [n] long: each node's index into the origins its tree names

    def copy(self) -> Ranked:
        """These nodes in tensors of their own (a graph's outputs are overwritten by its next replay)."""
        return Ranked(*(None if part is None else part.clone() for part in self))

    def tree(self, origin: str | tuple[str, ...], depth: int) -> DraftTree:
        """The queued tree of these nodes, whose depth is at most `depth`."""
        return DraftTree.queued(self.tokens, self.parents, origin, depth=depth, scores=self.scores, kinds=self.kinds)


def best_first(tokens: torch.Tensor, parents: torch.Tensor, scores: torch.Tensor, depths: torch.Tensor, size: int, *,
               kinds: torch.Tensor | None = None, kept: torch.Tensor | None = None) -> Ranked:  # fmt: skip
    """The `size` best of candidates, their tokens, parents' places (ROOT: the root), scores and depths [c] (`kept`
    [c]: those that may be nodes; default all), all on the device; ranked as `DraftTree.best` ranks paths (by score,
    then depth, then place), best first: a parent outranks its children, so it precedes them, and the first n nodes
    are the n best. Tensor ops alone: nothing is read, nor copied from the host."""
    order = torch.sort(depths, stable=True).indices
    ranked = -scores if kept is None else torch.where(kept, -scores, torch.inf)
    order = order[torch.sort(ranked[order], stable=True).indices][:size]
    place = torch.full_like(parents, ROOT)
    place[order] = torch.arange(size, device=tokens.device)
    chosen = parents[order]
    return Ranked(tokens[order], torch.where(chosen < 0, ROOT, place[chosen.clamp(min=0)]), scores[order],
                  None if kinds is None else kinds[order])  # fmt: skip


class DraftTree:
    """A tree's nodes, on the host or still on the device where a drafter built it (`queued`).

    A queued tree is read to the host once: with the target's choices at verification (`read_with`), or where a
    caller first needs its lists. Until then its verification batch is built on the device (`tree_batch`), so a
    step whose drafter queued its tree waits for the device once, at the acceptance.
    """

    def __init__(self, tokens: list[int], parents: list[int], origins: list[str],
                 leaders: frozenset[str] | None = None, scores: list[float] | None = None):  # fmt: skip
        self._origins = list(origins)  # [n] the drafter kind that proposed each node
        # The origins that drafted with the whole budget and were kept whole (None: every origin). A composite's
        # other part drafts in what is left, so its tree says how deep its trees of that budget reach only when it led.
        self.leaders = leaders
        # [n] the drafter's estimate of each node's chance to be accepted (its path's), never above its parent's;
        # None where the drafter has none. Such trees are merged and sized by them (`best`, `cut`).
        self._scores = scores
        self._queued: Unread | None = None
        self._settle(list(tokens), list(parents))

    @classmethod
    def queued(cls, tokens: torch.Tensor, parents: torch.Tensor, origin: str | tuple[str, ...], *,
               depth: int | None = None, scores: torch.Tensor | None = None,
               kinds: torch.Tensor | None = None) -> DraftTree:  # fmt: skip
        """A tree whose tokens [n] and parents [n] (long) are still on the device, unread; `depth`: a bound on its
        depth the drafter knows (else n); `scores` [n]: its nodes' scores, on the device too, listed best first
        (`best_first`: its first nodes are its best, `first`). Every node has the `origin`, or where that names
        several, the one `kinds` [n] (long, on the device) picks."""
        n = tokens.shape[0]
        tree = cls([], [], [origin] * n if isinstance(origin, str) else [None] * n)
        names = (origin,) if isinstance(origin, str) else origin
        tree._queued = Unread(tokens, parents, n if depth is None else depth, scores, kinds, names)
        return tree

    @property
    def unread(self) -> Unread | None:
        """A queued tree's tensors, still on the device; None once read."""
        return self._queued

    @property
    def queued_scores(self) -> torch.Tensor | None:
        """A queued scored tree's scores [n], still on the device; None once read, or where it has none."""
        return None if self._queued is None else self._queued.scores

    def first(self, n: int) -> DraftTree:
        """A queued scored tree's first n nodes, still on the device: its n best, a tree since a parent outranks
        its children."""
        unread = self._queued
        if unread is None or unread.scores is None:
            raise ValueError("only a queued scored tree lists its nodes best first")
        return DraftTree.queued(unread.tokens[:n], unread.parents[:n],
                                unread.names[0] if unread.kinds is None else unread.names,
                                depth=min(unread.depth, n), scores=unread.scores[:n],
                                kinds=None if unread.kinds is None else unread.kinds[:n])  # fmt: skip

    def _settle(self, tokens: list[int], parents: list[int]) -> None:
        depths = []
        for i, parent in enumerate(parents):
            if not ROOT <= parent < i:
                raise ValueError(f"node {i} has parent {parent}: parents must precede children")
            depths.append(1 if parent == ROOT else depths[parent] + 1)
        self._tokens, self._parents, self._depths = tokens, parents, depths  # [n] each, depth 1 below the root
        self._queued = None

    def read_with(self, values: torch.Tensor) -> list[int]:
        """`values` (ints) as a list, read in the same wait for the device as a queued tree's nodes."""
        unread = self._queued
        if unread is None:
            return values.tolist()
        n = unread.tokens.shape[0]
        kinds = () if unread.kinds is None else (unread.kinds,)
        read = torch.cat([unread.tokens, unread.parents, *kinds, values.to(unread.tokens.dtype)]).tolist()
        if unread.kinds is not None:
            self._origins = [unread.names[kind] for kind in read[2 * n : 3 * n]]
        if unread.scores is not None:
            self._scores = unread.scores.tolist()  # the queue is empty by now: no second wait
        self._settle(read[:n], read[n : 2 * n])
        return read[(2 + len(kinds)) * n :]

    def rows(self, root_token: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The verified rows' tokens [n + 1] (the root's first) and the nodes' parents [n] on `device` (a queued
        tree's own, else copied without waiting), and a bound on the tree's depth."""
        if self._queued is not None:
            tokens, parents, depth = self._queued[:3]
            return torch.cat([to_device([root_token], device, torch.long), tokens]), parents, depth
        ids = to_device([root_token, *self._tokens], device, torch.long)
        return ids, to_device(self._parents, device, torch.long), self.depth

    def _read(self) -> None:
        if self._queued is not None:
            self.read_with(self._queued.tokens[:0])

    @property
    def origins(self) -> list[str]:  # [n] the drafter kind that proposed each node
        if self._queued is not None and self._queued.kinds is not None:
            self._read()
        return self._origins

    @property
    def scores(self) -> list[float] | None:
        if self._queued is not None and self._queued.scores is not None:
            self._read()
        return self._scores

    @property
    def tokens(self) -> list[int]:  # [n] proposed token ids
        self._read()
        return self._tokens

    @property
    def parents(self) -> list[int]:  # [n] parent node index, ROOT for children of the root
        self._read()
        return self._parents

    @property
    def depths(self) -> list[int]:  # [n] 1 for children of the root
        self._read()
        return self._depths

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DraftTree):
            return NotImplemented
        fields = (self.tokens, self.parents, self.origins, self.leaders, self.scores)
        return fields == (other.tokens, other.parents, other.origins, other.leaders, other.scores)

    def __repr__(self) -> str:
        return f"DraftTree(tokens={self.tokens}, parents={self.parents}, origins={self.origins})"

    def __len__(self) -> int:
        return len(self._origins)

    @property
    def depth(self) -> int:
        return max(self.depths, default=0)

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's child down to `node` (empty for the root itself)."""
        path = []
        while node != ROOT:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    @classmethod
    def empty(cls) -> DraftTree:
        return cls([], [], [])

    @classmethod
    def best(cls, paths: dict[tuple[int, ...], tuple[float, str]], budget: int) -> DraftTree:
        """The `budget` most likely of `paths` (token paths below the root -> their chance and origin; one below a
        path not given is left out), as a tree that keeps their scores, `siblings_bounded`, listed best first as
        `best_first` lists them (by score, then depth, then the order `paths` gives them): a parent outranks its
        children, so it precedes them, and the first n nodes are the n best."""
        place = {path: i for i, path in enumerate(paths)}
        bounded = siblings_bounded(paths)
        chosen = sorted(bounded, key=lambda path: (-bounded[path][0], len(path), place[path]))[: max(budget, 0)]
        builder = TreeBuilder()
        nodes: dict[tuple[int, ...], int] = {}
        for path in chosen:
            nodes[path] = builder.add(nodes[path[:-1]] if path[:-1] else ROOT, path[-1], bounded[path][1])
        return builder.build([bounded[path][0] for path in chosen])

    def paths(self) -> dict[tuple[int, ...], tuple[float, str]]:
        """Each node's token path below the root -> its score and origin: what `best` builds a tree from."""
        keys: list[tuple[int, ...]] = []
        for parent, token in zip(self.parents, self.tokens):
            keys.append((keys[parent] if parent != ROOT else ()) + (token,))
        return {key: (score, origin) for key, score, origin in zip(keys, self.scores or [], self.origins)}

    def cut(self, n: int) -> DraftTree:
        """The tree of its n most likely nodes (a scored tree)."""
        return self if n >= len(self) else DraftTree.best(self.paths(), n)

    @classmethod
    def from_chains(cls, chains: list[list[int]], origin: str, budget: int) -> DraftTree:
        """Merge token chains under the root into a trie of at most `budget` nodes (shared prefixes once)."""
        builder = TreeBuilder()
        for chain in chains:
            builder.add_chain(chain, origin, budget=budget)
            if len(builder) >= budget:
                break
        return builder.build()


class TreeBuilder:
    """Adds nodes while keeping siblings distinct: adding an existing (parent, token) returns that node."""

    def __init__(self):
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.origins: list[str] = []
        self._children: dict[tuple[int, int], int] = {}

    def __len__(self) -> int:
        return len(self.origins)

    def add(self, parent: int, token: int, origin: str) -> int:
        key = (parent, token)
        if key not in self._children:
            self._children[key] = len(self.tokens)
            self.tokens.append(token)
            self.parents.append(parent)
            self.origins.append(origin)
        return self._children[key]

    def add_chain(self, chain: list[int], origin: str, *, parent: int = ROOT, budget: int) -> None:
        for token in chain:
            if (parent, token) not in self._children and len(self) >= budget:
                return
            parent = self.add(parent, token, origin)

    def build(self, scores: list[float] | None = None) -> DraftTree:
        return DraftTree(self.tokens, self.parents, self.origins, scores=scores)


def siblings_bounded(paths: dict[tuple[int, ...], tuple[float, str]]) -> dict[tuple[int, ...], tuple[float, str]]:
    """`paths` with each node's children's chances, given it, scaled to sum to at most 1: siblings are
    alternatives, so at most one is right, whatever each source guessed (four earlier continuations of a
    one-token match scored 0.21 each; the heads' and the lookup's best guesses for one position)."""
    children: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    for path in paths:
        children.setdefault(path[:-1], []).append(path)
    bounded = {}
    for parent in sorted(children, key=len):  # each parent's own chance is settled before its children's
        if parent and parent not in bounded:
            continue  # below a path not given
        given = paths[parent][0] if parent else 1.0
        chance = bounded[parent][0] if parent else 1.0
        total = max(1.0, sum(paths[child][0] for child in children[parent]) / given) if given > 0 else 1.0
        for child in children[parent]:
            conditional = paths[child][0] / given / total if given > 0 else 0.0
            bounded[child] = (chance * conditional, paths[child][1])
    return bounded


@dataclass(frozen=True)
class TreeBatch:
    """One verification forward: the root followed by the tree's nodes (row 0 = root, row i + 1 = node i)."""

    input_ids: torch.Tensor  # [n + 1] long
    position_ids: torch.Tensor  # [n + 1] long, prefix_len + depth
    tree_mask: torch.Tensor  # [n + 1, n + 1] bool, True where row may attend column (ancestors and itself)


def tree_batch(tree: DraftTree, root_token: int, prefix_len: int, device: torch.device) -> TreeBatch:
    """The batch built on the device from the tree's parents (`ancestry`), a queued tree's unread."""
    ids, parents, depth = tree.rows(root_token, device)
    mask = ancestry(parents, depth)
    return TreeBatch(ids, mask.sum(dim=1).add_(prefix_len - 1), mask)


def ancestry(parents: torch.Tensor, depth: int) -> torch.Tensor:
    """[n + 1, n + 1] bool: which rows each row sees (the root is row 0, node i row i + 1), its ancestors and
    itself, for a tree at most `depth` deep. The closure of the parent relation by squaring, ceil(log2 depth) small
    matmuls, so nothing waits on the parents' values; each row's count is its depth + 1."""
    rows = parents.shape[0] + 1
    reach = torch.eye(rows, device=parents.device)
    reach[1:].scatter_(1, parents[:, None] + 1, 1.0)  # a row and its parent's
    for _ in range(math.ceil(math.log2(depth)) if depth > 1 else 0):  # paths up to 2, 4, ... edges long
        reach = (reach @ reach).clamp_(max=1.0)
    return reach > 0


def node_histories(tree: DraftTree, committed: list[int] | torch.Tensor, window: int) -> torch.Tensor:
    """[n + 1, window] token ids each verified row has seen (-1 pads short rows): the last `window` of the
    committed ids (root included) followed by the row's own ancestors and itself.

    Built with tensor ops from the committed tail and the nodes' paths (at most the tree's depth each), so a
    40-node tree under a 1024-token window costs a few small copies, not 40 Python lists of 1024 ids.
    """
    committed = torch.as_tensor(committed, dtype=torch.long)[-window:]
    paths = [[]]
    for token, parent in zip(tree.tokens, tree.parents):
        paths.append(paths[parent + 1] + [token])
    depth = max(len(path) for path in paths)
    own = torch.tensor([path + [-1] * (depth - len(path)) for path in paths],
                       dtype=torch.long).reshape(len(paths), depth)
    rows = torch.cat([committed.expand(len(paths), -1), own], dim=1)  # [n + 1, m + depth]
    lengths = torch.tensor([len(path) for path in paths]) + len(committed)
    drop = (lengths - window).clamp(min=0)  # the oldest committed ids a deep row no longer sees
    kept = lengths - drop
    columns = torch.arange(min(window, len(committed) + depth))  # the longest row kept
    shifted = rows.gather(1, (columns + drop[:, None]).clamp(max=rows.shape[1] - 1))
    return torch.where(columns < kept[:, None], shifted, -1)
