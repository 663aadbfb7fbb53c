"""TokenSwift: the target drafts for itself. One target forward of the root over a partial KV cache gives
the LM head's next-token distribution and, through gamma = 3 heads (`drafters/tokenswift/model.py`), guesses for
the three tokens after it; the most frequent 4-grams of the text that start with the drafted token
(`ngram_table.py`, looked up on the device by `device_ngrams.py`) are added as branches.

The tree is TokenSwift's [1, 3, 3, 3]: the LM head's top token, then the top 3 of each head under every
node of the level above (40 nodes), merged with the n-gram chains (siblings distinct). Where the engine's
budget is smaller, the nodes kept are the most probable: a node's score is the product of its drafting
probabilities along its path (an n-gram chain's share of its first token's 4-gram counts stands for the
heads' probabilities), so a parent always outranks its children. Drafting probabilities are the target's
processed ones (penalty, temperature, min-p ...) with the committed text as history, as TokenSwift drafts.
Verification reads the full cache, so none of this can change the output, only its speed. On a GPU the tree is
laid out on the device (`heads_tree.py`), the heads and the layout replayed as one CUDA graph: a proposal waits
for nothing, and its tree is read with the target's choices; on a CPU, where a read costs nothing, the host lays
out the same tree in less time.

Heads that read their chain's tokens (`chain_input`) guess a node's children from that node's own token, so
their levels are not one product: they run a depth at a time, head i + 1 over the depth-i nodes likeliest by
their scores (as many as the budget could keep with a child), each reading its own token, and each such node
gets its own top 3.

Without the draft forward (`forward=False`, the default on a CPU) the heads draft from the state the last
verification already computed, the one that predicted the root, as Medusa's heads do: the tree is [3, 3, 3]
under the root and the 4-grams continue the root. It costs no target forward, which on a CPU costs a whole
read of the weights, about what the verification itself costs; the draft forward pays where a long context's
attention is most of a step, and the partial cache skips most of it (a GPU at 100K tokens).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import torch

from specchat.drafters import TOKENSWIFT
from specchat.drafters.draft_head import DraftHead, draft_weights
from specchat.drafters.tokenswift.device_ngrams import DeviceNgrams
from specchat.drafters.tokenswift.heads_tree import Level, deepest, heads_tree, host_tree, product_levels
from specchat.drafters.tokenswift.model import TokenSwiftHeads, download_heads, load_heads
from specchat.drafters.tokenswift.ngram_table import NgramTable
from specchat.drafters.tokenswift.partial_kv import PartialKV
from specchat.engine.cuda_graphs import capture
from specchat.engine.drafter import TargetView
from specchat.engine.host_data import to_device
from specchat.engine.keyed_draws import PositionNoise, guess_keyed
from specchat.engine.sampling import SamplingConfig, process_logits
from specchat.engine.tree import DraftTree, Ranked
from specchat.quant.quantize import quantized_copy

KV_BUDGET = 4096  # TokenSwift's partial cache B; 0 drafts over the full cache
WIDTH = 3  # candidates per head (the [1, 3, 3, 3] tree)
NGRAM = "ngram"  # the origin of the nodes its n-gram reuse adds
NGRAM_ROWS = 1024  # first tokens the device's n-gram copy has room for before it grows (0.65 MB; graphs recaptured)
Below = tuple[torch.Tensor, torch.Tensor]  # the draft forward's token and its probability, [1] each


class TokenSwiftDrafter:
    kind = TOKENSWIFT  # the registry name: the chat colours its tokens by it
    scores_nodes = True
    feature_layers = ()  # the target's last state

    def __init__(self, target: TargetView, heads: TokenSwiftHeads, *, kv_budget: int = KV_BUDGET,
                 forward: bool = True, lag: int = 1024, weights: str | None = "auto",
                 device_layout: bool | None = None):  # fmt: skip
        """`forward`: draft the root's own token with a target forward over `kv_budget` slots of its cache
        (0: the engine's full cache); else the heads alone, from the last verified state. `weights`: "int8" /
        "int4" / "q4_k" run the heads and the reduced head quantized (on a CPU each draft reads them anew after the
        target's step evicted them), None dense, "auto" as the target runs (quantized on a CPU whose target is).
        `device_layout`: lay the tree out on the device (`heads_tree`), left there unread, or on the host
        (`host_tree`, the same tree); None: on the device unless it is a CPU, where a read costs nothing."""
        weights = draft_weights(target, weights)
        self.target = target
        self.heads = quantized_copy(heads.to(target.device, target.dtype), weights, dtype=target.dtype)
        self.head = DraftHead(target, heads.draft_vocab, weights)
        self.forward = forward
        self.partial = PartialKV(target, kv_budget) if forward and kv_budget else None
        self.device_layout = target.device.type != "cpu" if device_layout is None else device_layout
        self.table = NgramTable(lag=lag)
        # the table's copy on the device where the tree is laid out there, kept from text to text
        self.ngrams = (DeviceNgrams(self.table, target.device, tokens=target.config.vocab_size, rows=NGRAM_ROWS)
                       if self.device_layout else None)  # fmt: skip
        self.ids: list[int] = []  # the committed ids of the request (the table reads them)
        self.state: torch.Tensor | None = None  # the target's last state of the committed text: it predicted the root
        # the key of the target's draw of the draft forward's token (`PositionNoise.key`), filled each proposal
        self.noise_key = torch.zeros(1, 1, dtype=torch.long, device=target.device)
        self.uses_graphs = target.device.type == "cuda"  # the heads and the layout replay CUDA graphs (`_graphed`)
        self.graphs: dict[tuple, tuple] = {}  # (budget, sampling but its seed, penalised, guesses) -> graph, ...
        self.graphs_read: tuple[torch.Tensor, ...] = ()  # the n-gram lookup's tensors the graphs read
        self.graph_pool = torch.cuda.graph_pool_handle() if target.device.type == "cuda" else None

    def prefill(self, ids: list[int], hidden=None, reused: int = 0) -> None:
        """Keep the n-gram table when `ids` go on from the text it has read (a book's refill drops its oldest
        tokens but continues the same text), else read `ids` afresh."""
        overlap = min(len(ids), len(self.ids), 64)
        continues = overlap > 0 and ids[-overlap:] == self.ids[-overlap:] and len(ids) <= len(self.ids)
        if not continues:
            self.table = NgramTable(lag=self.table.lag)
            self.table.add(ids)
            if self.ngrams is not None:  # its tensors kept: the graphs that read them too
                self.ngrams.follow(self.table)
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
    def propose(self, budget: int, sampling: SamplingConfig, least_chance: float = 0.0,
                noise: PositionNoise | None = None) -> DraftTree:
        """The tree laid out on the device (`heads_tree.py`) and left there (a GPU's, the heads and the layout
        replayed as a CUDA graph where `_graphed`): its first token, the heads' guesses and the 4-grams that continue
        it are read with the target's choices; or laid out by the host from them, read in one wait (a CPU's). The
        heads run rows of known counts, so `least_chance` prunes nothing here: the engine cuts the tree by its
        scores after.

        Where the target samples (`noise`), the draft forward's token is its guess at the target's keyed draw (the
        target's own distribution, over a partial cache), while the heads keep their likeliest tokens: a head
        guesses a token a few places on from a state that has not seen those before it, a distribution flatter
        than the target's, whose race's winner is the target's draw less often than its likeliest token."""
        if budget < 1 or (not self.forward and self.state is None):
            return DraftTree.empty()
        root, device = self.ids[-1], self.target.device
        history = self._history(sampling)
        guesses = noise is not None and self.forward
        if guesses:  # a queued fill: no wait for the device
            self.noise_key.fill_(noise.key(len(self.ids)))
        logits, state = None, self.state  # the draft forward's logits [1, vocab] (None: without it); the heads' start
        if self.forward:  # the LM head at the root drafts the first token; the heads continue it
            position = self.target.cache.length
            cache = self.partial.prepare(root) if self.partial is not None else self.target.cache
            logits, hidden = self.target.forward(torch.full((1,), root, device=device),
                                                 torch.full((1,), position, device=device), cache)  # fmt: skip
            logits, state = logits[-1:], hidden[-1:]
        if not self.device_layout:
            levels, below = self._drafted(budget, sampling, history, logits, state, self._root(root), guesses)
            return host_tree(levels, self.table, budget, (self.kind, NGRAM), below, root)
        self.ngrams.update()
        if self._graphed(sampling, history):
            ranked = self._replay(budget, sampling, history, logits, state, root, guesses)
        else:
            ranked = self._laid_out(budget, sampling, history, logits, state, self._root(root), guesses)
        return ranked.tree((self.kind, NGRAM), self._deepest(budget))

    def _laid_out(self, budget: int, sampling: SamplingConfig, history: torch.Tensor | None,
                  logits: torch.Tensor | None, state: torch.Tensor, root: torch.Tensor,
                  guesses: bool = False) -> Ranked:  # fmt: skip
        """The tree's nodes, ranked on the device: drafted (`_drafted`), the 4-grams that continue its first token
        looked up, the two merged (`heads_tree`)."""
        levels, below = self._drafted(budget, sampling, history, logits, state, root, guesses)
        grams, counts = self.ngrams.lookup(root if below is None else below[0])
        return heads_tree(levels, grams, counts, budget, below)

    def _drafted(self, budget: int, sampling: SamplingConfig, history: torch.Tensor | None,
                 logits: torch.Tensor | None, state: torch.Tensor, root: torch.Tensor,
                 guesses: bool) -> tuple[list[Level], Below | None]:  # fmt: skip
        """The heads' levels and the first token below the `root` [1] with its probability ([1] each; None without
        the draft forward's `logits`), for a tree of `budget` nodes; the heads start from `state` [1, hidden] and
        the first token, or the root. `guesses`: the first token is the guess at the target's draw keyed by
        `noise_key`, else the likeliest."""
        below, start, depth = None, root, budget
        if logits is not None:
            probs = self._probs(logits, sampling, history)
            [p], [token] = guess_keyed(probs, self.noise_key, 1) if guesses else probs.topk(1, dim=-1)
            below, start, depth = (token, p), token, budget - 1
        states = self.heads.start(state.to(self.target.dtype), self._embed(start))
        levels = self._levels(states, min(depth, self.heads.config.gamma), budget - (below is not None), sampling,
                              history)  # fmt: skip
        return levels, below

    def _graphed(self, sampling: SamplingConfig, history: torch.Tensor | None) -> bool:
        """Whether the heads and the layout replay a CUDA graph: on a GPU, with the tree on the device, unless the
        penalty's window is not yet full (its history would change shape from step to step)."""
        return self.uses_graphs and (history is None or history.shape[1] == sampling.penalty_window)

    def _replay(self, budget: int, sampling: SamplingConfig, history: torch.Tensor | None,
                logits: torch.Tensor | None, state: torch.Tensor, root: int, guesses: bool) -> Ranked:  # fmt: skip
        """`_laid_out`'s nodes from its graph for this budget, sampling and guessing, captured on first use from input
        buffers that each replay copies the proposal's into (a guess reads `noise_key`, filled for it); graphs are
        dropped when the n-gram lookup's tensors grow."""
        if list(map(id, self.ngrams.storage)) != list(map(id, self.graphs_read)):  # held: no id is reused
            self.graphs, self.graphs_read = {}, self.ngrams.storage
        key = (budget, replace(sampling, seed=None), history is not None, guesses)  # the seed is in `noise_key`
        if key not in self.graphs:
            copied = (None if value is None else value.clone() for value in (history, logits, state))
            inputs = GraphInputs(*copied, self._root(root))
            drafted = capture(lambda: self._laid_out(budget, sampling, *inputs, guesses), self.graph_pool)
            self.graphs[key] = (*drafted, inputs)
        graph, out, inputs = self.graphs[key]
        for buffer, value in zip(inputs, (history, logits, state)):
            if buffer is not None:
                buffer.copy_(value)
        inputs.root.fill_(root)
        graph.replay()
        return out.copy()

    def _root(self, root: int) -> torch.Tensor:
        return torch.full((1,), root, device=self.target.device)

    def _deepest(self, budget: int) -> int:
        """The depth of a tree of `budget` nodes at most."""
        levels = min(budget - self.forward, self.heads.config.gamma)
        return deepest(levels, self.table.n - 1, self.forward)

    def _levels(self, states: torch.Tensor, levels: int, budget: int, sampling: SamplingConfig,
                history: torch.Tensor | None) -> list[Level]:  # fmt: skip
        """The heads' guesses, a level each, under the start's `states` [1, hidden], for a tree of `budget` nodes
        below the start. Heads that guess from the state alone guess once per level, for every node of the level
        above (TokenSwift's product); heads that read their chain's tokens (`chain_input`) run head i + 1 over the
        depth-i nodes likeliest by their heads' scores, each reading its own token, as many as can still have a
        child among the `budget` best nodes: a node at depth i with a child there ranks among the best
        `budget` - i of its depth."""
        if not self.heads.config.chain_input:
            outs = []
            for i in range(levels):
                states, out = self.heads.step(i, states)
                outs.append(out)
            if not outs:
                return []
            return product_levels(*self._top(torch.cat(outs), sampling, history))
        found, rows, reads, scores = [], None, None, None
        for i in range(levels):
            states, out = self.heads.step(i, states, reads)
            values, tokens = self._top(out, sampling, history)
            found.append(Level(values, tokens, rows))
            scores = values.double() if scores is None else scores[rows][:, None] * values.double()
            keep = min(scores.numel(), budget - i - 1)
            if i + 1 == levels or keep < 1:
                break
            rows = scores.reshape(-1).topk(keep).indices  # sorted: the likeliest first
            states, reads = states[rows // WIDTH], self._embed(tokens.reshape(-1)[rows])
            scores = scores.reshape(-1)
        return found

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


class GraphInputs(NamedTuple):
    """The buffers a captured proposal reads, in `_laid_out`'s order: what each replay copies its proposal's into."""

    history: torch.Tensor | None  # [1, window]
    logits: torch.Tensor | None  # [1, vocab]
    state: torch.Tensor  # [1, hidden]
    root: torch.Tensor  # [1]


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
