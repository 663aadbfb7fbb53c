"""EAGLE-3 drafting: the draft layer over the target's fused low / middle / high states, grown into a dynamic tree.

Every committed position p has a draft row: the target's features of p (handed over by the engine's forwards:
`feature_layers`) and the embedding of token p + 1. Rows run once, when the tokens after them are committed, and
keep their keys and values (`DraftKV`); the newest row's output guesses the root's children. A depth further, a
node's row reads its own token and, for the target's features it has none of, its parent row's output.

The tree is EAGLE-2's dynamic tree: each depth expands the `top_k` most probable nodes of the depth before
(by the product of the draft's probabilities along their path), each into its `top_k` most probable children, one
draft forward of `top_k` rows a depth, while those nodes hold a chance worth a forward; the tree kept is the
most probable nodes, at most the engine's budget, so a parent always outranks its children. Scores go to the
engine's adaptive budget (`scores_nodes`), which cuts the tree to what pays. The draft proposes deterministic nodes under sampling too: verification then draws from the
target itself wherever the children are not the drafter's samples, which is exact for any tree.
"""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import torch

from specchat.drafters import EAGLE3
from specchat.drafters.draft_head import draft_weights
from specchat.drafters.eagle3.model import Eagle3Draft, load_eagle3
from specchat.drafters.tree_rows import TreeRows
from specchat.engine.drafter import DraftsAlone, TargetView, TracksCommittedIds
from specchat.engine.sampling import SamplingConfig
from specchat.engine.tree import ROOT, DraftTree
from specchat.quant.quantize import quantized_copy

TOP_K = 4  # children per expanded node and nodes expanded per depth
DEPTH = 4  # tree depth: the root's children, then a draft forward per depth below them
MIN_DEPTH_CHANCE = 0.1  # the chance a depth's expanded nodes must hold together for the draft to run it
CATCH_UP = 512  # committed rows a draft forward runs at most (a prompt's)


