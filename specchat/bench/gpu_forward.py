"""`specchat bench gpu-forward`: the torch decoder's forward on CUDA, as called and as CUDA graphs, with
Llama-3.1-8B's shapes and random weights, against the card's measured copy bandwidth.

Rows per context: a decode step (0 nodes) and verification forwards over random trees, each timed as a graph
call (inputs copied into the bucket's static buffers, then one replay: wall time, device synced), with the
host's share of it (the call returning before the GPU finishes: the step is GPU-bound when host < graph), and
as called (every kernel launched from Python). Two `weights` rows time the forward's matmuls alone as a graph for
one row (what reading the weights costs at this card's rate for those shapes) and for the 64 rows a decode step
multiplies on CUDA (zero-padded: every product at one row count); an `attention` row after each
forward row times its attention calls alone (all layers, unpadded rows) as a graph. The copy row is a 1 GiB
device-to-device copy, bytes read + written per second: the achievable bandwidth the decode is put against.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specchat.bench.progress import NO_PROGRESS
from specchat.bench.synthetic import MAX_TREE, WARMUP, check_contexts, check_range, random_tree, significant
from specchat.bench.verify_cost import llama31_8b_config, random_model, with_layers
from specchat.engine import decoder_ops as ops
from specchat.engine.cuda_graphs import BUCKETS, GraphedDecoder, capture
from specchat.engine.timing import Timer
from specchat.engine.torch_decoder import PIECE, TorchDecoder
from specchat.engine.tree import tree_batch
from specchat.errors import SpecchatError

COPY_BYTES = 2**30


@dataclass
class GpuForwardRow:
    kind: str  # copy | weights | forward | attention (the forward's attention calls alone, as a graph)
    context: int | None  # committed tokens in the cache (forward rows)
    nodes: int | None  # draft nodes below the root (0: a decode step)
    rows: int | None  # the graph's rows (its bucket; pad rows included)
    called_ms: float | None  # the forward launched kernel by kernel from Python
    graph_ms: float  # the bucket's graph: input copies + replay, device synced
    host_ms: float | None  # the graph call's host time (returns before the GPU is done)
    over_decode: float | None  # graph_ms / the decode step's graph_ms at this context
    gb_s: float | None  # weights row: weight bytes / time; copy row: bytes read + written / time
    of_copy: float | None  # gb_s / the copy row's


def bucket_of(rows: int) -> int:
    """The capture bucket of a forward of `rows` rows: the engine's buckets, a larger forward its own size."""
    return next((size for size in BUCKETS if size >= rows), rows)


def gpu_forward(
    *,
    contexts: list[int],
    trees: list[int],
    layers: int | None = None,
    dtype: torch.dtype = torch.bfloat16,
    repeats: int = 20,
    called: bool = True,
    config=None,
    seed: int = 0,
    step=NO_PROGRESS,
) -> list[GpuForwardRow]:
    """The copy row, the weights row, then per context a row per tree size in `trees` and a decode step.

    Args:
        contexts: committed tokens in the cache, filled with random keys and values (timing does not depend on
            them).
        trees: draft-tree sizes; a forward has nodes + 1 rows, captured in its bucket.
        layers: decoder layers to build (default: all 32).
        called: also time each forward as called from Python (slow: ~1000 launches).
        config: a transformers config to build instead of Llama-3.1-8B's (tests pass a tiny one).
    """
    check_contexts(contexts)
    for nodes in trees:
        check_range("--tree", nodes, 0, MAX_TREE)
    check_range("--repeats", repeats, 1)
    if not torch.cuda.is_available():
        raise SpecchatError("bench gpu-forward needs a CUDA GPU")
    device = torch.device("cuda")
    config = with_layers(copy.deepcopy(config if config is not None else llama31_8b_config()), layers)
    trees = sorted(set(trees) | {0})  # the decode step first: the others are put against it
    buckets = sorted({bucket_of(nodes + 1) for nodes in trees})
    capacity = max(contexts) + max(buckets)
    if capacity > config.max_position_embeddings:
        room = config.max_position_embeddings - max(buckets)
        raise SpecchatError(f"--context must leave room for the tree: at most {room} here")
    model = random_model(config, dtype, device, "hybrid", seed=seed)
    decoder = TorchDecoder.from_model(model, max_positions=capacity)
    cache = decoder.new_cache(capacity)
    timer = Timer(device, repeats=repeats, warmup=WARMUP)
    copy_rate = _copy_rate(timer, device)
    rows = [GpuForwardRow("copy", None, None, None, None, significant(2 * COPY_BYTES / copy_rate * 1e3), None, None,
                          significant(copy_rate / 1e9), 1.0)]  # fmt: skip
    weight_bytes = sum(t.numel() * t.element_size() for t in _weights_read(decoder))
    for matmul_rows in (1, PIECE):  # one row: the floor; PIECE: what a decode step multiplies on CUDA
        weights_s = timer.seconds(_matmuls_graph(decoder, matmul_rows))
        weight_rate = weight_bytes / weights_s
        rows.append(GpuForwardRow("weights", None, None, matmul_rows, None, significant(weights_s * 1e3), None, None,
                                  significant(weight_rate / 1e9), significant(weight_rate / copy_rate)))  # fmt: skip
    with torch.inference_mode():
        graphs = GraphedDecoder(decoder, cache, tuple(buckets))
        for context in contexts:
            step(f"context {context}")
            _fill(cache, context)
            decode_ms = None
            for nodes in trees:
                tree = random_tree(nodes, seed=seed, vocab=config.vocab_size)
                batch = tree_batch(tree, 1, context, device)
                inputs = (batch.input_ids, batch.position_ids, batch.tree_mask)
                calls = {"graph": lambda: graphs(*inputs)}
                if called:
                    calls["called"] = lambda: decoder(batch.input_ids, batch.position_ids, cache, batch.tree_mask)
                seconds = timer.seconds_each(calls)
                graph_ms = seconds["graph"] * 1e3
                if nodes == 0:  # the first size
                    decode_ms = graph_ms
                rows.append(GpuForwardRow(
                    "forward", context, nodes, bucket_of(nodes + 1),
                    significant(seconds["called"] * 1e3) if called else None,
                    significant(graph_ms), significant(_host_seconds(calls["graph"], repeats) * 1e3),
                    significant(graph_ms / decode_ms), None, None,
                ))  # fmt: skip
                attention_ms = timer.seconds(_attention_graph(decoder, cache, batch.tree_mask)) * 1e3
                rows.append(GpuForwardRow("attention", context, nodes, nodes + 1, None, significant(attention_ms),
                                          None, significant(attention_ms / decode_ms), None, None))  # fmt: skip
    return rows


