"""Two drafters as one (`--drafter longspec+ngram`): the first one's tree, with the second one's nodes merged in.

A model drafter predicts free text well and n-gram lookup predicts copies well; verifying one merged tree
gets both in one target forward. The first drafter's tree keeps its shape; each node of the second's tree
then joins under the merged node of its parent, unless that parent already has a child with its token
(siblings stay distinct): a token proposed by both keeps the first drafter's origin.
"""

from __future__ import annotations

import torch

from specchat.drafters.mode_choice import BOTH, ModeChoice
from specchat.engine.drafter import Drafter
from specchat.engine.events import COPY
from specchat.engine.host_data import to_device
from specchat.engine.keyed_draws import PositionNoise
from specchat.engine.sampling_config import SamplingConfig
from specchat.engine.tree import ROOT, DraftTree, best_first
from specchat.errors import SpecchatError


class CompositeDrafter:
    """Drafts with `first` and `second` at once; both follow every prefill and commit.

    Budget: the second drafter (the cheap one: n-gram lookup) always proposes within the whole budget. Of parts
    without scores (scored ones merge by them: `propose`), the part whose own tree has matched more of what the
    target then committed leads: its tree is kept whole and the other's nodes fill what is left. Matched tokens, not
    top guesses: a copy the lookup found is often several tokens right where a model's guesses stop at one or two,
    and a top guess counts both alike. The first drafter proposes when it leads or something is left, and when
    drafting with both parts has committed more tokens per second than the second alone (`ModeChoice`): a copy the
    lookup found costs no draft forward and is mostly right, and a long one fills the budget by itself, so a model
    part that always drafts first only slows copy-heavy text; where the lookup's matches are mostly wrong (chat
    answers), the model part's guesses lead. The mode is chosen before the engine sizes the budget (`next_kinds`),
    so each tree is sized for the parts that draft it.
    """

    def __init__(self, first: Drafter, second: Drafter):
        read = {part.feature_layers for part in (first, second) if part.feature_layers is not None}
        if len(read) > 1:  # one forward hands over one kind of state
            raise SpecchatError(
                f"{first.kind} and {second.kind} read different target states: they cannot draft together"
            )
        self.first = first
        self.second = second
        self.feature_layers = read.pop() if read else None
        self.kind = f"{first.kind}+{second.kind}"  # its nodes carry the parts' kinds
        self.modes = ModeChoice()
        self.runs = MatchedRuns()
        self._second_tree: DraftTree | None = None  # the second's tree of the step in flight

    def prefill(self, ids: list[int], hidden: torch.Tensor, reused: int) -> None:
        self.first.prefill(ids, hidden, reused)
        self.second.prefill(ids, hidden, reused)
        self.modes.restart()
        self.runs.restart()
        self._second_tree = None

    def commit(self, tokens: list[int], hidden: torch.Tensor) -> None:
        self.first.commit(tokens, hidden)
        self.second.commit(tokens, hidden)
        second_alone = None  # what the second's tree alone would have committed: its matched run and the next
        if self._second_tree is not None:
            second_alone = min(matched_run(self._second_tree, tokens) + 1, len(tokens))
            self._second_tree = None
        self.modes.committed(len(tokens), second_alone)
        self.runs.committed(tokens)

    def next_kinds(self) -> frozenset[str]:
        second = self.second.next_kinds()
        return self.first.next_kinds() | second if self.modes.mode == BOTH else second

    @property
    def scores_nodes(self) -> bool:
        return self.first.scores_nodes and self.second.scores_nodes

    def propose(self, budget: int, sampling: SamplingConfig, least_chance: float = 0.0,
                noise: PositionNoise | None = None) -> DraftTree:  # fmt: skip
        """Parts whose nodes carry scores: the `budget` most likely nodes of both trees, except where the lookup
        found a copy, which drafts alone (82-97% of its tokens right, more than the heads' best guess: merged, a
        sure guess of theirs halved the copy's chances, and summaries ran below the lookup alone). Otherwise the
        leading part's tree whole, and the other part's nodes in the room it left. Where the lookup found nothing,
        the first part's tree is the tree, unread; a scored tree left on the device is merged there
        (`merged_on_device`): a GPU's proposal waits for neither."""
        second = self.second.propose(budget, sampling, least_chance, noise)
        first_leads = not self.scores_nodes and self.runs.first_leads()  # scored trees merge by their scores
        room = budget if first_leads or self.scores_nodes else budget - len(second)
        copying = self.scores_nodes and len(second) > 0 and set(second.origins) == {COPY}
        both = room > 0 and self.modes.mode == BOTH and not copying
        first = self.first.propose(room, sampling, least_chance, noise) if both else DraftTree.empty()
        if not self.scores_nodes:  # a scored first tree may be on the device: matching it at the commit would wait
            self.runs.proposed(first, second)
        self._second_tree = second
        leader = self.first if first_leads and len(first) else self.second
        leaders = None if self.scores_nodes else leader.next_kinds()
        if not len(second):  # nothing to merge: the first's tree as it is, left on the device where it drafts there
            first.leaders = leaders
            return first
        if self.scores_nodes and first.queued_scores is not None:  # left on the device: merged there
            return merged_on_device(first, second, budget)
        if self.scores_nodes:
            return DraftTree.best({**second.paths(), **_higher(first.paths(), second.paths())}, budget)
        return merge_trees(first, second, budget, leaders=leaders)


