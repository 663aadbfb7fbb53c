"""How much of a GPU attention call is Python launch overhead: the hybrid attention call (at 4K/32K/128K keys, 2
and 65 query rows) timed as called from Python and as a replayed CUDA graph of the same kernels (the whole
forward's: `specchat bench gpu-forward`). `python scripts/cuda_launch_gap.py` on a CUDA machine; figures in
docs/benchmarks.md ("GPU").

`python scripts/cuda_launch_gap.py reads`: the engine's graph tree attention with K and V read through pointers and
through Hopper's tensor descriptors, called and as graphs, and whether the two give the same bits.

`python scripts/cuda_launch_gap.py splits`: the graph tree attention with 16, 32 (the engine's) and 64 body splits a
row (64: as many partials as splits sized by a 32K cache's capacity gave), as graphs, at 4K and 32K keys of one 32K
cache, a decode step's row and a 64-node tree's: more splits, more programs for a decode step's row, more partials
for a tree's rows to write and merge.
"""

import functools
import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from specchat.engine.cuda_graphs import capture
from specchat.kernels.attention import graph_attention
from specchat.kernels.attention.decode_attention import prefix_attention
from specchat.kernels.attention.hybrid import triton_hybrid_tree_attention

CUDA = torch.device("cuda")


def ms(call) -> float:
    return do_bench(call, warmup=50, rep=300, return_mode="median")


def attention_calls(heads=32, kv_heads=8, dim=128, dtype=torch.bfloat16):
    print(f"{'keys':>7} {'rows':>4} {'method':>14} {'called us':>9} {'graph us':>9} {'KV GB/s':>8}")
    for context in (4096, 32768, 131072):
        for n in (2, 65):
            q = torch.randn(1, heads, n, dim, device=CUDA, dtype=dtype)
            k, v = torch.randn(2, 1, kv_heads, context + n, dim, device=CUDA, dtype=dtype)
            mask = torch.tril(torch.ones(n, n, dtype=torch.bool, device=CUDA))
            dense = torch.cat([torch.ones(n, context, dtype=torch.bool, device=CUDA), mask], dim=1)
            scale = dim**-0.5
            calls = {
                "hybrid-triton": functools.partial(triton_hybrid_tree_attention, q, k, v, context, mask, scale,
                                                   prefix="triton"),
                "sdpa-mask": functools.partial(F.scaled_dot_product_attention, q, k, v, attn_mask=dense, scale=scale,
                                               enable_gqa=True),
                "prefix-triton": functools.partial(prefix_attention, q, k, v, context, scale),
            }  # fmt: skip
            want = calls["sdpa-mask"]().float()
            for name, call in calls.items():
                graph, out = capture(call)
                graph.replay()
                if name == "hybrid-triton":
                    assert (out.float() - want).abs().max() < 2e-2
                replay = ms(graph.replay)
                kv_bytes = 2 * kv_heads * context * dim * q.element_size()
                print(f"{context:>7} {n:>4} {name:>14} {ms(call) * 1e3:>9.1f} {replay * 1e3:>9.1f} "
                      f"{kv_bytes / replay / 1e6:>8.0f}", flush=True)  # fmt: skip


def kv_reads(heads=32, kv_heads=8, dim=128, dtype=torch.bfloat16):
    print(f"{'keys':>7} {'rows':>4} {'reads':>11} {'called us':>9} {'graph us':>9} {'same bits':>9}")
    copy_engine = graph_attention.copy_engine
    for context in (4096, 32768):
        k, v = torch.randn(2, kv_heads, context + 128, dim, device=CUDA, dtype=dtype)
        length = torch.tensor([context], dtype=torch.int32, device=CUDA)
        for n in (1, 16, 64, 65):
            q = torch.randn(n, heads, dim, device=CUDA, dtype=dtype)
            mask = torch.tril(torch.ones(n, n, dtype=torch.bool, device=CUDA))
            call = functools.partial(graph_attention.graph_tree_attention, q, k, v, length, mask, dim**-0.5)
            outs = {}
            for reads, descriptors in (("pointers", False), ("descriptors", True)):
                graph_attention.copy_engine = lambda device, on=descriptors: on and copy_engine(device)
                graph, outs[reads] = capture(call)
                graph.replay()
                same = "" if reads == "pointers" else str(torch.equal(outs["pointers"], outs[reads]))
                print(f"{context:>7} {n:>4} {reads:>11} {ms(call) * 1e3:>9.1f} {ms(graph.replay) * 1e3:>9.1f} "
                      f"{same:>9}", flush=True)  # fmt: skip
    graph_attention.copy_engine = copy_engine


def body_splits(heads=32, kv_heads=8, dim=128, dtype=torch.bfloat16):
    print(f"{'keys':>7} {'rows':>4} {'splits':>6} {'graph us':>9}")
    splits = graph_attention.BODY_SPLITS
    k, v = torch.randn(2, kv_heads, 32768 + 128, dim, device=CUDA, dtype=dtype)
    for context in (4096, 32768):
        length = torch.tensor([context], dtype=torch.int32, device=CUDA)
        for n in (1, 65):
            q = torch.randn(n, heads, dim, device=CUDA, dtype=dtype)
            mask = torch.tril(torch.ones(n, n, dtype=torch.bool, device=CUDA))
            for count in (16, 32, 64):
                graph_attention.BODY_SPLITS = count
                graph, _ = capture(functools.partial(graph_attention.graph_tree_attention, q, k, v, length, mask,
                                                     dim**-0.5))  # fmt: skip
                print(f"{context:>7} {n:>4} {count:>6} {ms(graph.replay) * 1e3:>9.1f}", flush=True)
    graph_attention.BODY_SPLITS = splits


if __name__ == "__main__":
    modes = {"reads": kv_reads, "splits": body_splits}
    modes.get(sys.argv[1] if sys.argv[1:] else "", attention_calls)()
