"""The protocol every drafter implements, and the read-only view of the target a drafter may be built from.

The engine drives a drafter through three calls, and asks before each proposal which kinds will draft it
(`next_kinds`: the adaptive budget sizes the tree for them). Each call that follows a target forward hands
over the target's states of every position that forward wrote into the cache, in order: the prompt's new rows
after `prefill`, the root and the accepted nodes after `commit`. They are the last decoder layer's output, before
the final norm, or, for a drafter that names `feature_layers`, the residual stream entering each of those layers
side by side (EAGLE-3 fuses a low, a middle and a high layer). They come out of the forward the engine runs
anyway, so they cost nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # no torch for option checks that only need the drafters' names
    import torch

    from specchat.engine.cache import TreeCache
    from specchat.engine.keyed_draws import PositionNoise
    from specchat.engine.sampling_config import SamplingConfig
    from specchat.engine.tree import DraftTree


@dataclass(frozen=True)
class TargetView:
    """What a drafter may read of the target: its modules (shared, never copied) and the engine's cache.

    `cache.layers[i].read(slice(0, cache.length))` gives the committed prefix of layer i, post-RoPE, as keys and
    values `[kv_heads, length, head_dim]` in the activations' dtype (widened from a bf16 cache, dequantized from an
    int8 one): valid whenever the engine calls the drafter. The newest committed token (the root of the next tree)
    is not in the cache yet.

    `forward(tokens [q], positions [q], cache)` runs the target itself, as the engine does, over `tokens` written
    after `cache`'s prefix (pending, never committed): logits [q, vocab] and the last layer's output before
    the final norm [q, hidden_size]. A drafter that drafts with the target (TokenSwift) passes a cache of its
    own, or the engine's, whose pending rows the next verification overwrites.

    `last_query()` is the query [heads, head_dim] (fp32, rotated) of layer `query_layer` (the last that attends to
    every position: the last layer but in sliding-window models) at the newest position in the cache: with that
    layer's cached keys, how the target itself attends to the context (SpecExtend's retrieval).
    `layer_queries(token, position)` runs the target over `token` at `position` after the engine's cache (the
    row not kept) for every layer's query [layers, heads, head_dim] (fp32, rotated): how each layer would attend
    (TokenSwift's partial cache ranks each layer's keys by it).
    """

    config: Any  # the target's transformers config
    embed_tokens: torch.nn.Module
    norm: torch.nn.Module  # the final norm
    lm_head: torch.nn.Module
    rotary: torch.nn.Module  # its last layer's RoPE (`last_rotary`): (x, positions [1, q]) -> cos, sin
    cache: TreeCache
    device: torch.device
    dtype: torch.dtype
    model: torch.nn.Module  # the whole target (a standalone draft checks its shapes and tokenizer against it)
    forward: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None
    last_query: Callable[[], torch.Tensor] | None = None
    tokenizer: Any = None  # a standalone draft model's must be the same
    layer_queries: Callable[[int, int], torch.Tensor] | None = None
    query_layer: int = -1  # the layer `last_query` is of

    @classmethod
    def of(cls, model, cache: TreeCache, forward=None, last_query=None, tokenizer=None,
           layer_queries=None) -> TargetView:  # fmt: skip
        """The view of a transformers model of an architecture specchat knows and its cache."""
        from specchat.architectures import parts

        decoder = parts(model)
        return cls(model.config, decoder.embed, decoder.norm, decoder.head, decoder.last_rotary, cache,
                   model.device, model.dtype, model, forward, last_query, tokenizer, layer_queries,
                   decoder.query_layer)  # fmt: skip


class Drafter(Protocol):
    kind: str  # the origin recorded for tokens it proposes ("ngram", "model", "heads", ...)
    # Its trees carry `scores` (each node's estimated chance to be accepted): the engine asks it for a large
    # tree and keeps the nodes worth their verification (`AdaptiveBudget.size`).
    scores_nodes: bool
    # The target layers whose input states `prefill` and `commit` hand over (the layer count: the last layer's
    # output); empty: the last layer's output, as every drafter but EAGLE-3 reads; None: it reads no states.
    feature_layers: tuple[int, ...] | None

    def prefill(self, ids: list[int], hidden: torch.Tensor, reused: int) -> None:
        """A new request whose committed ids (prompt included) are `ids`. The first `reused` of them were
        already in the target's cache and were not run again; `hidden` [len(ids) - reused, hidden_size] are
        the states of the rest. A drafter that tracked the same first `reused` ids may keep what it built from
        them; one that did not rebuilds from `ids` and the target's cache."""

    def next_kinds(self) -> frozenset[str]:
        """The kinds that will draft the next proposal: this drafter's own, or those of the parts a composite
        will run. The adaptive budget sizes the next tree for them and prices the proposal's time as theirs."""

    def propose(self, budget: int, sampling: SamplingConfig, least_chance: float = 0.0,
                noise: PositionNoise | None = None) -> DraftTree:  # fmt: skip
        """A tree of at most `budget` nodes below the last committed id (possibly empty), left on the device
        (`DraftTree.queued`) where the drafter knows its size without reading its values. A drafter that scores
        its nodes may leave out those scored below `least_chance`: worth less than their verification costs.
        `noise`, where the target samples: it will choose a depth-d node's token as the race at text index
        len(ids) + d - 1 (ids: the committed ones, prompt included), which a drafter may guess with `noise.guess`
        (none of this can change the output)."""

    def commit(self, tokens: list[int], hidden: torch.Tensor) -> None:
        """Tokens the engine committed since the last call (accepted drafts, then the target's own), and the
        states of the positions written into the cache since the last call: none after prefill's first token,
        then one per token of a step (the previous last token's, then each accepted token's). Over a request,
        `prefill`'s and `commit`'s rows line up with cache positions `reused`, `reused` + 1, ...: the state at
        position p is the one that predicted the token at p + 1."""


class DraftsAlone:
    """A drafter that is not a composite: every proposal is drafted by its own kind."""

    kind: str
    scores_nodes = False
    feature_layers: tuple[int, ...] = ()

    def next_kinds(self) -> frozenset[str]:
        return frozenset({self.kind})


class TracksCommittedIds:
    """The committed ids (prompt included) as the engine reports them, for a drafter that keeps state built
    from them: `prefill` asks `new_request` how much of it a new request leaves valid."""

    ids: list[int]

    def new_request(self, ids: list[int], reused: int) -> int:
        """Track `ids` from now on; the number of leading positions whose state stays valid: the `reused` the
        engine kept, when this drafter had tracked the same ids there, else none."""
        kept = reused if self.ids[:reused] == ids[:reused] else 0
        self.ids = list(ids)
        return kept

    def commit(self, tokens: list[int], hidden: torch.Tensor | None = None) -> None:  # the states go unread
        self.ids += tokens
