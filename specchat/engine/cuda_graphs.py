"""The torch decoder's forward replayed as CUDA graphs, one per row bucket.

A decode step of an 8B model is ~350 kernels whose launches from Python take longer than the GPU takes to run
them; a replayed graph launches them all at once. Each bucket (1, 2, 4, ..., 64 rows, and 65: a tree of the
largest budget with its root) is captured once on a cache: a forward of r rows runs in the smallest bucket that
holds it, its inputs copied into the bucket's static buffers and the rows past r padded (no real row sees a pad
row and every pad row sees itself, so real rows compute what an unpadded forward computes and pad rows stay
finite). The committed length is read on the device, so one graph serves every context length; the pad rows'
keys and values land in slots after the real rows', which the cache never commits.
"""

from __future__ import annotations

import torch

from specchat.collector import collector_paused
from specchat.engine.budget import MAX_BUDGET
from specchat.engine.cache import TreeCache
from specchat.engine.forward_output import ForwardOutput
from specchat.engine.torch_decoder import TorchDecoder

BUCKETS = (1, 2, 4, 8, 16, 32, 64, MAX_BUDGET + 1)  # the last: a tree of the largest budget and its root


def replayable_rotary(rotary) -> bool:
    """Whether a transformers rotary module computes its tables from the positions alone: dynamic RoPE (and
    LongRoPE) updates them from the positions' values on the host, which a graph cannot replay."""
    return getattr(rotary, "rope_type", "default") not in ("dynamic", "longrope")


_captures = 0  # graphs captured in this process


def captures() -> int:
    """How many graphs `capture` has captured in this process: a call during which the count grew paid a capture's
    one-off cost (the engine does not price a proposal that did, as it does not its drafter's first)."""
    return _captures


def capture(call, pool=None):
    """(graph, what `call` returned while captured), counted in `captures`: `call` captured by `graph_of`."""
    global _captures
    _captures += 1
    return graph_of(call, pool)


def graph_of(call, pool=None):
    """(graph, what `call` returned while captured): `call` warmed up twice on a side stream (Triton compiles its
    kernels, cuBLAS settles its workspace), then captured into `pool` (shared by graphs replayed one at a time).

    Python's cyclic collector is held off while capturing: a collection there would run the finalizers of whatever
    died in a cycle (an earlier engine's pinned buffers, events, tensors other streams used), and a CUDA call they
    make can invalidate the capture; torch no longer collects before a capture (`force_cudagraph_gc`)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with collector_paused(), torch.cuda.graph(graph, pool=pool):
        out = call()
    return graph, out


class _Bucket:
    """One captured forward of `rows` rows and the static tensors it reads and writes."""

    def __init__(self, decoder: TorchDecoder, cache: TreeCache, rows: int, pool, feature_layers: tuple[int, ...]):
        device = decoder.device
        self.tokens = torch.zeros(rows, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=device)
        self.mask = torch.eye(rows, dtype=torch.bool, device=device)
        self.eye = self.mask.clone()  # pad rows of a tree: each sees itself
        self.causal = torch.ones_like(self.mask).tril_()  # pad rows of a decode step or a prefill see real rows too
        self.graph, self.out = capture(
            lambda: decoder(self.tokens, self.positions, cache, self.mask, feature_layers=feature_layers), pool
        )

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor | None) -> ForwardOutput:
        rows = tokens.shape[0]
        self.tokens[:rows].copy_(tokens)
        self.positions[:rows].copy_(positions)
        if tree_mask is None:
            self.mask.copy_(self.causal)
        else:
            self.mask.copy_(self.eye)
            self.mask[:rows, :rows].copy_(tree_mask)
        self.graph.replay()
        out = self.out
        return ForwardOutput(out.logits[:rows], out.hidden[:rows], out.queries[:rows], out.features[:rows])


class GraphedDecoder:
    """`decoder`'s forward on `cache`, captured per row bucket; the same call as `TorchDecoder`'s (all rows'
    logits). Outputs are views of the graphs' buffers, valid until the next call. A forward larger than every
    bucket, or too close to the cache's end for its bucket's pad rows, runs uncaptured. Each forward returns the
    features of `feature_layers` (those a drafter reads)."""

    def __init__(self, decoder: TorchDecoder, cache: TreeCache, buckets: tuple[int, ...] = BUCKETS,
                 feature_layers: tuple[int, ...] = ()):  # fmt: skip
        if cache.length + max(buckets) > cache.max_len:
            raise ValueError(f"capturing needs {max(buckets)} free slots after the cache's {cache.length}")
        self.decoder, self.cache, self.feature_layers = decoder, cache, feature_layers
        pool = torch.cuda.graph_pool_handle()
        self.buckets = {rows: _Bucket(decoder, cache, rows, pool, feature_layers) for rows in sorted(buckets)}

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor,
                 tree_mask: torch.Tensor | None = None) -> ForwardOutput:  # fmt: skip
        rows = tokens.shape[0]
        for size, bucket in self.buckets.items():
            if size >= rows and self.cache.length + size <= self.cache.max_len:
                return bucket(tokens, positions, tree_mask)
        return self.decoder(tokens, positions, self.cache, tree_mask, feature_layers=self.feature_layers)
