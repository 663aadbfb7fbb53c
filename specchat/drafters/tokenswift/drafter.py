"""TokenSwift: the target drafts for itself. One target forward of the root over a partial KV cache gives
the LM head's next-token distribution and, through gamma = 3 heads (`drafters/tokenswift/model.py`), guesses for
the three tokens after it; the most frequent 4-grams of the text that start with the drafted token
(`ngram_table.py`) are added as branches.

The tree is TokenSwift's [1, 3, 3, 3]: the LM head's top token, then the top 3 of each head under every
node of the level above (40 nodes), merged with the n-gram chains (siblings distinct). Where the engine's
budget is smaller, the nodes kept are the most probable: a node's score is the product of its drafting
probabilities along its path (an n-gram chain's share of its first token's 4-gram counts stands for the
heads' probabilities), so a parent always outranks its children. Drafting probabilities are the target's
processed ones (penalty, temperature, min-p ...) with the committed text as history, as TokenSwift drafts.
Verification reads the full cache, so none of this can change the output, only its speed.

Heads that read their chain's tokens (`chain_input`) guess a node's children from that node's own token, so
their levels are not one product: they run a depth at a time, head i + 1 over the depth-i nodes that still rank
among the budget's most probable (each reading its own token), and each such node gets its own top 3.

Without the draft forward (`forward=False`, the default on a CPU) the heads draft from the state the last
verification already computed, the one that predicted the root, as Medusa's heads do: the tree is [3, 3, 3]
under the root and the 4-grams continue the root. It costs no target forward, which on a CPU costs a whole
read of the weights, about what the verification itself costs; the draft forward pays where a long context's
attention is most of a step, and the partial cache skips most of it (a GPU at 100K tokens).
"""

from __future__ import annotations

from pathlib import Path

import torch

from specchat.drafters import TOKENSWIFT
from specchat.drafters.draft_head import DraftHead, draft_weights
from specchat.drafters.tokenswift.model import TokenSwiftHeads, download_heads, load_heads
from specchat.drafters.tokenswift.ngram_table import NgramTable
from specchat.drafters.tokenswift.partial_kv import PartialKV
from specchat.engine.drafter import TargetView
from specchat.engine.host_data import to_device, to_host
from specchat.engine.sampling import PositionNoise, SamplingConfig, process_logits
from specchat.engine.tree import DraftTree
from specchat.quant.quantize import quantized_copy

KV_BUDGET = 4096  # TokenSwift's partial cache B; 0 drafts over the full cache
WIDTH = 3  # candidates per head (the [1, 3, 3, 3] tree)
NGRAM = "ngram"  # the origin of the nodes its n-gram reuse adds


