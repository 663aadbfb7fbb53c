"""`specchat bench attention`: what one attention call of a tree verification costs, computed each way there is.

`attention_bench` times a single layer's attention for the n + 1 rows of a verification forward (the root and
a random tree of n nodes, masks from `engine.tree.tree_batch`) over `context` committed keys, computed each
way there is: hybrid (prefix without a mask + tree with its ancestor mask, merged by LSE), SDPA with a dense
`[n + 1, context + n + 1]` bool mask, transformers-style eager attention, and FlexAttention with a tree
`mask_mod`. The prefix part alone is timed too, with its achieved bandwidth (KV bytes read / time) against
the device's spec-sheet peak and a measured device-to-device copy, the achievable reference.

Inputs are random; masks, block masks and compiled functions are built before timing, so a row is the call
alone. On CUDA a row is GPU time between CUDA events with the L2 cache flushed before each call (as
`triton.testing.do_bench` does), on CPU wall time; the median of `repeats` calls after a warm-up
(`specchat.engine.timing.Timer`).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specchat.bench.bandwidth import COPY_BYTES, copy_bandwidth
from specchat.bench.progress import NO_PROGRESS
from specchat.bench.synthetic import (
    MAX_TREE,
    WARMUP,
    check_contexts,
    check_range,
    random_tree,
    significant,
    torch_device,
    torch_dtype,
)
from specchat.engine.timing import Timer
from specchat.engine.tree import tree_batch
from specchat.errors import SpecchatError, first_line

# Spec-sheet HBM bandwidth (bytes/s) by a substring of torch.cuda.get_device_name; the first match wins.
PEAK_BANDWIDTH = (
    ("GH200", 4.0e12),
    ("H200", 4.8e12),
    ("H100 NVL", 3.9e12),
    ("H100 PCIe", 2.0e12),
    ("H100", 3.35e12),  # SXM5, named "NVIDIA H100 80GB HBM3"
    ("A100-SXM4-80GB", 2.039e12),
    ("A100 80GB PCIe", 1.935e12),
    ("A100", 1.555e12),  # 40 GB, SXM4 or PCIe
    ("L40S", 0.864e12),
    ("L40", 0.864e12),
    ("L4", 0.3e12),
    ("A10G", 0.6e12),
    ("RTX 4090", 1.008e12),
    ("V100", 0.9e12),
)


@dataclass
class AttentionRow:
    context: int | None  # committed keys before the tree; None on the copy reference row
    method: str  # hybrid-triton | hybrid-flash | hybrid-torch | sdpa-mask | eager | flex | prefix-* | copy
    us: float | None  # median microseconds per call; None when the method is unavailable
    vs_sdpa: float | None  # SDPA-with-mask time / this time (full attention methods)
    gb_s: float | None  # prefix rows: KV bytes read / time; copy row: bytes read + written / time
    of_peak: float | None  # gb_s / the device's spec-sheet peak (None when the device is not in the table)
    of_copy: float | None  # gb_s / the measured copy bandwidth
    note: str


def peak_bandwidth(device: torch.device) -> float | None:
    """Spec-sheet memory bandwidth of `device` in bytes/s, or None when it is not a GPU in PEAK_BANDWIDTH."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device).lower()
    return next((peak for key, peak in PEAK_BANDWIDTH if key.lower() in name), None)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({torch.get_num_threads()} threads)"


