"""LongSpec drafting: one draft layer over the target's cache, growing a tree by beam search.

Beam search (the reference's default, widths [4, 16, 16, 16, 16]): the root's draft distribution gives the
first 4 children; then each depth keeps the global top-`width` of cumulative log-probability over every
frontier node's children, so weak branches simply stop. One draft forward per depth, all frontier nodes
as rows, each seeing the draft's recent window, its own ancestors and the target's whole last layer. Widths of 1
make it a greedy chain.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specchat.drafters import LONGSPEC
from specchat.drafters.cache_policy import CachePolicy, FullCache, make_policy
from specchat.drafters.draft_head import DraftHead, draft_weights
from specchat.drafters.longspec.model import LongSpecLayer, RingKV, load_longspec
from specchat.drafters.tree_rows import TreeRows
from specchat.engine.cache import TreeKVLayer
from specchat.engine.cuda_graphs import capture, replayable_rotary
from specchat.engine.drafter import DraftsAlone, TargetView, TracksCommittedIds
from specchat.engine.host_data import to_device
from specchat.engine.keyed_draws import PositionNoise
from specchat.engine.sampling import SamplingConfig
from specchat.engine.tree import ROOT, DraftTree
from specchat.quant.quantize import quantized_copy

BEAM_WIDTHS = (4, 16, 16, 16, 16)


class LongSpecDrafter(DraftsAlone, TracksCommittedIds):
    kind = LONGSPEC

    def __init__(self, target: TargetView, layer: LongSpecLayer, *, draft_vocab: torch.Tensor | None = None,
                 widths: tuple[int, ...] = BEAM_WIDTHS, weights: str | None = "auto",
                 policy: str = "full"):  # fmt: skip
        """`weights`: "int8" / "int4" / "q4_k" run the draft's linears and reduced head quantized (a copy; `layer`
        stays as it is), None dense, "auto" as the target runs (quantized on a CPU whose target is)."""
        config = layer.config
        self.target = target
        weights = draft_weights(target, weights)
        layer = layer.to(device=target.device, dtype=target.dtype).eval()
        self.layer = quantized_copy(layer, weights, dtype=target.dtype)
        self.widths = widths
        self.head = DraftHead(target, draft_vocab, weights)
        self.ring = RingKV(config.window, config.num_key_value_heads, config.head_dim, dtype=target.dtype,
                           device=target.device)  # fmt: skip
        self.ids: list[int] = []
        self.use_cache_policy(policy)
        self.root_token = torch.zeros(1, dtype=torch.long, device=target.device)  # the newest committed id
        self.root = torch.zeros(1, dtype=torch.long, device=target.device)  # its position
        self.root_length = torch.zeros(1, dtype=torch.int32, device=target.device)  # the same, as a kernel reads it
        self.target_kv: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] = ()  # what cross-attention reads
        self.graphs: dict[tuple[int, ...], tuple] = {}  # per proposal shape: (CUDA graph, its tokens and parents)
        self.graph_keys: torch.Tensor | None = None  # the target cache's keys the graphs read
        self.graph_pool = torch.cuda.graph_pool_handle() if target.device.type == "cuda" else None

    def use_cache_policy(self, policy: str | CachePolicy) -> None:
        """Which of the target's cached positions cross-attention reads (`cache_policy.py`; LongSpec reads them
        all): from the next proposal on."""
        self.policy = make_policy(policy, self.target) if isinstance(policy, str) else policy
        self.read = torch.zeros(0, dtype=torch.long, device=self.target.device)  # target positions read
        self.read_until = 0  # positions from here on are not in `read` yet

    def prefill(self, ids: list[int], hidden: torch.Tensor, reused: int) -> None:
        same = self.new_request(ids, reused)
        self.ring.truncate(same)
        self.read = self.read[:0]

    @torch.inference_mode()
    def propose(self, budget: int, sampling: SamplingConfig, least_chance: float = 0.0,
                noise: PositionNoise | None = None) -> DraftTree:  # fmt: skip
        """Every depth's forward is queued from the last one's tensors, never read back: the tree stays on the
        device (`DraftTree.queued`), read with the target's choices at verification. On a GPU the beam replays a
        CUDA graph of its depths, one per shape (`_shape`). The beam ranks the draft's own distribution: its
        likeliest tokens are its guesses at the target's draws too."""
        root = len(self.ids) - 1  # the root's position; the target's cache holds positions [0, root)
        self._catch_up()
        shape = self._shape(budget)
        if not shape:
            return DraftTree.empty()
        self.root_token.fill_(self.ids[-1])  # the buffers a graph reads (queued fills: no wait for the device)
        self.root.fill_(root)
        self.root_length.fill_(root)
        if self._graphed():
            tokens, parents = (part.clone() for part in self._replay(shape))
        else:
            tokens, parents = self._grow(shape, (*self._target_kv(root), None))
        return DraftTree.queued(tokens, parents, self.kind, depth=len(shape))

    def _shape(self, budget: int) -> tuple[int, ...]:
        """The nodes each depth proposes: the beam's widths cut by the budget (and by how many children the
        frontier has)."""
        head = self.head
        columns = head.vocab_size if head.draft_vocab is None else len(head.draft_vocab)
        widths: list[int] = []
        for width in self.widths:
            width = min(width, budget - sum(widths), columns * (widths[-1] if widths else 1))
            if width <= 0:
                break
            widths.append(width)
        return tuple(widths)

    def _graphed(self) -> bool:
        """Whether this proposal replays a graph: on a GPU, reading the target's whole last layer in place (its
        sliding window, an int8 cache, a cache policy's selection: as called), positions rotated without a host-side
        update (dynamic RoPE)."""
        return (self.target.device.type == "cuda" and isinstance(self.policy, FullCache)
                and type(self.target.cache.layers[-1]) is TreeKVLayer
                and replayable_rotary(self.target.rotary))  # fmt: skip

    def _replay(self, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """The proposal's tokens and parents from the graph of `shape` (views of its buffers), captured on first use
        over the target's whole last layer and the draft's ring: both stay where they are, and the root's token and
        position are read from their buffers."""
        layer = self.target.cache.layers[-1]
        if self.graph_keys is not layer.keys:  # the target's cache allocated anew
            self.graphs, self.graph_keys = {}, layer.keys
        if shape not in self.graphs:
            whole = (layer.keys[0], layer.values[0], self.root_length)
            self.graphs[shape] = capture(lambda: self._grow(shape, whole), self.graph_pool)
        graph, out = self.graphs[shape]
        graph.replay()
        return out

    def _grow(self, shape: tuple[int, ...], target_kv: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]):
        """(tokens, parents) of the tree of `shape` below the root in `root_token` at position `root`, cross-attention
        reading `target_kv` (keys, values and, for the target's whole cache, the length read): its first forward runs
        the root, as a row of the tree. Each depth keeps the global top `width` of the frontier's children by
        cumulative log-probability; the sizes are known ahead, which frontier row each child hangs from is not."""
        self.target_kv = target_kv
        tree = TreeRows(device=self.target.device)
        logits = self._forward(self.root_token, 0, tree, tree.add([ROOT]))
        tokens, parents = [], []  # per depth [width]: target ids; parent nodes (ROOT below the root)
        scores = logits.float().log_softmax(dim=-1)  # [frontier, draft vocab], cumulative log-probabilities
        nodes, frontier = 0, ROOT  # nodes so far; the frontier's first node (its first row is its node + 1)
        for depth, width in enumerate(shape, start=1):
            best = scores.flatten().topk(width)
            rows, columns = best.indices // scores.shape[1], best.indices % scores.shape[1]
            tokens.append(self.head.target_ids(columns))
            parents.append(rows + frontier if depth > 1 else torch.full_like(rows, ROOT))
            frontier, nodes = nodes, nodes + width
            if depth == len(shape):
                break
            logits = self._forward(tokens[-1], depth, tree, tree.add(parents[-1] + 1))
            scores = best.values[:, None] + logits.float().log_softmax(dim=-1)
        return torch.cat(tokens), torch.cat(parents)

    def _target_kv(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's last-layer keys and values that cross-attention reads: the policy's selection of the
        `length` cached positions, and those cached since it was made. Keys keep the rotation of their true
        positions, as the draft's queries do, so a selection needs no re-rotation."""
        selection = self.policy.select(length, force=not len(self.read))
        if selection is not None:
            self.read = to_device(selection, self.read.device)
        else:
            self.read = torch.cat([self.read, torch.arange(self.read_until, length, device=self.read.device)])
        self.read_until = length
        layer = self.target.cache.layers[-1]
        if len(self.read) == length:  # all of it: a view, no copy (in the activations' dtype)
            return layer.read(slice(0, length))
        return layer.read(self.read)

    def _catch_up(self) -> None:
        """Write the draft's own keys / values of committed positions before the root that it has not written
        (the last window of them); the root's are the first row of each tree."""
        end = len(self.ids) - 1
        start = max(self.ring.length, end - self.ring.window)
        if start >= end:
            return
        ids = to_device(self.ids[start:end], self.target.device)
        cos, sin = self._rotary(torch.arange(start, end, device=self.target.device))
        keys, values = self.layer.own_kv(self.target.embed_tokens(ids), cos, sin)
        self.ring.write(start, keys, values)

    def _forward(self, tokens: torch.Tensor, depth: int, tree: TreeRows, rows: range) -> torch.Tensor:
        """Draft logits [rows, draft vocab] of the tree's newest `rows` (the root's, or a depth's nodes), all at
        `depth` below the root: their own keys and values join the ring's committed window and their ancestors'."""
        positions = self.root.expand(len(rows)) + depth
        cos, sin = self._rotary(positions)
        x = self.target.embed_tokens(tokens)
        keys, values = self.layer.own_kv(x, cos, sin)
        tree.write([keys], [values])
        own_keys = torch.cat([self.ring.keys, *tree.keys[0]], dim=1)
        own_values = torch.cat([self.ring.values, *tree.values[0]], dim=1)
        mask = torch.cat([self.ring.visible(positions), tree.seen(rows)], dim=1)
        target_keys, target_values, target_length = self.target_kv
        out = self.layer(x, cos, sin, own_keys, own_values, mask, target_keys, target_values,
                         target_length=target_length)  # fmt: skip
        return self.head(out)

    def _rotary(self, positions: torch.Tensor):
        cos, sin = self.target.rotary(self.ring.keys, positions[None])
        return cos[0].to(self.target.dtype), sin[0].to(self.target.dtype)

    def memory_bytes(self) -> int:
        """What the draft holds besides its weights: the ring buffer (the same at any context length)."""
        return self.ring.nbytes()

    def weight_bytes(self) -> int:
        """The draft's own weights: its layer, and the reduced LM head when it has one (the full one is the
        target's)."""
        own = [self.layer] + ([] if self.head.draft_vocab is None else [self.head.lm_head])
        return sum(t.numel() * t.element_size() for module in own for t in (*module.parameters(), *module.buffers()))


def build(target: TargetView, checkpoint: Path, *, cache: str = "full") -> LongSpecDrafter:
    """The registry's factory: the checkpoint's layer and draft vocabulary over `target`, reading the target's
    cache as the policy `cache` says (LongSpec's own reads it all)."""
    layer, draft_vocab = load_longspec(checkpoint, target.config)
    return LongSpecDrafter(target, layer, draft_vocab=draft_vocab, policy=cache)