class TokenSwiftDrafter:
    kind = TOKENSWIFT  # the registry name: the chat colours its tokens by it
    scores_nodes = True
    feature_layers = ()  # the target's last state

    def __init__(self, target: TargetView, heads: TokenSwiftHeads, *, kv_budget: int = KV_BUDGET,
                 forward: bool = True, lag: int = 1024, weights: str | None = "auto"):  # fmt: skip
        """`forward`: draft the root's own token with a target forward over `kv_budget` slots of its cache
        (0: the engine's full cache); else the heads alone, from the last verified state. `weights`: "int8" /
        "int4" / "q4_k" run the heads and the reduced head quantized (on a CPU each draft reads them anew after the
        target's step evicted them), None dense, "auto" as the target runs (quantized on a CPU whose target is)."""
        weights = draft_weights(target, weights)
        self.target = target
        self.heads = quantized_copy(heads.to(target.device, target.dtype), weights, dtype=target.dtype)
        self.head = DraftHead(target, heads.draft_vocab, weights)
        self.forward = forward
        self.partial = PartialKV(target, kv_budget) if forward and kv_budget else None
        self.table = NgramTable(lag=lag)
        self.ids: list[int] = []  # the committed ids of the request (the table reads them)
        self.state: torch.Tensor | None = None  # the target's last state of the committed text: it predicted the root

    def prefill(self, ids: list[int], hidden=None, reused: int = 0) -> None:
        """Keep the n-gram table when `ids` go on from the text it has read (a book's refill drops its oldest
        tokens but continues the same text), else read `ids` afresh."""
        overlap = min(len(ids), len(self.ids), 64)
        continues = overlap > 0 and ids[-overlap:] == self.ids[-overlap:] and len(ids) <= len(self.ids)
        if not continues:
            self.table = NgramTable(lag=self.table.lag)
            self.table.add(ids)
        self.ids = list(ids)
        self._keep_state(hidden)
        if self.partial is not None:
            self.partial.truncate(0)

    def commit(self, tokens: list[int], hidden=None) -> None:
        self.ids += tokens
        self.table.add(tokens)
        self._keep_state(hidden)

    def _keep_state(self, hidden: torch.Tensor | None) -> None:
        if hidden is not None and len(hidden):  # none after prefill's first token: the prefill's last still holds
            self.state = hidden[-1:]

    def next_kinds(self) -> frozenset[str]:
        return frozenset({self.kind, NGRAM})  # its trees carry its n-gram reuse's chains as n-gram nodes

    @torch.inference_mode()
    def propose(self, budget: int, sampling: SamplingConfig, generator=None, least_chance: float = 0.0,
                noise: PositionNoise | None = None) -> DraftTree:
        """The draft forward's token feeds the heads as the device tensor it is; the host reads the first token and
        the heads' guesses once, at the end (heads that read their chain's tokens choose on the host at each depth).

        Where the target's draws are keyed (`noise`), the draft forward's token is its guess at the target's draw
        (the target's own distribution, over a partial cache), while the heads keep their likeliest tokens: a head
        guesses a token a few places on from a state that has not seen those before it, a distribution flatter
        than the target's, whose race's winner is the target's draw less often than its likeliest token."""
        if budget < 1:
            return DraftTree.empty()
        root, device = self.ids[-1], self.target.device
        history = self._history(sampling)
        first = None  # (token, probability) of the draft forward's token, on the device
        if self.forward:  # the LM head at the root drafts the first token; the heads continue it
            position = self.target.cache.length
            cache = self.partial.prepare(root) if self.partial is not None else self.target.cache
            logits, hidden = self.target.forward(torch.full((1,), root, device=device),
                                                 torch.full((1,), position, device=device), cache)  # fmt: skip
            probs = self._probs(logits[-1:], sampling, history)
            [[p]], [[token]] = probs.topk(1, dim=-1) if noise is None else noise.guess(probs, [len(self.ids)], 1)
            first, state, start, depth = (token, p), hidden[-1:], token[None], budget - 1
        elif self.state is None:
            return DraftTree.empty()
        else:
            state, start, depth = self.state, torch.full((1,), root, device=device), budget
        states = self.heads.start(state.to(self.target.dtype), self._embed(start))
        chained = self.heads.config.chain_input
        guesses = None if chained else self._product_guesses(states, depth, sampling, history)
        read = to_host(*(first or ()), *(guesses or ()))  # the first token and the guesses in one wait
        (token, p), guesses = (read[:2], read[2:]) if first else ((None, 1.0), read)
        below, below_p = ((token,), p) if first else ((), 1.0)
        if chained:
            paths = self._chained_paths(states, depth, budget, sampling, history, below, below_p, least_chance)
        else:
            paths = _product(*guesses, below, below_p) if guesses else {}
        return _tree(paths, self.table, budget, self.kind, start=below[0] if below else root, below=below,
                     below_p=below_p)  # fmt: skip

    def _product_guesses(self, states: torch.Tensor, depth: int, sampling: SamplingConfig,
                         history: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Heads that guess from the state alone ([3, 3, 3]): each level's top 3 drafting probabilities and target
        ids [levels, 3], on the device (None: no level fits the depth)."""
        guesses = []
        for i in range(min(depth, self.heads.config.gamma)):
            states, out = self.heads.step(i, states)
            guesses.append(out)
        if not guesses:
            return None
        return self._top(torch.cat(guesses), sampling, history)

    def _chained_paths(self, states: torch.Tensor, depth: int, budget: int, sampling: SamplingConfig,
                       history: torch.Tensor | None, below: tuple[int, ...], below_p: float,
                       least_chance: float) -> dict[tuple[int, ...], float]:  # fmt: skip
        """Heads that read their chain's tokens, a depth at a time: head i runs over the paths of depth i that
        rank among the `budget` best found so far and are at least `least_chance` likely (a child is no likelier
        than its parent), each reading its own last token, and adds their top 3."""
        paths, level = {}, [(below, below_p)]
        for i in range(min(depth, self.heads.config.gamma)):
            reads = self._embed(torch.tensor([path[-1] for path, _ in level], device=self.target.device)) if i else None
            states, out = self.heads.step(i, states, reads)
            values, tokens = to_host(*self._top(out, sampling, history))
            children = [(path + (t,), score * v, row) for row, (path, score) in enumerate(level)
                        for v, t in zip(values[row], tokens[row]) if v > 0]  # fmt: skip
            paths.update((path, score) for path, score, _ in children)
            cutoff = sorted(paths.values(), reverse=True)[: budget][-1] if paths else 1.0
            kept = [child for child in children if child[1] >= max(cutoff, least_chance)]
            if not kept:
                break
            level = [(path, score) for path, score, _ in kept]
            states = states[[row for _, _, row in kept]]
        return paths

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor | None:
        """The target's embeddings of `tokens` [n] (on the device), for heads that read tokens (cast by the heads)."""
        if not self.heads.config.root_input:
            return None
        return self.target.embed_tokens(tokens)

    def _top(self, guesses: torch.Tensor, sampling: SamplingConfig,
             history: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """The top 3 drafting probabilities and target ids [n, 3] of each head output in `guesses` [n, hidden],
        ranked inside the heads' draft vocabulary."""
        rows = None if history is None else history.expand(len(guesses), -1)
        return self.head.top(self.head(guesses), sampling, WIDTH, rows)

    def _probs(self, rows: torch.Tensor, sampling: SamplingConfig, history: torch.Tensor | None) -> torch.Tensor:
        """Drafting probabilities of the target's logits `rows` [n, vocab] under its sampling settings."""
        history = None if history is None else history.expand(len(rows), -1)
        return process_logits(rows, sampling, history, drafting=True).softmax(dim=-1)

    def _history(self, sampling: SamplingConfig) -> torch.Tensor | None:
        """The committed text's last tokens that the penalty reads [1, window] (each drafted row's history)."""
        if not sampling.uses_history:
            return None
        return to_device(self.ids[-sampling.penalty_window :], self.target.device)[None]


def _product(values: list[list[float]], tokens: list[list[int]], below: tuple[int, ...],
             below_p: float) -> dict[tuple[int, ...], float]:  # fmt: skip
    """Every path of the levels' candidates (row d: depth d's tokens and probabilities) below `below`, scored by
    the product of its probabilities along it (from `below_p`)."""
    paths, level = {}, [(below, below_p)]
    for row_values, row_tokens in zip(values, tokens):
        level = [(path + (t,), score * v) for path, score in level for v, t in zip(row_values, row_tokens) if v > 0]
        paths.update(level)
    return paths


def _tree(paths: dict[tuple[int, ...], float], table: NgramTable, budget: int, kind: str, *, start: int,
          below: tuple[int, ...], below_p: float) -> DraftTree:  # fmt: skip
    """The heads' `paths` (token tuples below the root, with their scores) merged with the 4-gram chains that
    continue `start`, cut to the `budget` most probable nodes. `below`: the LM head's token at the root when it
    drafted one (probability `below_p`), which the heads' paths and the chains hang from; else empty."""
    if budget < 1:
        return DraftTree.empty()
    candidates: dict[tuple[int, ...], tuple[float, str]] = {below: (below_p, kind)} if below else {}
    candidates.update({path: (score, kind) for path, score in paths.items()})
    grams = table.continuations(start)
    counts = [table.counts[(start, *rest)] for rest in grams]
    total = sum(counts)
    for rest, count in zip(grams, counts):
        for depth in range(1, len(rest) + 1):
            path = (*below, *rest[:depth])
            share = sum(c for r, c in zip(grams, counts) if r[:depth] == rest[:depth]) / total
            score = below_p * share
            if candidates.get(path, (-1.0,))[0] < score:
                candidates[path] = (score, candidates[path][1] if path in candidates else NGRAM)
    return DraftTree.best(candidates, budget)


fetch_checkpoint = download_heads  # the registry's download of a profile's published heads


def build(target: TargetView, checkpoint: Path, *, kv_budget: int | None = None,
          draft_forward: bool | None = None) -> TokenSwiftDrafter:  # fmt: skip
    """The registry's factory: the checkpoint's heads over `target`. They draft with a forward over a partial
    cache of `kv_budget` slots (default 4096; 0: the engine's full cache) where `draft_forward` says so; by
    default on a GPU, where that forward costs less than the verification, or when a `kv_budget` is given. A
    CPU's step is its weight read, which a draft forward would pay twice."""
    heads = load_heads(checkpoint, device=target.device, dtype=target.dtype, target_config=target.config)
    if draft_forward is None:
        draft_forward = target.device.type != "cpu" or kv_budget is not None
    return TokenSwiftDrafter(target, heads, kv_budget=KV_BUDGET if kv_budget is None else kv_budget,
                             forward=draft_forward)  # fmt: skip