def attention_bench(
    *,
    contexts: list[int],
    tree: int = 64,
    heads: int = 32,
    kv_heads: int = 8,
    head_dim: int = 128,
    dtype: str = "bfloat16",
    device: str = "auto",
    repeats: int = 20,
    seed: int = 0,
    step: Callable[[str], None] = NO_PROGRESS,
) -> list[AttentionRow]:
    """Per-call time of every attention method for each context length, after one copy reference row.

    Args:
        contexts: committed keys before the tree (the prefix length), one set of rows each.
        tree: draft nodes; the call has tree + 1 query rows (the root first), as the engine verifies.
        heads, kv_heads, head_dim: query heads, KV heads (GQA) and head size of one layer.
        dtype: float32 | bfloat16 | float16.
        device: auto | cpu | cuda | cuda:N.
        repeats: timed calls per method (median).
        step: hears each context as its calls start (`progress.py`).

    Returns:
        The copy row, then per context the full-attention methods, then the prefix part alone.
    """
    float_type = torch_dtype(dtype)
    check_contexts(contexts)
    check_range("--tree", tree, 1, MAX_TREE)
    check_range("--heads", heads, 1)
    check_range("--kv-heads", kv_heads, 1)
    check_range("--head-dim", head_dim, 1)
    check_range("--repeats", repeats, 1)
    if heads % kv_heads:
        raise SpecchatError(f"--heads ({heads}) must be a multiple of --kv-heads ({kv_heads})")
    dev = torch_device(device)
    timer = Timer(dev, repeats=repeats, warmup=WARMUP, cold_l2=True)
    mask = tree_batch(random_tree(tree, seed=seed), 0, 0, dev).tree_mask  # [n, n], n = tree + 1
    generator = torch.Generator(dev).manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, device=dev, dtype=float_type)

    copy_row, copy_rate = _copy_row(timer, dev)
    rows = [copy_row]
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex_attention warns on every uncompiled call
        for context in contexts:
            step(f"context {context}")
            q = randn(1, heads, tree + 1, head_dim)
            k = randn(1, kv_heads, context + tree + 1, head_dim)  # the tree's keys in the last tree + 1 slots
            v = randn(1, kv_heads, context + tree + 1, head_dim)
            rows += _context_rows(timer, q, k, v, context, mask, copy_rate)
            del q, k, v
    return rows


def _context_rows(timer, q, k, v, context: int, mask: torch.Tensor, copy_rate: float) -> list[AttentionRow]:
    """q `[1, Hq, n, D]`, k/v `[1, Hkv, context + n, D]` (the tree's keys last), mask `[n, n]`."""
    from specchat.kernels.attention import reference
    from specchat.kernels.attention.hybrid import hybrid_tree_attention, triton_hybrid_tree_attention, uses_triton

    device = q.device
    scale = q.shape[-1] ** -0.5
    n = q.shape[2]
    dense = torch.cat([torch.ones(n, context, dtype=torch.bool, device=device), mask], dim=1)  # [n, context + n]
    methods = {}  # name -> a builder of the call to time (FlexAttention's builds its block mask)
    if uses_triton(device):
        from specchat.kernels.attention.flash_decoding import flash_attn_available

        hybrid = functools.partial(triton_hybrid_tree_attention, q, k, v, context, mask, scale)
        methods["hybrid-triton"] = lambda: functools.partial(hybrid, prefix="triton")
        if flash_attn_available():
            methods["hybrid-flash"] = lambda: functools.partial(hybrid, prefix="flash")
    else:
        methods["hybrid-torch"] = lambda: functools.partial(hybrid_tree_attention, q, k, v, context, mask, scale)
    methods["sdpa-mask"] = lambda: functools.partial(
        F.scaled_dot_product_attention, q, k, v, attn_mask=dense, scale=scale, enable_gqa=True
    )
    methods["eager"] = lambda: functools.partial(_eager_attention, q, k, v, dense, scale)
    methods["flex"] = lambda: _flex_call(q, k, v, context, mask, scale)

    rows, outputs = [], {}
    for method, build in methods.items():
        row, outputs[method] = _measure(timer, context, method, build)
        rows.append(row)
    sdpa = rows[list(methods).index("sdpa-mask")]
    for row in rows:
        if row.us is not None and sdpa.us is not None:
            row.vs_sdpa = significant(sdpa.us / row.us)
        if row.method != "sdpa-mask" and outputs[row.method] is not None and outputs["sdpa-mask"] is not None:
            error = (outputs[row.method].float() - outputs["sdpa-mask"].float()).abs().max().item()
            row.note = _join(row.note, f"max abs diff vs sdpa {error:.0e}")
    if uses_triton(device):
        from specchat.kernels.attention.decode_attention import prefix_attention
        from specchat.kernels.attention.flash_decoding import flash_attn_available, flash_prefix_attention

        prefixes = {"prefix-triton": lambda: functools.partial(prefix_attention, q, k, v, context, scale)}
        if flash_attn_available():
            prefixes["prefix-flash"] = lambda: functools.partial(flash_prefix_attention, q, k, v, context, scale)
    else:
        k_p, v_p = k[:, :, :context], v[:, :, :context]
        prefixes = {"prefix-torch": lambda: functools.partial(reference.prefix_attention, q, k_p, v_p, scale)}
    kv_bytes = 2 * k.shape[1] * context * k.shape[-1] * k.element_size()
    peak = peak_bandwidth(device)
    for method, build in prefixes.items():
        row, _ = _measure(timer, context, method, build)
        if row.us is not None:
            rate = kv_bytes / (row.us * 1e-6)
            row.gb_s = significant(rate / 1e9)
            row.of_peak = significant(rate / peak) if peak else None
            row.of_copy = significant(rate / copy_rate)
            row.note = _join(f"{kv_bytes / 2**20:.2f} MiB of KV", row.note)
        rows.append(row)
    return rows