def _fill(cache, length: int) -> None:
    """The cache at `length` committed slots of random keys and values."""
    cache.keys[:, :, :, :length].normal_()
    cache.values[:, :, :, :length].normal_()
    cache.truncate(0)
    cache.claim(length)
    cache.commit()
    cache.claim(0)  # the device length, which the kernels read, brought to the committed one


def _weights_read(decoder: TorchDecoder) -> list[torch.Tensor]:
    """The matrices and norms a decode step reads (the embedding only by one row)."""
    tensors = [decoder.norm, decoder.head]
    for layer in decoder.layers:
        tensors += [t for t in vars(layer).values() if t is not None]
    return tensors


def _matmuls_graph(decoder: TorchDecoder, rows: int):
    """A graph of the forward's matmuls alone for `rows` rows (weights read once each): the weight-reading floor."""
    x = torch.zeros(rows, decoder.config.hidden_size, dtype=decoder.embed.dtype, device=decoder.device)
    attended = torch.zeros(rows, decoder.heads * decoder.head_dim, dtype=x.dtype, device=x.device)
    gated = torch.zeros(rows, decoder.layers[0].down.shape[1], dtype=x.dtype, device=x.device)

    def matmuls():
        for layer in decoder.layers:
            F.linear(x, layer.qkv, layer.qkv_bias)
            torch.addmm(x, attended, layer.o.t())
            F.linear(x, layer.gate_up, layer.gate_up_bias)
            torch.addmm(x, gated, layer.down.t())
        F.linear(x, decoder.head)

    graph, _ = capture(matmuls)
    return graph.replay


def _attention_graph(decoder: TorchDecoder, cache, tree_mask: torch.Tensor):
    """A graph of the forward's attention calls alone (every layer, random queries) for `tree_mask`'s rows."""
    rows = tree_mask.shape[0]
    q = torch.randn(rows, decoder.heads, decoder.head_dim, dtype=decoder.embed.dtype, device=decoder.device)

    def attention():
        for layer in range(len(decoder.layers)):
            ops.tree_attention(q, cache.keys, cache.values, layer, cache.length_tensor, tree_mask, decoder.scale, False,
                               rows)  # fmt: skip

    graph, _ = capture(attention)
    return graph.replay


def _copy_rate(timer: Timer, device: torch.device) -> float:
    """Bytes read + written per second by a 1 GiB device-to-device copy."""
    src = torch.ones(COPY_BYTES, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * COPY_BYTES / timer.seconds(lambda: dst.copy_(src))


def _host_seconds(call, repeats: int) -> float:
    """Median host time of `call` (not waiting for the GPU), each call started on an idle device."""
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return sorted(times)[len(times) // 2]
