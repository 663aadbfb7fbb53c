"""TokenSwift: the target drafts for itself. One target forward of the root over a partial KV cache gives
the LM head's next-token distribution and, through gamma = 3 heads (`models/tokenswift.py`), guesses for
the three tokens after it; the most frequent 4-grams of the text that start with the drafted token
(`ngram_table.py`) are added as branches.

The tree is TokenSwift's [1, 3, 3, 3]: the LM head's top token, then the top 3 of each head under every
node of the level above (40 nodes), merged with the n-gram chains (siblings distinct). Where the engine's
budget is smaller, the nodes kept are the most probable: a node's score is the product of its drafting
probabilities along its path (an n-gram chain's share of its first token's 4-gram counts stands for the
heads' probabilities), so a parent always outranks its children. Drafting probabilities are the target's
processed ones (penalty, temperature, min-p ...) with the committed text as history, as TokenSwift drafts.
Verification reads the full cache, so none of this can change the output, only its speed.

Without the draft forward (`forward=False`, the default on a CPU) the heads draft from the state the last
verification already computed, the one that predicted the root, as Medusa's heads do: the tree is [3, 3, 3]
under the root and the 4-grams continue the root. It costs no target forward, which on a CPU costs a whole
read of the weights, about what the verification itself costs; the draft forward pays where a long context's
attention is most of a step, and the partial cache skips most of it (a GPU at 100K tokens).
"""

from __future__ import annotations

from pathlib import Path

import torch

from specchat.drafters.base import TargetView
from specchat.drafters.draft_head import DraftHead, draft_weights
from specchat.drafters.ngram_table import NgramTable
from specchat.drafters.partial_kv import PartialKV
from specchat.engine.sampling import SamplingConfig, process_logits
from specchat.engine.tree import ROOT, DraftTree, TreeBuilder
from specchat.models.tokenswift import TokenSwiftHeads, download_heads, load_heads
from specchat.quant.quantize import quantize_linears

KV_BUDGET = 4096  # TokenSwift's partial cache B; 0 drafts over the full cache
WIDTH = 3  # candidates per head (the [1, 3, 3, 3] tree)
NGRAM = "ngram"  # the origin of the nodes its n-gram reuse adds


class TokenSwiftDrafter:
    kind = "tokenswift"  # the registry name: the chat colours its tokens by it

    def __init__(self, target: TargetView, heads: TokenSwiftHeads, *, kv_budget: int = KV_BUDGET,
                 forward: bool = True, lag: int = 1024):  # fmt: skip
        """`forward`: draft the root's own token with a target forward over `kv_budget` slots of its cache
        (0: the engine's full cache); else the heads alone, from the last verified state."""
        self.target, self.heads = target, heads.to(target.device, target.dtype)
        weights = draft_weights(target)
        if weights:  # on a CPU each draft reads the heads anew after the target's step evicted them: half the bytes
            quantize_linears(self.heads, weights, dtype=target.dtype)
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
    def propose(self, budget: int, sampling: SamplingConfig, generator=None) -> DraftTree:
        if budget < 1:
            return DraftTree.empty()
        root = self.ids[-1]
        first = None
        if self.forward:  # the LM head at the root drafts the first token; the heads continue it
            position = self.target.cache.length
            cache = self.partial.prepare(root) if self.partial is not None else self.target.cache
            logits, hidden = self.target.forward(torch.tensor([root], device=self.target.device),
                                                 torch.tensor([position], device=self.target.device), cache)  # fmt: skip
            p, token = self._probs(logits[-1:], sampling)[0].max(dim=0)
            first = (int(token), float(p))
            probs = self._probs(self._head_logits(hidden[-1:], first[0], budget - 1), sampling)
        elif self.state is None:
            return DraftTree.empty()
        else:
            probs = self._probs(self._head_logits(self.state, root, budget), sampling)
        vocab = self.head.draft_vocab
        top = (probs if vocab is None else probs[:, vocab]).topk(WIDTH, dim=-1)  # the heads rank their vocabulary
        tokens = top.indices if vocab is None else vocab[top.indices]
        return _tree(top.values.tolist(), tokens.tolist(), self.table, budget, self.kind, root=root, first=first)

    def _probs(self, rows: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
        """Drafting probabilities of logits `rows`: the target's sampling settings, the committed text as history."""
        history = None
        if sampling.uses_history:
            history = torch.tensor(self.ids[-sampling.penalty_window :])[None].expand(len(rows), -1)
        return process_logits(rows, sampling, history).softmax(dim=-1)

    def _head_logits(self, state: torch.Tensor, root: int, depth: int | None = None) -> torch.Tensor:
        """[depth, vocab]: the first `depth` heads' logits (default all: a tree of n nodes is at most n deep) of
        one state [1, hidden] whose next token is `root`, -inf outside their draft vocabulary."""
        embedded = None
        if self.heads.config.root_input:
            embedded = self.target.embed_tokens(torch.tensor([root], device=self.target.device))  # cast by the heads
        guesses = self.heads(state.to(self.target.dtype), embedded, depth).to(state.dtype)[:, 0]  # [depth, hidden]
        scores = self.head(guesses)
        if self.head.draft_vocab is None:
            return scores
        full = scores.new_full((len(scores), self.head.vocab_size), float("-inf"))
        return full.index_copy_(1, self.head.draft_vocab, scores)


def _tree(values: list[list[float]], tokens: list[list[int]], table: NgramTable, budget: int, kind: str, *,
          root: int, first: tuple[int, float] | None = None) -> DraftTree:  # fmt: skip
    """The heads' candidates (row d: the top 3 tokens and probabilities of depth d's head) as a tree, 3 wide at
    every depth, merged with 4-gram chains and cut to the `budget` most probable nodes. With `first` (the LM
    head's token at the root and its probability) the heads' levels hang below that one node ([1, 3, 3, 3])
    and the chains continue it; without, the heads' levels start at the root ([3, 3, 3]) and the chains
    continue the root."""
    if budget < 1:
        return DraftTree.empty()
    if first is None:
        start, below, below_p = root, (), 1.0
        candidates: dict[tuple[int, ...], tuple[float, str]] = {}
    else:
        start, below_p = first
        below = (start,)
        candidates = {below: (below_p, kind)}
    level = [(below, below_p)]
    for row_values, row_tokens in zip(values, tokens):
        level = [(path + (t,), score * v) for path, score in level for v, t in zip(row_values, row_tokens) if v > 0]
        candidates.update({path: (score, kind) for path, score in level})
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
    chosen = sorted(candidates, key=lambda path: (-candidates[path][0], len(path)))[:budget]
    builder = TreeBuilder()
    nodes: dict[tuple[int, ...], int] = {}
    for path in sorted(chosen, key=len):
        if path[:-1] and path[:-1] not in nodes:
            continue  # its parent was cut (equal scores ranked a child first)
        nodes[path] = builder.add(nodes[path[:-1]] if path[:-1] else ROOT, path[-1], candidates[path][1])
    return builder.build()


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
