"""Is a verified row bitwise the decode step on this GPU? Probes the torch decoder's two row-dependent steps at
Llama-3.1-8B shapes: cuBLAS products (`F.linear`, `torch.addmm`) by row count, and `graph_tree_attention` (a tree
row against the decode step at its position). Prints JSON.

    python scripts/gpu_row_invariance.py > rows.json
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from specchat.kernels.attention.graph_attention import graph_tree_attention

SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096),
          "head": (4096, 128256)}  # (in, out)
ROWS = (1, 2, 3, 4, 8, 16, 32, 64, 65, 128, 512)


def elapsed_ms(call, reps: int = 20) -> float:
    call()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        call()
    end.record()
    torch.cuda.synchronize()
    return round(start.elapsed_time(end) / reps, 4)


def products(dtype: torch.dtype) -> dict:
    out = {}
    for name, (k, n) in SHAPES.items():
        w = torch.randn(n, k, device="cuda", dtype=dtype) / k**0.5
        x = torch.randn(max(ROWS), k, device="cuda", dtype=dtype)
        residual = torch.randn(max(ROWS), n, device="cuda", dtype=dtype)
        alone = F.linear(x[:1], w)[0]
        alone_addmm = torch.addmm(residual[:1], x[:1], w.t())[0]
        same = [m for m in ROWS if torch.equal(F.linear(x[:m], w)[0], alone)]
        same_addmm = [m for m in ROWS if torch.equal(torch.addmm(residual[:m], x[:m], w.t())[0], alone_addmm)]
        fixed = {}
        for m in (16, 64):  # one row count for every forward: do the other rows or the row's place change it?
            a = x[:m].clone()
            b = torch.randn_like(a)
            b[m // 2 + 1] = a[0]
            fixed[m] = torch.equal(F.linear(a, w)[0], F.linear(b, w)[m // 2 + 1])
        row = {"same_as_one_row": same, "addmm_same_as_one_row": same_addmm, "fixed_rows_invariant": fixed}
        if dtype == torch.bfloat16:
            row["ms"] = {m: elapsed_ms(lambda m=m: F.linear(x[:m], w)) for m in (1, 16, 64)}
        out[name] = row
    return out


def attention() -> dict:
    """A tree of `n` chain rows at committed length L against the decode step of each row's token at L + d."""
    heads, kv_heads, dim, capacity, length = 32, 8, 128, 32768 + 128, 4000
    k_cache = torch.randn(kv_heads, capacity, dim, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    out = {}
    for n in (2, 4, 16, 64):
        q = torch.randn(n, heads, dim, device="cuda", dtype=torch.bfloat16)
        tree = graph_tree_attention(q, k_cache, v_cache, torch.tensor([length], device="cuda", dtype=torch.int32),
                                    torch.ones(n, n, dtype=torch.bool, device="cuda").tril_(), dim**-0.5)  # fmt: skip
        one = torch.ones(1, 1, dtype=torch.bool, device="cuda")
        equal = [torch.equal(tree[d], graph_tree_attention(q[d : d + 1], k_cache, v_cache, torch.tensor(
            [length + d], device="cuda", dtype=torch.int32), one, dim**-0.5)[0]) for d in range(n)]  # fmt: skip
        out[n] = {"rows_equal_to_decode": sum(equal), "of": n, "first_row": equal[0]}
    return out


def main() -> None:
    torch.manual_seed(0)
    report = {"device": torch.cuda.get_device_name(), "bf16": products(torch.bfloat16),
              "fp32": products(torch.float32), "attention_bf16": attention()}  # fmt: skip
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    report["bf16_no_reduced_reduction"] = {k: v["same_as_one_row"] for k, v in products(torch.bfloat16).items()}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
