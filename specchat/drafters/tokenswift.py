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
"""

from __future__ import annotations

from pathlib import Path

import torch

from specchat.drafters.base import TargetView
from specchat.drafters.ngram_table import NgramTable
from specchat.drafters.partial_kv import PartialKV
from specchat.engine.sampling import SamplingConfig, process_logits
from specchat.engine.tree import ROOT, DraftTree, TreeBuilder
from specchat.models.tokenswift import TokenSwiftHeads, download_heads, load_heads

KV_BUDGET = 4096  # TokenSwift's partial cache B; 0 drafts over the full cache
WIDTH = 3  # candidates per head (the [1, 3, 3, 3] tree)
NGRAM = "ngram"


class TokenSwiftDrafter:
    kind = "tokenswift"  # the registry name: the chat colours its tokens by it

    def __init__(self, target: TargetView, heads: TokenSwiftHeads, *, kv_budget: int = KV_BUDGET, lag: int = 1024):
        self.target, self.heads = target, heads.to(target.device)
        self.partial = PartialKV(target, kv_budget) if kv_budget else None
        self.table = NgramTable(lag=lag)
        self.ids: list[int] = []  # the committed ids of the request (the table reads them)

    def prefill(self, ids: list[int], hidden=None, reused: int = 0) -> None:
        """Keep the n-gram table when `ids` go on from the text it has read (a book's refill drops its oldest
        tokens but continues the same text), else read `ids` afresh."""
        overlap = min(len(ids), len(self.ids), 64)
        continues = overlap > 0 and ids[-overlap:] == self.ids[-overlap:] and len(ids) <= len(self.ids)
        if not continues:
            self.table = NgramTable(lag=self.table.lag)
            self.table.add(ids)
        self.ids = list(ids)
        if self.partial is not None:
            self.partial.truncate(0)

    def commit(self, tokens: list[int], hidden=None) -> None:
        self.ids += tokens
        self.table.add(tokens)

    @torch.inference_mode()
    def propose(self, budget: int, sampling: SamplingConfig, generator=None) -> DraftTree:
        root, position = self.ids[-1], self.target.cache.length
        cache = self.partial.prepare(root) if self.partial is not None else self.target.cache
        logits, hidden = self.target.forward(torch.tensor([root], device=self.target.device),
                                             torch.tensor([position], device=self.target.device), cache)  # fmt: skip
        head_logits = self.target.lm_head(self.heads(hidden[-1:].to(self.heads_dtype)).to(hidden.dtype))[:, 0]
        history = None
        if sampling.uses_history:
            history = torch.tensor(self.ids[-sampling.penalty_window :])[None].expand(1 + len(head_logits), -1)
        probs = process_logits(torch.cat([logits[-1:], head_logits]), sampling, history).softmax(dim=-1)
        return _tree(probs, self.table, budget, self.kind)

    @property
    def heads_dtype(self) -> torch.dtype:
        return next(self.heads.parameters()).dtype


def _tree(probs: torch.Tensor, table: NgramTable, budget: int, kind: str) -> DraftTree:
    """The [1, 3, 3, 3] tree of `probs` (row 0: the LM head, rows 1..: the heads) merged with the 4-gram
    chains of its first token, cut to the `budget` most probable nodes."""
    if budget < 1:
        return DraftTree.empty()
    first_p, first = probs[0].max(dim=0)
    first, first_p = int(first), float(first_p)
    top = [probs[row].topk(WIDTH) for row in range(1, len(probs))]
    candidates: dict[tuple[int, ...], tuple[float, str]] = {(first,): (first_p, kind)}
    level = [((first,), first_p)]
    for values, tokens in top:
        level = [(path + (int(t),), score * float(v)) for path, score in level for v, t in zip(values, tokens)]
        candidates.update({path: (score, kind) for path, score in level})
    grams = table.continuations(first)
    counts = [table.counts[(first, *rest)] for rest in grams]
    total = sum(counts)
    for rest, count in zip(grams, counts):
        for depth in range(1, len(rest) + 1):
            path = (first, *rest[:depth])
            share = sum(c for r, c in zip(grams, counts) if r[:depth] == rest[:depth]) / total
            score = first_p * share
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


def build(target: TargetView, checkpoint: Path, *, kv_budget: int = KV_BUDGET) -> TokenSwiftDrafter:
    """The registry's factory: the checkpoint's heads over `target`, drafting over a partial cache of
    `kv_budget` slots (0: the engine's full cache)."""
    heads = load_heads(checkpoint, device=target.device, dtype=target.dtype, target_config=target.config)
    return TokenSwiftDrafter(target, heads, kv_budget=kv_budget)
