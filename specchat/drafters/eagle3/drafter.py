"""EAGLE-3 drafting: the draft layer over the target's fused low / middle / high states, grown into a dynamic tree.

Every committed position p has a draft row: the target's features of p (handed over by the engine's forwards:
`feature_layers`) and the embedding of token p + 1. Rows run once, when the tokens after them are committed, and
keep their keys and values (`DraftKV`); the newest row's output guesses the root's children. A depth further, a
node's row reads its own token and, for the target's features it has none of, its parent row's output. On a CPU
a forward's rows and their logits run in one call of the compiled CPU decoder (`native.py`), elsewhere as torch
operations (`Eagle3Draft`).

The tree is EAGLE-2's dynamic tree: each depth expands the `top_k` most probable nodes of the depth before
(by the product of the draft's probabilities along their path; fewer where the budget cannot keep a child of
more, and none less likely than the engine's least chance worth verifying), each into its `top_k` most probable
children, one draft forward of those rows a depth, while they hold a chance worth a forward; the tree kept is
the most probable nodes, at most the engine's budget, so a parent always outranks its children. Scores go to the
engine's adaptive budget (`scores_nodes`), which cuts the tree to what pays. The draft proposes deterministic
nodes under sampling too: verification then draws from the target itself wherever the children are not the
drafter's samples, which is exact for any tree. On a GPU the depths expand whatever their nodes hold, read from
tensors alone (the root's position and the draft cache's length on the device), and replay one CUDA graph per
budget.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from specchat.drafters import EAGLE3
from specchat.drafters.draft_head import draft_weights
from specchat.drafters.eagle3.model import Eagle3Draft, load_eagle3
from specchat.drafters.eagle3.native import native_eagle3
from specchat.drafters.tree_rows import TreeRows
from specchat.engine.cuda_graphs import capture
from specchat.engine.drafter import DraftsAlone, TargetView, TracksCommittedIds
from specchat.engine.host_data import to_device, to_host
from specchat.engine.keyed_draws import PositionNoise
from specchat.engine.sampling import SamplingConfig
from specchat.engine.tree import ROOT, DraftTree, Ranked, best_first
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
        self.length = torch.zeros(1, dtype=torch.long, device=device)  # how many, as a CUDA graph reads it
        self.tree_rows = 0  # rows of the tree being drafted, after the committed ones

    def __len__(self) -> int:
        return len(self.positions)

    def reserve(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The buffers [kv_heads, slots, D], with room for `rows` more after the committed and tree rows."""
        used = len(self) + self.tree_rows
        if used + rows > self.keys.shape[1]:
            size = max(2 * self.keys.shape[1], used + rows)
            self.keys, self.values = (torch.cat([t[:, :used], t.new_zeros(t.shape[0], size - used, t.shape[2])], dim=1)
                                      for t in (self.keys, self.values))  # fmt: skip
        return self.keys, self.values

    def write(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Put rows [kv_heads, q, D] after the committed and tree rows; every row's keys and values up to
        them (views). `added` says what they were."""
        start = len(self) + self.tree_rows
        self.reserve(keys.shape[1])
        self.keys[:, start : start + keys.shape[1]] = keys
        self.values[:, start : start + keys.shape[1]] = values
        return self.keys[:, : start + keys.shape[1]], self.values[:, : start + keys.shape[1]]

    def added(self, rows: int, committed: list[int] | None) -> None:
        """`rows` rows were written after the committed and tree rows: committed ones at positions `committed`
        (a tree's rows dropped first), or the tree's (None)."""
        if committed is None:
            self.tree_rows += rows
        else:
            self.positions += committed
            self.tree_rows = 0
            self.length.fill_(len(self.positions))  # a queued fill: no wait for the device

    def truncate(self, position: int) -> None:
        """Forget rows of positions >= `position`, and any tree's."""
        self.tree_rows = 0
        while self.positions and self.positions[-1] >= position:
            self.positions.pop()
        self.length.fill_(len(self.positions))

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
        # Read each depth's best nodes to expand only those that can pay: free on a CPU, a wait on a GPU.
        self.prunes = target.device.type == "cpu"
        self.native = native_eagle3(self.draft, target.device)  # None: the layer runs as torch operations
        self.kv = DraftKV(config.num_key_value_heads, config.head_dim, dtype=target.dtype, device=target.device)
        self.ids: list[int] = []
        self.features = self._no_features()  # committed positions' target features not yet run as rows
        self.first_pending = 0  # the position of features[0]
        self.last: tuple[torch.Tensor, torch.Tensor] | None = None  # the newest committed row's output, logits
        self.root = torch.zeros(1, dtype=torch.long, device=target.device)  # the root's position, as a graph reads it
        self.uses_graphs = target.device.type == "cuda"  # the depths replay CUDA graphs (`_replay`)
        self.graphs: dict[int, tuple] = {}  # per budget: (CUDA graph, its ranked nodes, its input buffers)
        self.graph_keys: torch.Tensor | None = None  # the draft cache's keys the graphs read
        self.graph_pool = torch.cuda.graph_pool_handle() if target.device.type == "cuda" else None

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
    def propose(self, budget: int, sampling: SamplingConfig, least_chance: float = 0.0,
                noise: PositionNoise | None = None) -> DraftTree:  # fmt: skip
        """Each depth is queued from the last one's tensors. Where the drafter `prunes` (a CPU, where reading costs
        nothing), each depth reads its best nodes to expand only those that can pay, and the host ranks the
        candidates; a GPU expands them whatever they hold, which costs it less than waiting for them, ranks them
        on the device, where the tree stays until the target's choices are read, and replays its depths as a
        CUDA graph per budget (`_replay`)."""
        newest = self._catch_up()
        if newest is None or budget < 1:
            return DraftTree.empty()
        if self.prunes:
            return self._pruned(budget, newest, least_chance)
        self.root.fill_(len(self.ids) - 1)  # the buffers the depths read (queued fills: no wait for the device)
        self.kv.reserve(self.depth * self.top_k)  # room for the tree's rows after the committed ones
        if self.uses_graphs:
            ranked = self._replay(budget, *newest)
        else:
            ranked = self._ranked(budget, *newest)
        return ranked.tree(self.kind, min(self.depth, budget))

    def _pruned(self, budget: int, newest: tuple[torch.Tensor, torch.Tensor], least_chance: float) -> DraftTree:
        """The tree grown on the host's terms: each depth's rows at host positions, its nodes read to expand only
        those worth a row, the candidates ranked by the host."""
        root = len(self.ids) - 1  # the root's position: rows of positions < root are in the draft's cache
        self.kv.tree_rows = 0

        def run(hidden: torch.Tensor, tokens: torch.Tensor, depth: int, seen: torch.Tensor):
            return self._rows(hidden, tokens, root + depth - 1, seen)

        tokens, parents, logprobs, _ = self._grow(budget, *newest, run, least_chance)
        (ids, above), logprobs = to_host(torch.stack([tokens, parents]), logprobs)
        paths, keys = {}, []  # each candidate's token path below the root
        for token, parent, logprob in zip(ids, above, logprobs):
            keys.append((keys[parent] if parent != ROOT else ()) + (token,))
            paths[keys[-1]] = (math.exp(logprob), self.kind)
        return DraftTree.best(paths, budget)

    def _ranked(self, budget: int, outputs: torch.Tensor, logits: torch.Tensor) -> Ranked:
        """The `budget` most probable candidates, ranked on the device from tensors alone (the root's position and
        the committed rows' count read there): what a graph captures."""
        tokens, parents, logprobs, counts = self._grow(budget, outputs, logits, self._tree_depth)
        depths = torch.cat([torch.full((count,), depth, device=tokens.device) for depth, count in enumerate(counts, 1)])
        return best_first(tokens, parents, logprobs.double().exp(), depths, min(budget, len(depths)))

    def _replay(self, budget: int, outputs: torch.Tensor, logits: torch.Tensor) -> Ranked:
        """`_ranked`'s nodes from its graph for this budget, captured on first use from buffers each replay copies
        the newest row's output and logits into; graphs are dropped when the draft's cache grows."""
        if self.graph_keys is not self.kv.keys:  # its buffers allocated anew
            self.graphs, self.graph_keys = {}, self.kv.keys
        if budget not in self.graphs:
            inputs = (outputs.clone(), logits.clone())
            self.graphs[budget] = (*capture(lambda: self._ranked(budget, *inputs), self.graph_pool), inputs)
        graph, out, inputs = self.graphs[budget]
        for buffer, value in zip(inputs, (outputs, logits)):
            buffer.copy_(value)
        graph.replay()
        return out.copy()

    def _grow(self, budget: int, outputs: torch.Tensor, logits: torch.Tensor, run, least_chance: float | None = None):
        """The candidates of a tree of `budget` nodes below the newest row's `outputs` [1, H] and `logits`: their
        tokens, parents and log-probabilities [c], and how many each depth has. `run(hidden, tokens, depth, seen)`
        runs a depth's rows; with a `least_chance`, each depth reads its best nodes to expand only those that can
        pay."""
        device = self.target.device
        tree = TreeRows(device=device)  # which rows each sees
        scores = torch.zeros(1, device=device)  # the frontier's log-probabilities [F]
        frontier = torch.full((1,), ROOT, device=device)  # the frontier's candidates (ROOT: the root)
        rows: range | None = None  # the frontier's tree rows (None: the root, no row)
        tokens, logprobs, parents = [], [], []  # per depth [F * top_k]: every child of the frontier
        counts = []  # per depth: how many
        deepest = min(self.depth, budget)
        for depth in range(1, deepest + 1):
            best = logits.float().log_softmax(dim=-1).topk(min(self.top_k, logits.shape[1]), dim=-1)
            first, width = sum(len(t) for t in tokens), best.indices.shape[1]
            tokens.append(self.draft_vocab[best.indices].flatten())
            logprobs.append((best.values + scores[:, None]).flatten())
            parents.append(frontier[:, None].expand(-1, width).flatten())
            counts.append(tokens[-1].shape[0])
            if depth == deepest:
                break
            # A node ranked below budget - depth at its depth has no child in the tree kept: the nodes ranked above
            # it, its ancestors, itself and its child would be more than the budget.
            chosen = logprobs[-1].topk(min(self.top_k, budget - depth, len(logprobs[-1]))).indices
            if least_chance is not None:  # nor has a node less likely than `least_chance` a child worth verifying
                chances = logprobs[-1][chosen].exp()
                kept = int((chances >= least_chance).sum())
                if not kept or float(chances[:kept].sum()) < MIN_DEPTH_CHANCE:
                    break  # a depth below nodes this unlikely adds less than its forward costs
                chosen = chosen[:kept]
            parent = chosen // width  # each chosen node's parent in the frontier
            rows = tree.add([ROOT] * len(chosen) if rows is None else parent + rows.start)
            outputs, logits = run(outputs[parent], tokens[-1][chosen], depth, tree.seen(rows))
            scores, frontier = logprobs[-1][chosen], chosen + first
        return torch.cat(tokens), torch.cat(parents), torch.cat(logprobs), counts

    def _tree_depth(self, hidden: torch.Tensor, tokens: torch.Tensor, depth: int,
                    seen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """A depth of tree rows (`_rows`' tree rows) from tensors alone: at the root's position + depth - 1
        (`root`), their keys and values written after the committed rows (`DraftKV.length`) and the tree's rows
        before them, each attending over the whole buffer, masked to the committed rows and the tree rows `seen`
        [q, tree rows so far] marks."""
        kv, count = self.kv, len(tokens)
        tree_rows = seen.shape[1]
        slots = torch.arange(kv.keys.shape[1], device=tokens.device) - kv.length  # each slot's tree row, if any
        mask = (slots < 0) | (seen[:, slots.clamp(0, tree_rows - 1)] & (slots < tree_rows))
        written = kv.length + torch.arange(tree_rows - count, tree_rows, device=tokens.device)

        def write(keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            kv.keys.index_copy_(1, written, keys)
            kv.values.index_copy_(1, written, values)
            return kv.keys, kv.values

        positions = (self.root + depth - 1).expand(count)
        outputs = self.draft(hidden, self.target.embed_tokens(tokens), positions, write, mask)
        return outputs, self.draft.logits(outputs)

    @torch.inference_mode()
    def _catch_up(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Run the committed rows the draft has not run whose next token is known (all of them once the root is
        committed), in blocks of `CATCH_UP` rows (a long prompt's mask stays small), and keep their keys and
        values; the newest row's output [1, H], which its children read, and its logits, which guess the root's
        children (None before any row)."""
        runnable = min(len(self.features), len(self.ids) - 1 - self.first_pending)
        start = self.first_pending
        tokens = to_device(self.ids[start + 1 : start + runnable + 1], self.target.device)
        for block, ids in zip(self.features[:runnable].split(CATCH_UP), tokens.split(CATCH_UP)) if runnable > 0 else ():
            self.last = self._rows(self.draft.fc(block), ids, self.first_pending)
            self.first_pending += len(block)
        self.features = self.features[runnable:]
        return self.last

    def _rows(self, hidden: torch.Tensor, tokens: torch.Tensor, position: int,
              tree_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Run rows reading `hidden` [q, H] and `tokens` [q], their keys and values kept: committed rows at
        `position`, `position` + 1, ... (no `tree_mask`: each sees the committed rows and those before it; the last
        row's output and logits returned) or a depth of tree rows, all at `position` (`tree_mask` [q, tree rows so
        far + q]: each sees the committed rows and the tree rows it marks; every row's outputs [q, H] and logits)."""
        committed = tree_mask is None
        if committed:
            self.kv.tree_rows = 0
        embeds = self.target.embed_tokens(tokens)
        prefix, count, device = len(self.kv), len(tokens), self.target.device
        positions = torch.arange(position, position + count, device=device) if committed else torch.full(
            (count,), position, device=device)  # fmt: skip
        if self.native is not None:
            keys, values = self.kv.reserve(count)
            outputs, logits = self.native(hidden, embeds, positions, keys, values, prefix, tree_mask, committed)
        else:
            mask = torch.ones(count, prefix + self.kv.tree_rows + count, dtype=torch.bool, device=hidden.device)
            if committed:
                mask[:, prefix:].tril_()
            else:
                mask[:, prefix:] = tree_mask
            outputs = self.draft(hidden, embeds, positions, self.kv.write, mask)
            logits = self.draft.logits(outputs[-1:] if committed else outputs)
        self.kv.added(count, list(range(position, position + count)) if committed else None)
        return (outputs[-1:], logits) if committed else (outputs, logits)

    def _no_features(self) -> torch.Tensor:
        width = len(self.feature_layers) * self.target.config.hidden_size
        return torch.empty(0, width, dtype=self.target.dtype, device=self.target.device)

    def memory_bytes(self) -> int:
        """What the draft holds besides its weights: its keys and values of every committed row."""
        return self.kv.nbytes()


def build(target: TargetView, checkpoint: Path | str) -> Eagle3Drafter:
    """The registry's factory: the EAGLE-3 draft at `checkpoint` (a directory, or a Hugging Face repo id)."""
    return Eagle3Drafter(target, load_eagle3(_directory(checkpoint), target.config))


def _directory(checkpoint: Path | str) -> Path:
    path = Path(checkpoint)
    if path.is_dir():
        return path
    from specchat.drafters import fetch_published

    return fetch_published(str(checkpoint))
