"""The tree budget that maximises expected tokens per second on this machine, for this drafter.

On 2 CPU cores verifying 64 nodes costs several single-token forwards; on a GPU about one. So the engine times
verification forwards of each size for the loaded model (calibration, cached on disk per model, dtype, device
and context class, since each tree row attends to the whole context; kept up to date by the forwards decoding
times, `verify_cost.py`) and weighs that cost against the acceptance it observes:

    expected tokens(n) = 1 + sum_{d=1..depth(n)} prod_{j<=d} alpha_j
    budget = argmax_n expected_tokens(n) / (verify cost(n) + draft cost(n))

- alpha_j is the rate at which depth j is accepted when proposed below an accepted depth j - 1 (the conditional
  rate, so that the product is the chance of reaching depth d), counted with exponential decay so the budget
  follows the text (a copied passage, then free writing). A depth never proposed takes the rate of the one above
  it, so a drafter whose chains are accepted whole grows them. Each depth keeps its own estimate with one
  pseudo-step at 0.5: a tree's depths are one event (a copy is right or wrong), not independent evidence.
- depth(n) is how deep this drafter's trees of n nodes reach (a moving average: a beam of 7 nodes reaches depth
  2, a chain depth 7) and draft cost(n) the time it took to propose them, both measured as the engine runs.
  A drafter's first proposal at a budget and sampling setting is not priced (the engine passes no time for it),
  nor one that captured a CUDA graph (anew, its buffers grown): it pays what the drafter does once (kernels
  compiled, a graph captured), which priced would keep that budget, or drafting at all, off for the rest of the
  text.
- When drafting does not pay (budget 0) the engine still probes with a small tree now and then, so that a return
  of copyable text is noticed; each probe that did not pay doubles the wait for the next, and after
  MAX_FAILED_PROBES in a row drafting stays off: a probe costs a verification of several rows.
- A composite drafter's parts are counted apart, by origin: n-gram lookup proposes only where the text repeats
  and is mostly right there, and pooled with a model part that is mostly wrong its copies would be priced at the
  model's rate. Drafting time is priced per mode, the kinds that draft a step (`Drafter.next_kinds`: the lookup
  alone costs no draft forward), each step's tree is sized for its mode, and a part's depth(n) is learnt only
  from the steps it led (`DraftTree.leaders`).
- A drafter whose nodes carry scores (`Drafter.scores_nodes`: n-gram lookup, TokenSwift's heads, their
  composite) is sized after it drafts, as EAGLE-2 sizes its trees: asked for SCORED_TREE nodes, its tree is cut
  to the n most likely that maximise (1 + c * the sum of their scores) / (verify cost(n) + the drafting done).
  A score is a node's estimated chance of acceptance, so their sum is the tokens a tree should add; c corrects
  the estimates by what was accepted (decayed sums, a prior of one each). The drafting is paid whatever is
  kept, so while its steps are expected to run slower than plain ones it drafts only now and then, as often as
  keeps that drafting under PROBE_SHARE of the time: cheap drafting is probed every few steps (a text that turns
  predictable is drafted again within a few tokens), costly drafting rarely. A tree left on the device (TokenSwift's
  and EAGLE-3's on a GPU, listed best first) is cut to the size the last scored tree's scores chose and sized
  itself once the acceptance has read it: reading its scores first would cost the step a second wait.
  Merged best-first by these scores, the heads' guesses and the lookup's chains share one tree. The drafter is
  told the least score worth a verified node (`least_chance`), so that a tree grown a depth at a time (EAGLE-3,
  chained heads) does not run rows for children the cut would drop.
"""

from __future__ import annotations

import math
from collections import deque
from statistics import median_low
from typing import TYPE_CHECKING

from specchat.engine.verify_cost import VerifyCost

if TYPE_CHECKING:  # torch-free: the CLI checks --draft-budget against MAX_BUDGET before loading torch
    from specchat.engine.tree import DraftTree