class MatchedRuns:
    """How many tokens each part's own tree matched of what the target committed next (its longest path from the
    root along the committed tokens), averaged with decay (a part that proposed nothing on a step is not
    counted on it). Kept for parts whose nodes carry no scores, which merge by which part leads."""

    def __init__(self, decay: float = 0.95):
        self.decay = decay
        self.matched = [0.0, 0.0]  # decayed sums: first, second
        self.counted = [0.0, 0.0]
        self.restart()

    def restart(self) -> None:
        """A new request: no step is in flight."""
        self._pending: list[DraftTree | None] = [None, None]  # the parts' trees of the step in flight

    def proposed(self, *trees: DraftTree) -> None:
        self._pending = [tree if len(tree) else None for tree in trees]

    def committed(self, tokens: list[int]) -> None:
        for part, tree in enumerate(self._pending):
            if tree is not None:
                self.matched[part] = self.matched[part] * self.decay + matched_run(tree, tokens)
                self.counted[part] = self.counted[part] * self.decay + 1
        self.restart()

    def rate(self, part: int) -> float:
        return (self.matched[part] + 1) / (self.counted[part] + 2)  # one token matched in two steps to start with

    def first_leads(self) -> bool:
        return self.rate(0) > self.rate(1)


def matched_run(tree: DraftTree, tokens: list[int]) -> int:
    """How many of `tokens` the path from the root of `tree` along them covers."""
    child = {(parent, token): node for node, (parent, token) in enumerate(zip(tree.parents, tree.tokens))}
    node = ROOT
    for depth, token in enumerate(tokens):
        node = child.get((node, token))
        if node is None:
            return depth
    return len(tokens)


def _higher(paths: dict, others: dict) -> dict:
    """The `paths` that `others` do not hold at a score as high (a token both proposed keeps the higher)."""
    return {path: value for path, value in paths.items() if value[0] > others.get(path, (-1.0,))[0]}