def _measure(timer, context: int, method: str, build) -> tuple[AttentionRow, torch.Tensor | None]:
    """Time `build()()`; any failure (compile error, out of memory) becomes an unavailable row, not a crash."""
    note = "uncompiled (unfused) off CUDA" if method == "flex" and timer.device.type != "cuda" else ""
    try:
        call = build()
        seconds = timer.seconds(call)
        out = call()
    except Exception as error:  # noqa: BLE001 - reported in the row
        if timer.device.type == "cuda":
            torch.cuda.empty_cache()
        reason = first_line(error)[:160]
        return AttentionRow(context, method, None, None, None, None, None, f"unavailable: {reason}"), None
    return AttentionRow(context, method, significant(seconds * 1e6), None, None, None, None, note), out


def _eager_attention(q, k, v, dense: torch.Tensor, scale: float) -> torch.Tensor:
    """transformers' eager attention: K/V repeated per query head, full scores, masked, fp32 softmax."""
    group = q.shape[1] // k.shape[1]
    keys, values = _repeat_kv(k, group), _repeat_kv(v, group)
    scores = torch.matmul(q, keys.transpose(2, 3)) * scale  # [1, Hq, n, context + n]
    scores = scores.masked_fill(~dense, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, values)


def _repeat_kv(x: torch.Tensor, group: int) -> torch.Tensor:
    batch, kv_heads, length, dim = x.shape
    return x[:, :, None].expand(batch, kv_heads, group, length, dim).reshape(batch, kv_heads * group, length, dim)


def _flex_call(q, k, v, context: int, mask: torch.Tensor, scale: float):
    """FlexAttention with a tree `mask_mod` (whole prefix visible, ancestors in the tree), compiled on CUDA."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx < context) | mask[q_idx, (kv_idx - context).clamp(min=0)]

    n = q.shape[2]
    block_mask = create_block_mask(mask_mod, None, None, n, context + n, device=q.device)
    attend = _compiled_flex() if q.device.type == "cuda" else flex_attention
    return lambda: attend(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True)


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def _copy_row(timer, device: torch.device) -> tuple[AttentionRow, float]:
    """The achievable bandwidth (bytes/s): a large device-to-device copy_, read + written bytes / time."""
    seconds, rate = copy_bandwidth(timer, device)
    size = COPY_BYTES[device.type]
    peak = peak_bandwidth(device)
    spec = f"peak {peak / 1e9:.0f} GB/s (spec sheet)" if peak else "peak unknown"
    note = f"{_device_name(device)}: copy_ of {size // 2**20} MiB; {spec}"
    row = AttentionRow(None, "copy", significant(seconds * 1e6), None, significant(rate / 1e9),
                       significant(rate / peak) if peak else None, 1.0, note)  # fmt: skip
    return row, rate


def _join(*parts: str) -> str:
    return "; ".join(part for part in parts if part)