# Tree sizes the budget chooses from: with the root, 1, 2, 4, ... 64 rows, the row blocks kernels compute in
# (torch's CPU int4 kernel takes rows four at a time: 5 rows cost about twice 4).
SIZES = (0, 1, 3, 7, 15, 31, 63)
# The sizes a calibration times: the budget's, and each one up to 4, among which a scored tree's cut mostly chooses
# and where a CPU's forward turns from reading the weights to computing its rows. Each is a size class of its own:
# priced by the class of 3, 2 nodes would cost about 3's, and the cut would never keep them.
CALIBRATED_SIZES = tuple(sorted({*SIZES, 2, 4}))
SCORED_TREE = 15  # the nodes a drafter that scores them proposes; `AdaptiveBudget.size` keeps those that pay
SCORED_SPEED_DECAY = 0.8  # of the past, in the moving average of what scored drafting is expected to gain
MAX_BUDGET = 64  # the most nodes a fixed budget may ask for: canonical attention's deepest tree
MAX_FAILED_PROBES = 3  # probes in a row that did not pay, after which drafting stays off
NEW_TREE_WEIGHT = 0.25  # of a tree's depth in the moving average of its budget's depth
PROBE_SHARE = 0.02  # of the time, at most, that probes spend drafting while scored drafting does not pay


class Acceptance:
    """What one drafter (one origin) has had accepted, per depth, with decay; and how deep its trees reach."""

    def __init__(self, decay: float):
        self.decay = decay
        self.proposed: list[float] = []  # decayed counts per depth d (index d - 1)
        self.accepted: list[float] = []
        # budget -> how deep its trees reach: the first tree's depth, then a moving average (fractional). The
        # last tree's depth alone locked dynamic trees small: one beam of 3 (depth 1) priced 3 nodes as 1 node at
        # more cost, the budget fell to 1, and no tree of 3 came again to correct it.
        self.depth: dict[int, float] = {}

    def observe(self, depth: int, accepted: int, budget: int) -> None:
        """Count one tree reaching `depth` of which `accepted` depths were; `budget` 0: its depth is not that of
        this origin's trees of the step's budget."""
        if budget:
            seen = self.depth.get(budget, depth)
            self.depth[budget] = seen + (depth - seen) * NEW_TREE_WEIGHT
        for counts in (self.proposed, self.accepted):
            counts[:] = [c * self.decay for c in counts]
            counts.extend([0.0] * (depth - len(counts)))
        for d in range(min(depth, accepted + 1)):  # depth d + 1 counts where depth d was accepted
            self.proposed[d] += 1
        for d in range(accepted):
            self.accepted[d] += 1

    def expected_tokens(self, n: int) -> float:
        """Tokens a step with a tree of n nodes is expected to commit, bonus included."""
        total, reach, rate = 1.0, 1.0, 0.5
        depth = self.depth.get(n, n)
        for d in range(math.ceil(depth)):
            if d < len(self.proposed) and self.proposed[d] > 0:  # else the rate of the depth above
                rate = (self.accepted[d] + 0.5) / (self.proposed[d] + 1.0)  # one pseudo-step accepted at 0.5
            reach *= rate
            total += reach * min(1.0, depth - d)  # a fractional depth counts its last level in part
        return total


