"""GLIDE drafting with CAPE: a small draft model over the target's KV cache, growing a chain and its runners-up.

The draft (specchat.drafters.glide.model) keeps its own keys and values of every committed position, computed by
full draft forwards: a layer above the first depends on the cross-attention, so the committed tokens are
caught up lazily at the next `propose` (in chunks), the root last; its logits start the tree.

CAPE (confidence-aware proposal expansion): a greedy chain of `chain` tokens, one draft forward per chain
step on the newest chain node; at each step the top-1 draft probability c picks how many next-ranked tokens
join as sibling leaves (`bins`: c < 0.3 -> 8, < 0.6 -> 6, < 0.8 -> 4, else 2). The chain comes first, then
the siblings step by step while the budget lasts; a budget that outlasts them (on a GPU a verification's rows
are padded to their bucket anyway) takes each step's next-ranked tokens after, step by step, so a tree has
min(budget, chain x (1 + the most siblings)) nodes whatever its confidences: its size is known without reading
them, and the tree stays on the device until the acceptance reads it.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from specchat.drafters import GLIDE
from specchat.drafters.draft_head import DraftHead, draft_weights
from specchat.drafters.glide.model import GlideKV, GlideModel, check_target, load_glide
from specchat.engine.cache import TreeKVLayer
from specchat.engine.cuda_graphs import capture, replayable_rotary
from specchat.engine.drafter import DraftsAlone, TargetView, TracksCommittedIds
from specchat.engine.host_data import to_device
from specchat.engine.keyed_draws import PositionNoise
from specchat.engine.sampling import SamplingConfig
from specchat.engine.tree import DraftTree
from specchat.errors import SpecchatError
from specchat.quant.quantize import quantized_copy

CAPE_BINS = ((0.3, 8), (0.6, 6), (0.8, 4), (math.inf, 2))  # (bound, siblings): the first bound above c applies
CHAIN = 4
CHUNK = 256  # committed rows per catch-up forward: bounds the masks at long contexts


class GlideDrafter(DraftsAlone, TracksCommittedIds):
    kind = GLIDE

    def __init__(self, target: TargetView, model: GlideModel, *, draft_vocab: torch.Tensor | None = None,
                 chain: int = CHAIN, bins: tuple[tuple[float, int], ...] = CAPE_BINS,
                 weights: str | None = "auto"):  # fmt: skip
        """`draft_vocab`: the ids a shared-vocabulary draft predicts over (None: all). `weights`: "int8" /
        "int4" / "q4_k" run the draft's linear layers (its own head too, where it has one) and reduced head quantized (a
        copy), None dense, "auto" as the target runs (quantized on a CPU whose target is)."""
        if chain < 1:
            raise SpecchatError("the GLIDE chain needs at least one token")
        config = model.config
        check_target(config, target.config, "the glide draft")
        self.target = target
        weights = draft_weights(target, weights)
        model = model.to(device=target.device, dtype=target.dtype).eval().requires_grad_(False)
        self.model = quantized_copy(model, weights, dtype=target.dtype)
        own_embedding = self.model.model.embed_tokens
        self.embed = target.embed_tokens if own_embedding is None else own_embedding
        self.head = DraftHead(target, draft_vocab, weights, lm_head=self.model.lm_head)
        self.chain = chain
        # a confidence's bin (the first bound above it), and the runners-up it asks for
        self.bin_bounds = torch.tensor([bound for bound, _ in bins], device=target.device)
        self.bin_counts = torch.tensor([count for _, count in bins], device=target.device)
        self.most_siblings = max(count for _, count in bins)
        self.first_layer = target.config.num_hidden_layers - config.num_hidden_layers  # draft layer m reads this + m
        # every committed position, and the chain's scratch slots past the newest
        self.kv = GlideKV(config, target.cache.max_len + chain + 1, dtype=target.dtype, device=target.device)
        self.ids: list[int] = []
        self.root = torch.zeros(1, dtype=torch.long, device=target.device)  # the root's position, as a graph reads it
        self.root_length = torch.zeros(1, dtype=torch.int32, device=target.device)  # the same, as a kernel reads it
        self.below_root: torch.Tensor | None = None  # the draft's logits below the root, as a graph reads them
        self.graphs: dict[int, tuple] = {}  # per chain length: (CUDA graph, its ranked ids and confidences)
        self.graph_keys: torch.Tensor | None = None  # the target cache's keys the graphs read
        self.graph_pool = torch.cuda.graph_pool_handle() if target.device.type == "cuda" else None

    def prefill(self, ids: list[int], hidden: torch.Tensor, reused: int) -> None:
        same = self.new_request(ids, reused)
        self.kv.truncate(same)

    @torch.inference_mode()
    def propose(self, budget: int, sampling: SamplingConfig, least_chance: float = 0.0,
                noise: PositionNoise | None = None) -> DraftTree:  # fmt: skip
        """Each chain step's forward reads the last one's top token as the device tensor it is, and the chain and
        its siblings are laid out on the device (`_layout`): the tree is read with the target's choices."""
        root = len(self.ids) - 1  # the root's position; the target's cache holds positions [0, root)
        if budget <= 0:
            return DraftTree.empty()
        logits = self.root_logits()
        length = min(self.chain, budget)
        if self._graphed():
            ranked, confidences = self._replay(logits, length)
        else:
            ranked, confidences = self._chain(logits, length, lambda token, depth: self._forward(token, root + depth))
        return DraftTree.queued(*self._layout(ranked, confidences, budget), self.kind, depth=length)

    def _layout(self, ranked: torch.Tensor, confidences: torch.Tensor, budget: int):
        """The tree's tokens and parents [n] from each chain step's ranked ids [length, 1 + r] and confidence: the
        chain (each step's first), then the runners-up of every step, CAPE's first (those its bin asks, step by
        step in rank order), the others after (the same order), n = min(budget, length x (1 + r))."""
        length, ranks = ranked.shape[0], ranked.shape[1] - 1
        device = ranked.device
        asked = self.bin_counts[torch.bucketize(confidences, self.bin_bounds, right=True)]
        rank = torch.arange(ranks, device=device)  # a runner-up's rank among its step's, 0 after the top token
        step = torch.arange(length, device=device)[:, None]
        order = (rank >= asked[:, None]) * (length * ranks) + step * ranks + rank  # [length, ranks], distinct keys
        kept = order.flatten().argsort()[: min(budget, length * (1 + ranks)) - length]  # step * ranks + rank
        tokens = torch.cat([ranked[:, 0], ranked[:, 1:].flatten()[kept]])
        parents = torch.cat([torch.arange(-1, length - 1, device=device), kept // ranks - 1])  # ROOT below step 0
        return tokens, parents

    def _chain(self, logits: torch.Tensor, length: int, forward) -> tuple[torch.Tensor, torch.Tensor]:
        """Per chain step, [most] target ids (best first) and the top-1 probability, from the root's `logits`; each
        step's states from `forward(token [1], depth)` (a chain node's state: a scratch slot)."""
        ranked, confidences = [], []
        most = min(1 + self.most_siblings, logits.shape[-1])
        for depth in range(1, length + 1):
            logits = logits.float()
            top = logits.topk(most)
            confidences.append((top.values[0] - logits.logsumexp(dim=-1)).exp())
            ranked.append(self.head.target_ids(top.indices))
            if depth == length:
                break
            logits = self.head(forward(ranked[-1][:1], depth)[0])
        return torch.stack(ranked), torch.stack(confidences)

    def _graphed(self) -> bool:
        """Whether the chain replays a graph: on a GPU, with the target's layers read in place (not remapped, not an
        int8 or sliding-window cache) and positions rotated without a host-side update (dynamic RoPE)."""
        layers = self.target.cache.layers[self.first_layer :]
        return (self.target.device.type == "cuda" and not self.model.config.remap
                and all(type(layer) is TreeKVLayer for layer in layers)
                and replayable_rotary(self.target.rotary))  # fmt: skip

    def _replay(self, logits: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The chain of `length` from the graph that drafts it (captured on first use): the root's logits copied into
        its buffer, its steps at positions after the root's, held on the device, over the target's whole layers."""
        layers = self.target.cache.layers[self.first_layer :]
        if self.graph_keys is not layers[0].keys:  # the target's cache allocated anew
            self.graphs, self.graph_keys = {}, layers[0].keys
        if self.below_root is None:
            self.below_root = torch.empty_like(logits)
        self.below_root.copy_(logits)
        self.root.fill_(len(self.ids) - 1)  # queued fills: no wait for the device
        self.root_length.fill_(len(self.ids) - 1)
        if length not in self.graphs:
            whole = [(layer.keys[0], layer.values[0]) for layer in layers]
            step = lambda token, depth: self._forward(token, self.root + depth, whole)  # noqa: E731
            self.graphs[length] = capture(lambda: self._chain(self.below_root, length, step), self.graph_pool)
        graph, out = self.graphs[length]
        graph.replay()
        return out

    @torch.inference_mode()
    def root_logits(self) -> torch.Tensor:
        """Draft logits [vocab] below the root, after catching up every committed position before it."""
        root = len(self.ids) - 1
        self.kv.truncate(root)  # the root's own state is (re)computed
        first = start = self.kv.length
        ids = to_device(self.ids[first:], self.target.device)
        self._target_kv = self.model.target_kv(self._target_layers(root))
        while True:
            end = min(start + CHUNK, root + 1)
            states = self._forward(ids[start - first : end - first], start)
            if end == root + 1:
                break
            start = end
        self.kv.commit(root + 1)
        return self.head(states[-1])

    def _forward(self, ids: torch.Tensor, start: int | torch.Tensor, target_kv: list | None = None) -> torch.Tensor:
        """The draft's last states of `ids` [q] at positions start, start + 1, ... (their keys and values kept),
        reading the target's layers as `root_logits` took them, or `target_kv`; a `start` held on the device (a
        tensor [1]: a graph's chain step) reads the target's whole layers to the root."""
        if isinstance(start, torch.Tensor):
            positions, target_length = start, self.root_length
        else:
            positions, target_length = torch.arange(start, start + len(ids), device=self.target.device), None
        cos, sin = self.target.rotary(self.kv.keys, positions[None])
        rotary = cos[0].to(self.target.dtype), sin[0].to(self.target.dtype)
        return self.model(self.embed(ids), start, self.kv, self._target_kv if target_kv is None else target_kv, rotary,
                          target_length=target_length)  # fmt: skip

    def _target_layers(self, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        layers = self.target.cache.layers[self.first_layer :]
        return [layer.read(slice(0, length)) for layer in layers]

    def memory_bytes(self) -> int:
        """What the draft holds besides its weights: its own keys and values for the whole context."""
        return self.kv.nbytes()


def build(target: TargetView, checkpoint: Path) -> GlideDrafter:
    """The GLIDE + CAPE drafter of the checkpoint directory `checkpoint` for this target."""
    model, draft_vocab = load_glide(checkpoint, target.config)
    return GlideDrafter(target, model, draft_vocab=draft_vocab)
