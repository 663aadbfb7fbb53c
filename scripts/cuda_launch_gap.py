"""How much of a GPU forward is Python launch overhead: the hybrid attention call (at 4K/32K/128K keys, 2 and
65 query rows) and the verify-cost forwards (Llama-3.1-8B shapes, random bf16 weights), each timed as called
from Python and as a replayed CUDA graph of the same kernels. `python scripts/cuda_launch_gap.py` on a CUDA
machine; figures in docs/benchmarks.md ("GPU")."""
import functools

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from specchat.bench.synthetic import random_tree
from specchat.bench.verify_cost import fill_cache, llama31_8b_config, random_model
from specchat.engine.attention import uses_tree_masks
from specchat.engine.cache import TreeCache
from specchat.engine.cuda_graphs import capture
from specchat.engine.verify_forward import verification_forward
from specchat.kernels.decode_attention import prefix_attention
from specchat.kernels.hybrid import triton_hybrid_tree_attention

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


def forwards(contexts=(4096, 32768), trees=(0, 1, 16, 63, 64)):
    config = llama31_8b_config()
    model = random_model(config, torch.bfloat16, CUDA, "auto")
    cache = TreeCache(config.num_hidden_layers, max(contexts) + max(trees) + 1)

    def forward(tokens, *, positions, mask):
        return model(input_ids=tokens[None], position_ids=positions[None], attention_mask=mask,
                     past_key_values=cache, use_cache=True).logits  # fmt: skip

    print(f"\n{model.config._attn_implementation}, Llama-3.1-8B shapes: ms per forward")
    with torch.inference_mode():
        for context in contexts:
            fill_cache(cache, context, config, torch.bfloat16, CUDA)
            for nodes in trees:
                tree = random_tree(nodes, seed=0, vocab=config.vocab_size) if nodes else 0
                call = verification_forward(forward, cache, CUDA, tree_only=uses_tree_masks(model), tree=tree,
                                            root_token=1)  # fmt: skip
                try:
                    graph, out = capture(call)
                    graph.replay()
                    same = torch.equal(out.argmax(-1), call().argmax(-1))
                    replay = f"{ms(graph.replay):.2f} ms, argmax as called: {same}"
                except RuntimeError as error:  # a capture can fail (cuDNN allocating inside it, for one)
                    replay = f"no graph ({type(error).__name__}: {str(error).splitlines()[0][:80]})"
                print(f"context {context}, {nodes} nodes: called {ms(call):.2f} ms, graph {replay}", flush=True)


if __name__ == "__main__":
    attention_calls()
    forwards()