class AdaptiveBudget:
    """Chooses each step's tree budget from the verification cost and the acceptance seen so far. `cost` is
    shared: the engine keeps one per calibration, which the forwards timed here keep up to date."""

    def __init__(self, cost: VerifyCost, *, max_budget: int = MAX_BUDGET, decay: float = 0.97, probe_every: int = 16,
                 max_failed_probes: int = MAX_FAILED_PROBES):  # fmt: skip
        self.cost = cost
        self.candidates = [n for n in SIZES if n <= max_budget]
        self.decay = decay
        self.probe_every = probe_every
        self.max_failed_probes = max_failed_probes
        self.failed_probes = 0  # in a row: each doubles the wait for the next
        self.probing = False  # the next non-empty tree is a probe
        self.origins: dict[str, Acceptance] = {}
        # mode (the origins in a tree) -> budget -> smoothed seconds the drafter took
        self.draft_seconds: dict[frozenset[str], dict[int, float]] = {}
        self.idle_steps = 0  # the optimistic prior tries drafting at the start; probes come after idle steps
        self.sized: dict[frozenset[str], int] = {}  # each timed mode's own best budget (`_best` fills it)
        self.scored = (1.0, 1.0)  # scored trees: decayed sums of their scores and of their accepted nodes (a prior)
        self.scored_speed = 1.0  # moving average of a scored step's expected speed over a plain step's, drafting paid
        self.scored_draftings: deque[float] = deque(maxlen=3)  # the last scored trees' drafting, in decode steps
        self.scored_size = 0  # the nodes the last scored tree's scores chose to verify
        self.budget = self._best()

    def observe(self, tree: DraftTree, path: list[int], *, budget: int | None = None, draft_seconds: float | None = 0.0,
                verify_seconds: float | None = None, mode: frozenset[str] | None = None) -> None:  # fmt: skip
        """Record one verified tree, proposed with `budget` in `draft_seconds` (None: not priced) by the kinds
        `mode` (by default the tree's origins) and verified in `verify_seconds` (None: not timed), of which the
        nodes `path` were accepted. Each origin in the tree is counted on the nodes it proposed: its own and their
        ancestors (a composite's second part joins the first part's nodes where it proposed the same tokens).
        Empty trees (the drafter had nothing) say nothing about acceptance, depth or drafting time; their forward
        still times a decode step."""
        if verify_seconds is not None:
            self.cost.observe(len(tree), verify_seconds)
        if tree.scores is not None:  # a scored tree
            self.scored = (self.scored[0] * self.decay + sum(tree.scores), self.scored[1] * self.decay + len(path))
        mode = frozenset(tree.origins) if mode is None else mode
        if budget and len(tree) and draft_seconds is not None:
            seconds = self.draft_seconds.setdefault(mode, {})
            seconds[budget] = 0.8 * seconds.get(budget, draft_seconds) + 0.2 * draft_seconds
        for origin, nodes in proposers(tree).items():
            depth = max(tree.depths[node] for node in nodes)
            accepted = sum(node in nodes for node in path)  # its nodes are closed under ancestors: a prefix
            led = tree.leaders is None or origin in tree.leaders  # else its depth is not its trees' at this budget
            self.origins.setdefault(origin, Acceptance(self.decay)).observe(depth, accepted, budget if led else 0)
        if len(tree) and tree.scores is None:  # a scored tree is sized by its scores (`size`), not by the budget
            self.budget = self._best()
            if self.probing:  # a probe fails when its tokens did not pay for its step (drafting and verifying)
                self.probing = False
                paid = 1 + len(path) >= self.relative_cost(budget or len(tree), mode)
                self.failed_probes = 0 if paid else self.failed_probes + 1

    @property
    def off_for_good(self) -> bool:
        return not self.budget and self.failed_probes >= self.max_failed_probes

    def next_budget(self, mode: frozenset[str] = frozenset()) -> int:
        """The next tree's budget, for a tree drafted by the kinds `mode` (any: empty). A mode not timed yet is
        sized from what its parts have had accepted (the prior, for parts never seen) even while drafting is
        off: an n-gram drafter's first copy of a long passage is tried however its short matches fared. While
        drafting, a plain step now and then times the decode step that every price is a ratio to."""
        if self.cost.decode_stale:
            return 0
        if mode and mode not in self.sized:
            untried = self._best_for(mode)
            if untried or self.budget:
                return untried
        if self.budget:
            return self.sized[mode] if mode else self.budget
        if self.off_for_good:
            return 0
        self.idle_steps += 1
        if self.idle_steps >= self.probe_every << self.failed_probes:
            self.idle_steps, self.probing = 0, True
        if self.probing:  # until the drafter has something to show: an empty tree costs no verification
            return self.candidates[min(2, len(self.candidates) - 1)]  # a small probe tree (3 nodes)
        return 0

    def scored_budget(self) -> int:
        """The nodes to ask of a drafter that scores them: SCORED_TREE; none when a plain step is due, and none
        while its steps have been expected to run slower than plain ones (the drafting alone cost more than the
        nodes worth verifying would gain: guesses at sampled prose at 20K tokens), but for a probe once the steps
        since the last one make its drafting PROBE_SHARE of their time. A probe costs a draft and no verification
        unless its nodes pay, and it is how drafting comes back: drafting at a twentieth of a step is probed every
        third step, so two unlucky trees at an answer's start cost it a few undrafted steps, not dozens. A probe's
        drafting is taken as the median of the last three trees', so that one slow tree does not put the probes off
        by its own time."""
        if self.cost.decode_stale:
            return 0
        if self.scored_speed < 1.0:
            self.idle_steps += 1
            if self.idle_steps * PROBE_SHARE < median_low(self.scored_draftings or [0.0]):
                return 0
            self.idle_steps = 0
        return min(SCORED_TREE, self.candidates[-1])

    def least_chance(self) -> float:
        """The least score a node of a scored tree needs to be worth verifying: its tokens (the score, corrected
        by what was accepted) at the speed scored steps have been expected to reach must pay for a node's mean
        verification cost in the tree asked for. A drafter that grows its tree a depth at a time need not expand
        a node below it: a child is no likelier than its parent."""
        nodes = min(SCORED_TREE, self.candidates[-1])
        if not nodes:
            return 0.0
        per_node = max(self.cost.relative(nodes) - 1.0, 0.0) / nodes
        return self.scored_speed * per_node * self.scored[0] / self.scored[1]

    def size(self, scores: list[float], draft_seconds: float | None) -> int:
        """How many of a scored tree's most likely nodes to verify, given its nodes' `scores`: as many as maximise
        tokens per second, a node adding its score, times the ratio of nodes accepted to scores summed over the
        scored trees so far, to the tokens a step expects (the drafting done, `draft_seconds`, is paid whatever is
        kept; None: not priced). The size is kept in `scored_size`: where reading a tree costs a wait, the next tree
        is cut to it."""
        calibration = self.scored[1] / self.scored[0]
        drafting = 0.0 if draft_seconds is None else draft_seconds / self.cost.now(0)
        if draft_seconds is not None:
            self.scored_draftings.append(drafting)
        best, best_speed, expected = 0, 1 / (1 + drafting), 1.0
        for n, score in enumerate(sorted(scores, reverse=True), 1):
            expected += score * calibration
            if (speed := expected / (self.cost.relative(n) + drafting)) > best_speed:
                best, best_speed = n, speed
        self.scored_speed = SCORED_SPEED_DECAY * self.scored_speed + (1 - SCORED_SPEED_DECAY) * best_speed
        self.scored_size = best
        return best

    def expected_tokens(self, n: int, mode: frozenset[str] = frozenset()) -> float:
        """Tokens a step with a tree of n nodes is expected to commit, bonus included, from the best part of
        `mode` (of all parts when empty)."""
        unseen = Acceptance(self.decay)  # the prior: unseen depths are tried
        parts = [self.origins.get(origin, unseen) for origin in mode] or list(self.origins.values()) or [unseen]
        return max(part.expected_tokens(n) for part in parts)

    def _best(self) -> int:
        """The budget of the mode that pays best (0: drafting pays in none); each timed mode's own best budget is
        kept in `sized`, for `next_budget` to read in the decode loop."""
        modes = list(self.draft_seconds) or [frozenset()]  # no drafting timed yet: all parts, drafting free
        speeds = {mode: {n: self._speed(n, mode) for n in self.candidates} for mode in modes}
        self.sized = {mode: max(self.candidates, key=by_size.__getitem__) for mode, by_size in speeds.items()}
        return max(self.candidates, key=lambda n: max(by_size[n] for by_size in speeds.values()))

    def _best_for(self, mode: frozenset[str]) -> int:
        return max(self.candidates, key=lambda n: self._speed(n, mode))

    def _speed(self, n: int, mode: frozenset[str]) -> float:
        """Tokens per decode step's time with trees of n nodes drafted by `mode`."""
        return self.expected_tokens(n, mode) / self.relative_cost(n, mode)

    def relative_cost(self, n: int, mode: frozenset[str] = frozenset()) -> float:
        """A step's cost with a tree of n nodes, in decode steps: verification plus drafting in `mode`."""
        return self.cost.relative(n) + self.draft_seconds.get(mode, {}).get(n, 0.0) / self.cost.now(0)


def proposers(tree: DraftTree) -> dict[str, set[int]]:
    """Origin -> the nodes it proposed: those carrying it and their ancestors."""
    nodes: dict[str, set[int]] = {}
    for node, origin in enumerate(tree.origins):
        own = nodes.setdefault(origin, set())
        while node >= 0 and node not in own:  # up to the root (-1)
            own.add(node)
            node = tree.parents[node]
    return nodes