class DraftKV:
    """The draft layer's keys and values of committed rows, in position order (a row missing where the engine
    reused target states the draft never saw: it attends to what it has), and after them a draft tree's rows,
    written in place so that a depth reads one view of the buffer instead of a copy of it."""

    def __init__(self, kv_heads: int, head_dim: int, *, dtype: torch.dtype, device: torch.device):
        self.keys = torch.zeros(kv_heads, 256, head_dim, dtype=dtype, device=device)
        self.values = torch.zeros_like(self.keys)
        self.positions: list[int] = []  # of the committed rows
        self.tree_rows = 0  # rows of the tree being drafted, after the committed ones

    def __len__(self) -> int:
        return len(self.positions)

    def append(self, keys: torch.Tensor, values: torch.Tensor, positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Commit rows of `positions` (a tree's rows are dropped); every row's keys and values, theirs last."""
        self.tree_rows = 0
        out = self.write(keys, values)
        self.positions += positions
        self.tree_rows = 0  # the rows written are committed ones now
        return out

    def write(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add tree rows [kv_heads, q, D]; the committed rows' and the tree's so far, these last (views)."""
        start = len(self) + self.tree_rows
        end = start + keys.shape[1]
        if end > self.keys.shape[1]:
            grown = max(2 * self.keys.shape[1], end)
            self.keys = torch.cat([self.keys[:, :start], self.keys.new_zeros(self.keys.shape[0], grown - start,
                                                                              self.keys.shape[2])], dim=1)  # fmt: skip
            self.values = torch.cat([self.values[:, :start], torch.zeros_like(self.keys[:, start:])], dim=1)
        self.keys[:, start:end] = keys
        self.values[:, start:end] = values
        self.tree_rows = end - len(self)
        return self.keys[:, :end], self.values[:, :end]

    def truncate(self, position: int) -> None:
        """Forget rows of positions >= `position`, and any tree's."""
        self.tree_rows = 0
        while self.positions and self.positions[-1] >= position:
            self.positions.pop()

    def nbytes(self) -> int:
        return 2 * self.keys.numel() * self.keys.element_size()


class Eagle3Drafter(DraftsAlone, TracksCommittedIds):
    kind = EAGLE3
    scores_nodes = True

    def __init__(self, target: TargetView, draft: Eagle3Draft, *, top_k: int = TOP_K, depth: int = DEPTH,
                 weights: str | None = "auto"):  # fmt: skip
        """`weights`: "int8" / "int4" / "q4_k" run the draft's linears quantized (a copy), None dense, "auto" as the
        target runs (quantized on a CPU whose target is)."""
        config = draft.config
        self.target = target
        self.feature_layers = config.layers_for(target.config.num_hidden_layers)
        draft = draft.to(device=target.device).eval()
        draft = draft.to(dtype=target.dtype)  # the d2t / t2d buffers stay integers
        self.draft = quantized_copy(draft.fused(), draft_weights(target, weights), dtype=target.dtype)
        self.draft_vocab = draft.draft_vocab
        self.top_k, self.depth = top_k, depth
        self.kv = DraftKV(config.num_key_value_heads, config.head_dim, dtype=target.dtype, device=target.device)
        self.ids: list[int] = []
        self.features = self._no_features()  # committed positions' target features not yet run as rows
        self.first_pending = 0  # the position of features[0]
        self.last: torch.Tensor | None = None  # the newest committed row's output: it guesses the root's children

    def prefill(self, ids: list[int], hidden: torch.Tensor, reused: int) -> None:
        before, pending, start = self.ids, self.features, self.first_pending
        kept = self.new_request(ids, reused)
        if kept and before[kept : kept + 1] != ids[kept : kept + 1]:
            kept -= 1  # the row of position kept - 1 read token kept, which this text changes
        self.kv.truncate(kept)
        self.features, self.first_pending = hidden, reused
        if kept == reused and start <= kept <= start + len(pending):  # rows not run yet of the kept text
            self.features, self.first_pending = torch.cat([pending[: kept - start], hidden]), start
        self._catch_up()  # the prompt's rows with their next token: its processing, not the first step's drafting

    def commit(self, tokens: list[int], hidden: torch.Tensor) -> None:
        self.ids += tokens
        self.features = torch.cat([self.features, hidden])

    @torch.inference_mode()
    def propose(self, budget: int, sampling: SamplingConfig, generator: torch.Generator) -> DraftTree:
        h = self._catch_up()
        if h is None or budget < 1:
            return DraftTree.empty()
        root = len(self.ids) - 1  # the root's position: rows of positions < root are in the draft's cache
        tree = TreeRows()  # which rows each sees; their keys and values follow the committed ones in `kv`
        self.kv.tree_rows = 0
        paths: dict[tuple[int, ...], tuple[float, str]] = {}
        frontier = [((), 0.0, ROOT, h)]  # (token path, log-probability, its row, the output its children read)
        for depth in range(1, min(self.depth, budget) + 1):
            outputs = torch.cat([node[3] for node in frontier])
            logprobs = self.draft.logits(outputs).float().log_softmax(dim=-1)
            best = logprobs.topk(min(self.top_k, logprobs.shape[1]), dim=-1)
            tokens = self.draft_vocab[best.indices].tolist()
            scores = (best.values + torch.tensor([node[1] for node in frontier], device=best.values.device)[:, None])
            candidates = []  # every child of the frontier: (path, log-probability, parent row)
            for (path, _, row, _), children, child_scores in zip(frontier, tokens, scores.tolist()):
                for token, score in zip(children, child_scores):
                    candidates.append((path + (token,), score, row))
                    paths[path + (token,)] = (math.exp(score), self.kind)
            if depth == min(self.depth, budget):
                break
            expanded = sorted(candidates, key=lambda c: -c[1])[: self.top_k]
            if sum(math.exp(score) for _, score, _ in expanded) < MIN_DEPTH_CHANCE:
                break  # a depth below nodes this unlikely adds less than its forward costs
            rows = tree.add([row for _, _, row in expanded])
            outputs = self._tree_forward([path[-1] for path, _, _ in expanded], root + depth - 1, tree, rows,
                                         [frontier_output(frontier, row) for _, _, row in expanded])  # fmt: skip
            frontier = [(path, score, new_row, outputs[i : i + 1])
                        for i, ((path, score, _), new_row) in enumerate(zip(expanded, rows))]  # fmt: skip
        return DraftTree.best(paths, budget)

    @torch.inference_mode()
    def _catch_up(self) -> torch.Tensor | None:
        """Run the committed rows the draft has not run whose next token is known (all of them once the root is
        committed), in blocks of `CATCH_UP` rows (a long prompt's mask stays small), and keep their keys and
        values; the newest row's output [1, H], which guesses the root's children (None before any row)."""
        device = self.target.device
        runnable = min(len(self.features), len(self.ids) - 1 - self.first_pending)
        for block in self.features[:runnable].split(CATCH_UP) if runnable > 0 else ():
            count, start = len(block), self.first_pending
            embeds = self.target.embed_tokens(torch.tensor(self.ids[start + 1 : start + count + 1], device=device))
            mask = torch.ones(count, len(self.kv) + count, dtype=torch.bool, device=device)
            mask[:, len(self.kv) :].tril_()
            positions = torch.arange(start, start + count, device=device)
            write = partial(self.kv.append, positions=positions.tolist())
            out = self.draft(self.draft.fc(block), embeds, positions, write, mask)
            self.first_pending += count
            self.last = out[-1:]
        self.features = self.features[runnable:]
        return self.last

    def _tree_forward(self, tokens: list[int], position: int, tree: TreeRows, rows: list[int],
                      parents: list[torch.Tensor]) -> torch.Tensor:  # fmt: skip
        """Outputs [rows, H] of tree rows at `position` reading `tokens` and their parents' outputs: they see the
        committed rows, their ancestors' rows and themselves."""
        device = self.target.device
        embeds = self.target.embed_tokens(torch.tensor(tokens, device=device))
        seen = tree.seen(rows).to(device)  # [rows, tree rows]: ancestors and themselves, the new rows last
        mask = torch.cat([torch.ones(len(rows), len(self.kv), dtype=torch.bool, device=device), seen], dim=1)
        positions = torch.full((len(rows),), position, device=device)
        return self.draft(torch.cat(parents), embeds, positions, self.kv.write, mask)

    def _no_features(self) -> torch.Tensor:
        width = len(self.feature_layers) * self.target.config.hidden_size
        return torch.empty(0, width, dtype=self.target.dtype, device=self.target.device)

    def memory_bytes(self) -> int:
        """What the draft holds besides its weights: its keys and values of every committed row."""
        return self.kv.nbytes()


def frontier_output(frontier, row: int) -> torch.Tensor:
    """The output a child of the frontier node at tree row `row` reads."""
    return next(node[3] for node in frontier if node[2] == row)


def build(target: TargetView, checkpoint: Path | str) -> Eagle3Drafter:
    """The registry's factory: the EAGLE-3 draft at `checkpoint` (a directory, or a Hugging Face repo id)."""
    return Eagle3Drafter(target, load_eagle3(_directory(checkpoint), target.config))


def _directory(checkpoint: Path | str) -> Path:
    path = Path(checkpoint)
    if path.is_dir():
        return path
    from specchat.drafters import fetch_published

    return fetch_published(str(checkpoint))
