"""Drafters for tests: real implementations of the `Drafter` protocol whose proposals the test controls.

None of them touches the engine's internals. They track the committed ids through `prefill` / `commit` like
any drafter, and build their trees with `TreeBuilder`, so siblings are distinct and every tree respects the
budget. What differs is where their tokens come from:

- `OracleDrafter` knows the target's greedy continuation and proposes it, surrounded by wrong siblings and
  by decoys (the right token under a wrong parent);
- `WrongDrafter` proposes only tokens that are never the greedy choice at their position (plus decoys);
- `RandomTreeDrafter` proposes random shapes mixing correct and random tokens;
- `TopTokensDrafter` proposes the target's own most likely tokens, `width` children per node — the most
  adversarial proposal for a sampling verifier, since it always proposes what the target is likely to draw;
- `EndBesideDrafter` proposes the reference with a given token (the end of text) beside each of its nodes;
- `ScoredChainDrafter` proposes the reference's chain with a wrong sibling at each depth, scored and left on the
  device best first, as TokenSwift's and EAGLE-3's trees are on a GPU.

`random_eagle3` is a real EAGLE-3 draft layer with random weights, for the real drafter. `rerun` stands in for
a CUDA graph's capture on a CPU: what a drafter would capture runs again at each replay, into the same outputs, and
must dispatch the same ops with the same host values (a graph replays them frozen).
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable

import torch
from queue_drains import READS, WRITES, _boolean, _caller, on_tolist
from torch.utils._python_dispatch import TorchDispatchMode

from specchat.drafters.eagle3.model import Eagle3Config, Eagle3Draft
from specchat.drafters.eagle3.train import initial_draft
from specchat.engine.drafter import DraftsAlone, TracksCommittedIds
from specchat.engine.host_data import to_device
from specchat.engine.tree import ROOT, DraftTree, TreeBuilder, best_first


class _TrackingDrafter(DraftsAlone, TracksCommittedIds):
    """Keeps the committed ids, prompt included, exactly as the engine reports them."""

    kind = "test"

    def __init__(self):
        self.ids: list[int] = []
        self.proposals: list[DraftTree] = []  # every tree proposed, for the test to inspect

    def prefill(self, ids: list[int], hidden=None, reused: int = 0) -> None:
        self.new_request(ids, reused)

    def propose(self, budget: int, sampling=None, least_chance: float = 0.0, noise=None) -> DraftTree:
        tree = self._propose(budget)
        assert len(tree) <= budget, "a test drafter broke its own budget"
        self.proposals.append(tree)
        return tree

    def _propose(self, budget: int) -> DraftTree:  # pragma: no cover - abstract
        raise NotImplementedError


class OracleDrafter(_TrackingDrafter):
    """Proposes the next `depth` tokens of `reference` (prompt + the target's greedy output) as a chain.

    With `siblings`, every chain node gets a wrong sibling inserted *before* it (so the right child is never
    simply node 0 and the accepted KV rows are not contiguous), and under each wrong sibling a decoy: the
    chain's next token, which is right for its depth but sits in a wrong context. Chain nodes are reserved
    first, so siblings and decoys only use budget the chain leaves over.
    """

    kind = "oracle"

    def __init__(self, reference: list[int], *, depth: int, vocab_size: int, siblings: bool = True):
        super().__init__()
        self.reference = list(reference)
        self.depth = depth
        self.vocab_size = vocab_size
        self.siblings = siblings

    def chain_length(self, budget: int) -> int:
        return max(0, min(self.depth, budget, len(self.reference) - len(self.ids)))

    def _propose(self, budget: int) -> DraftTree:
        n = len(self.ids)
        if self.ids != self.reference[:n]:  # the engine left the reference: an oracle no more
            return DraftTree.empty()
        chain = self.reference[n : n + self.chain_length(budget)]
        builder, parent = TreeBuilder(), ROOT
        for d, token in enumerate(chain):
            left = len(chain) - d  # chain nodes still to place, this one included
            if self.siblings and len(builder) + left + 1 <= budget:
                wrong = builder.add(parent, (token + 1) % self.vocab_size, self.kind)
                if d + 1 < len(chain) and len(builder) + left + 1 <= budget:
                    builder.add(wrong, chain[d + 1], self.kind)  # decoy: right token, wrong context
            parent = builder.add(parent, token, self.kind)
        return builder.build()


class EndBesideDrafter(OracleDrafter):
    """The reference's chain with `end` beside each node, first: where the target's own pick is the end of text
    but something holds it back (`min_tokens`), a verifier that ignored the hold would accept it."""

    def __init__(self, reference: list[int], *, depth: int, end: int):
        super().__init__(reference, depth=depth, vocab_size=0, siblings=False)
        self.end = end

    def _propose(self, budget: int) -> DraftTree:
        n = len(self.ids)
        if self.ids != self.reference[:n]:
            return DraftTree.empty()
        builder, parent = TreeBuilder(), ROOT
        for token in self.reference[n : n + min(self.depth, budget // 2)]:
            if token != self.end:
                builder.add(parent, self.end, self.kind)
            parent = builder.add(parent, token, self.kind)
        return builder.build()


class ScoredChainDrafter(_TrackingDrafter):
    """The reference's next `depth` tokens as a chain, each with a wrong sibling; the chain's d-th node scored
    `chance` ** d, a sibling a tenth of its node (`chance` 0: every chain token wrong too). The tree is ranked and
    left on the device (`best_first`), unread."""

    kind = "scored"
    scores_nodes = True

    def __init__(self, reference: list[int], *, vocab_size: int, chance: float = 0.9, depth: int = 8,
                 sleep: float = 0.0, device: torch.device | str = "cpu"):  # fmt: skip
        """`sleep`: seconds each proposal takes besides (drafting that costs more than its nodes gain)."""
        super().__init__()
        self.reference, self.vocab_size, self.chance = list(reference), vocab_size, chance
        self.depth, self.sleep, self.device = depth, sleep, device

    def _propose(self, budget: int) -> DraftTree:
        time.sleep(self.sleep)
        n = len(self.ids)
        chain = self.reference[n : n + self.depth]
        if self.ids != self.reference[:n] or not chain:
            return DraftTree.empty()
        if not self.chance:
            chain = [(token + 2) % self.vocab_size for token in chain]
        tokens, parents, scores = [], [], []
        for d, token in enumerate(chain):  # chain node d at place 2 d, its sibling at 2 d + 1
            parent = 2 * d - 2 if d else ROOT
            tokens += [token, (token + 1) % self.vocab_size]
            parents += [parent, parent]
            score = max(self.chance, 0.05) ** (d + 1)
            scores += [score, score / 10]
        depths = [place // 2 + 1 for place in range(len(tokens))]
        tokens, parents = to_device(tokens, self.device, torch.long), to_device(parents, self.device, torch.long)
        scores = to_device(scores, self.device, torch.float64)
        ranked = best_first(tokens, parents, scores, to_device(depths, self.device), min(budget, len(depths)))
        return ranked.tree(self.kind, max(depths))


class WrongDrafter(_TrackingDrafter):
    """Never right: `width` children of the root that differ from the greedy token, each followed by the
    reference's next tokens (decoys that would be right if their parent were)."""

    kind = "wrong"

    def __init__(self, reference: list[int], *, vocab_size: int, width: int = 3, depth: int = 4):
        super().__init__()
        self.reference = list(reference)
        self.vocab_size = vocab_size
        self.width = width
        self.depth = depth

    def _propose(self, budget: int) -> DraftTree:
        n = len(self.ids)
        assert self.ids == self.reference[:n], "the engine left the greedy reference"
        right = self.reference[n]
        builder = TreeBuilder()
        for w in range(1, self.width + 1):
            wrong = (right + w) % self.vocab_size
            builder.add_chain([wrong, *self.reference[n + 1 : n + self.depth]], self.kind, budget=budget)
        return builder.build()


class RandomTreeDrafter(_TrackingDrafter):
    """Random shapes and sizes (0 to `budget` nodes), each token the reference's token for its depth with
    probability `p_correct` (right when the node's ancestors are right, a decoy otherwise), else random.
    Without a reference every token is random."""

    kind = "random"

    def __init__(self, *, vocab_size: int, seed: int, reference: list[int] | None = None, p_correct: float = 0.6):
        super().__init__()
        self.vocab_size = vocab_size
        self.rng = random.Random(seed)
        self.reference = reference
        self.p_correct = p_correct

    def _propose(self, budget: int) -> DraftTree:
        rng, n = self.rng, len(self.ids)
        size = rng.randint(0, budget)
        builder, depths = TreeBuilder(), {ROOT: 0}
        for _ in range(4 * size):  # duplicates collapse into existing nodes, so try a few times more
            if len(builder) >= size:
                break
            if len(builder) and rng.random() < 0.5:
                parent = len(builder) - 1  # grow the newest node: long chains are common
            else:
                parent = rng.choice([ROOT, *range(len(builder))])
            depth = depths[parent] + 1
            if self.reference is not None and n + depth - 1 < len(self.reference) and rng.random() < self.p_correct:
                token = self.reference[n + depth - 1]
            else:
                token = rng.randrange(self.vocab_size)
            node = builder.add(parent, token, self.kind)
            depths[node] = depth
        return builder.build()


class TopTokensDrafter(_TrackingDrafter):
    """The `width` most likely tokens of `next_probs(context)` at every node, down to `depth`, breadth first.

    `next_probs` maps a tuple of ids to the next-token probabilities (a list) — the target's own, in the
    sampling tests. `width=1` is a greedy chain of the target's favourite tokens.
    """

    kind = "top"

    def __init__(self, next_probs: Callable[[tuple[int, ...]], list[float]], *, width: int, depth: int):
        super().__init__()
        self.next_probs = next_probs
        self.width = width
        self.depth = depth

    def _propose(self, budget: int) -> DraftTree:
        builder = TreeBuilder()
        frontier = [(ROOT, tuple(self.ids))]
        for _ in range(self.depth):
            below = []
            for parent, context in frontier:
                probs = self.next_probs(context)
                for token in sorted(range(len(probs)), key=lambda t: -probs[t])[: self.width]:
                    if len(builder) >= budget:
                        return builder.build()
                    below.append((builder.add(parent, token, self.kind), context + (token,)))
            frontier = below
        return builder.build()


def random_eagle3(model, vocab: int = 512, seed: int = 0) -> Eagle3Draft:
    """An EAGLE-3 draft over target ids 3 .. vocab + 2, its weights moved off their start so that its guesses vary."""
    torch.manual_seed(seed)
    config = Eagle3Config.for_target(model.config, intermediate=96, draft_vocab_size=vocab)
    draft = initial_draft(config, model, torch.arange(3, 3 + vocab))
    with torch.no_grad():
        for parameter in draft.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    return draft


class Rerun:
    """A CUDA graph's stand-in on a CPU: `replay` runs the captured call again into the outputs of its capture, and
    fails where the call dispatched other ops, shapes or host values than at its capture (a graph would replay the
    captured ones: a value the host computed each time, a position or a token, is frozen in it), or where it moved
    data between host and device (capture refuses a read of the device's values; a copy of host data would replay
    from memory the host has since reused)."""

    def __init__(self, call):
        self.call = call
        for _ in range(2):  # warmed up as `capture` warms it up: what a first call sets up is no part of a graph
            call()
        with DispatchedOps() as ops:
            self.out = call()
        assert not ops.transfers, f"a captured call moved data between host and device: {ops.transfers}"
        self.ops = ops.seen

    def replay(self):
        with DispatchedOps() as ops:
            fresh = self.call()
        assert not ops.transfers, f"a captured call moved data between host and device: {ops.transfers}"
        changed = next(((now, then) for now, then in zip(ops.seen, self.ops) if now != then), "another op count")
        assert ops.seen == self.ops, f"the captured call dispatched other ops or host values (now, then): {changed}"
        for held, new in zip(_tensors(self.out), _tensors(fresh), strict=True):
            if held is not None:  # an output a call leaves out (a ranked tree without kinds)
                held.copy_(new)


def _tensors(out) -> tuple[torch.Tensor, ...]:
    """A captured call's outputs: a tuple of tensors, or a dataclass of them (the torch decoder's `ForwardOutput`)."""
    if not dataclasses.is_dataclass(out):
        return out
    return tuple(getattr(out, field.name) for field in dataclasses.fields(out))


def rerun(call, pool=None):
    """`cuda_graphs.graph_of`'s stand-in on a CPU: (the stand-in graph, its outputs)."""
    graph = Rerun(call)
    return graph, graph.out


class DispatchedOps(TorchDispatchMode):
    """The ops dispatched while active, each with its arguments' shapes and dtypes, and its host values as given;
    and among them the transfers (`queue_drains`' reads of values and tensors of host data, `tolist` included)."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple] = []
        self.transfers: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        described = tuple(_described(value) for value in (*args, *kwargs.values()))
        self.seen.append((str(func), described))
        if func in READS or func in WRITES or (func is torch.ops.aten.index.Tensor and _boolean(args[1])):
            self.transfers.append(f"{func} at {_caller()}")
        return func(*args, **kwargs)

    def __enter__(self):
        self._restore = on_tolist(lambda: self.transfers.append(f"tolist at {_caller()}"))
        return super().__enter__()

    def __exit__(self, *exc):
        self._restore()
        return super().__exit__(*exc)


def _described(value):
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype)
    if isinstance(value, (list, tuple)):
        return tuple(_described(item) for item in value)
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device)):
        return value
    return type(value).__name__  # a storage the interpreter wraps a kernel's output in, a layout