def merged_on_device(first: DraftTree, second: DraftTree, budget: int) -> DraftTree:
    """The tree `DraftTree.best` makes of both trees' paths (a path both hold kept at the higher score, the second's
    on a tie), for a scored `first` tree left on the device and a `second` on the host: matched, bounded and ranked
    by tensor ops, and left on the device too (no wait in the proposal). Its size needs no read: the budget, or the
    larger tree's size where that is less (their union holds at least as many nodes)."""
    unread, device = first.unread, first.unread.tokens.device
    names = tuple(dict.fromkeys((*unread.names, *second.origins)))  # a first tree without kinds: all names[0]
    tokens, parents, scores = unread.tokens, unread.parents, unread.scores.double()
    kinds = torch.zeros_like(tokens) if unread.kinds is None else unread.kinds
    own_tokens, own_parents, own_kinds, own_depths = (to_device(values, device, torch.long) for values in (
        second.tokens, second.parents, [names.index(origin) for origin in second.origins], second.depths))
    own_scores = to_device(second.scores, device, torch.float64)
    # second's node -> first's node of the same path (-2: none), a depth more each round
    match = torch.full_like(own_tokens, -2)
    for _ in range(second.depth):
        above = torch.where(own_parents == ROOT, ROOT, match[own_parents.clamp(min=0)])
        same = (own_tokens[:, None] == tokens[None]) & (above[:, None] == parents[None])
        match = torch.where(same.any(dim=1), same.int().argmax(dim=1), -2)
    n, matched = len(second), match >= 0
    # first's node -> the candidate that holds its path: second's node where one matched it, else its own
    holder = torch.cat([torch.arange(n, n + len(tokens), device=device), own_tokens.new_zeros(1)])
    holder[torch.where(matched, match, len(tokens))] = torch.arange(n, device=device)
    covered = holder[:-1] < n
    theirs = scores[match.clamp(min=0)]
    higher = matched & (theirs > own_scores)
    depths = torch.ones_like(tokens)
    for _ in range(unread.depth - 1):
        depths = torch.where(parents == ROOT, 1, depths[parents.clamp(min=0)] + 1)
    merged = (torch.cat([own_tokens, tokens]),
              torch.cat([own_parents, torch.where(parents == ROOT, ROOT, holder[parents.clamp(min=0)])]),
              torch.cat([torch.where(higher, theirs, own_scores), scores]),
              torch.cat([torch.where(higher, kinds[match.clamp(min=0)], own_kinds), kinds]))
    kept = torch.cat([torch.ones_like(own_tokens, dtype=torch.bool), ~covered])
    bounded = _siblings_bounded(merged[1], merged[2], kept, max(second.depth, unread.depth))
    size = min(budget, max(n, len(tokens)))
    ranked = best_first(merged[0], merged[1], bounded, torch.cat([own_depths, depths]), size, kinds=merged[3],
                        kept=kept)  # fmt: skip
    return ranked.tree(names, max(second.depth, unread.depth))


def _siblings_bounded(parents: torch.Tensor, scores: torch.Tensor, kept: torch.Tensor, depth: int) -> torch.Tensor:
    """`siblings_bounded`'s chances of candidates [c] (their parents' places, ROOT below the root) on the device,
    those not `kept` left out of their siblings' sums, for a tree at most `depth` deep."""
    count = len(parents)
    above = torch.where(parents == ROOT, count, parents)  # the root's place: past the candidates
    given = torch.cat([scores, scores.new_ones(1)])  # each place's own chance, the root's 1
    sums = scores.new_zeros(count + 1).index_add_(0, above, torch.where(kept, scores, 0.0))
    total = torch.where(given > 0, torch.clamp(sums / given, min=1.0), 1.0)
    conditional = torch.where(given[above] > 0, scores / given[above] / total[above], 0.0)
    chance = conditional
    for _ in range(depth - 1):  # each round settles a depth more
        chance = conditional * torch.cat([chance, chance.new_ones(1)])[above]
    return chance


def merge_trees(first: DraftTree, second: DraftTree, budget: int, leaders: frozenset[str] | None = None) -> DraftTree:
    """`first`'s nodes, then `second`'s that are new, in order, up to `budget` nodes (a node whose parent did not
    fit is left out with it); `leaders` as `DraftTree` says."""
    tokens: list[int] = []
    parents: list[int] = []
    origins: list[str] = []
    child: dict[tuple[int, int], int] = {}  # (merged parent, token) -> merged node
    for tree in (first, second):
        placed: list[int | None] = []
        for parent, token, origin in zip(tree.parents, tree.tokens, tree.origins):
            key = (ROOT if parent == ROOT else placed[parent], token)  # a parent left out: the budget is full
            if key not in child and len(tokens) < budget:
                child[key] = len(tokens)
                tokens.append(token)
                parents.append(key[0])
                origins.append(origin)
            placed.append(child.get(key))
    return DraftTree(tokens, parents, origins, leaders=leaders)

