"""`specchat bench verify-cost`: a decode forward vs tree-verification forwards at fixed context lengths, exactly
as the engine runs them: of a real model through the engine's own forward (`--model`), or of a model with
Llama-3.1-8B's shapes and random weights."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch

from specchat.architectures import parts
from specchat.bench.bandwidth import copy_bandwidth, weight_bytes
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
from specchat.engine.cache import token_bytes
from specchat.engine.timing import Timer
from specchat.engine.verify_forward import verification_forward
from specchat.errors import SpecchatError

FILL_CHUNK = 4096  # random KV slots written into the cache per update


@dataclass
class VerifyCostRow:
    context: int  # committed tokens in the cache
    tree: int  # draft nodes verified (the forward has tree + 1 rows)
    layers: int  # decoder layers of the model timed
    forward: str  # the decoder that ran it (`forward_path`)
    decode_ms: float  # one-token forward
    verify_ms: float  # forward over the root and the tree
    verify_over_decode: float


def random_model(config, dtype: torch.dtype, device: torch.device, attention: str, *, seed: int = 0):
    """A model of `config` with random weights, built on the device in `dtype` (never materialised in fp32 on the
    CPU), verifying with `attention`."""
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    from specchat.engine.attention import use_attention

    with device, no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.eval().requires_grad_(False)
    _fill_random(model, seed, std=getattr(config, "initializer_range", 0.02))
    use_attention(model, attention)
    return model


def _fill_random(model, seed: int, *, std: float) -> None:
    """Every matrix filled with one seeded block of N(0, std) values, repeated: random weights at memory speed
    (drawing 8B's 1G embedding and head values one by one took ~17 s on a CPU; timings do not depend on which
    random values they are). Norm scales keep their constructor's ones."""
    pool = torch.randn(1 << 20, generator=torch.Generator().manual_seed(seed)) * std
    pool = pool.to(next(model.parameters()).device)
    for parameter in model.parameters():
        if parameter.dim() < 2:
            continue
        flat = parameter.view(-1)
        for start in range(0, flat.numel(), pool.numel()):
            part = flat[start : start + pool.numel()]
            part.copy_(pool[: part.numel()])


def with_layers(config, layers: int | None):
    """`config` cut to its first `layers` decoder layers (all when None)."""
    if layers is not None:
        check_range("--layers", layers, 1, config.num_hidden_layers)
        config.num_hidden_layers = layers
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types[:layers]
    return config


def llama31_8b_config():
    """A transformers LlamaConfig with Llama-3.1-8B's shapes (no weights are fetched)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        num_hidden_layers=32,
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        bos_token_id=128000,
        eos_token_id=128001,
        tie_word_embeddings=False,
    )


def verify_cost(
    *,
    contexts: list[int],
    tree: int = 64,
    layers: int | None = None,
    dtype: str = "bfloat16",
    device: str = "auto",
    attention: str = "auto",
    repeats: int = 5,
    config=None,
    seed: int = 0,
    step: Callable[[str], None] = NO_PROGRESS,
) -> list[VerifyCostRow]:
    """Milliseconds of a decode forward and of a tree-verification forward, at each context length.

    The model has random weights, built on the device in `dtype` (never materialised in fp32 on the CPU).
    The cache is filled with random keys/values written into its preallocated layers (no prefill: timing
    does not depend on the values). Forwards are the engine's own (`target_forward`, `verify_forward`):
    `tree_batch`, the tree's mask, explicit position ids, logits for every row; inputs and masks
    are built before timing, and each forward is rolled back, so the context stays fixed. Decode and verify
    forwards alternate; wall time, device synced, the median of `repeats` after a warm-up.

    Args:
        contexts: committed tokens in the cache, one row each.
        tree: draft nodes of the random tree verified (the forward has tree + 1 rows).
        layers: decoder layers to build (default: all of the config's); fewer make CPU runs feasible.
        attention: auto | canonical | hybrid (specchat.engine.attention.use_attention).
        config: a transformers config to build instead of Llama-3.1-8B's (tests pass a tiny one).
    """
    from specchat.engine.attention import check_attention
    from specchat.engine.cache import TreeCache
    from specchat.engine.target_forward import forward_path, target_forward

    float_type = torch_dtype(dtype)
    check_attention(attention)
    check_contexts(contexts)
    check_range("--tree", tree, 1, MAX_TREE)
    check_range("--repeats", repeats, 1)
    config = with_layers(copy.deepcopy(config if config is not None else llama31_8b_config()), layers)
    window = config.max_position_embeddings
    if max(contexts) + tree + 1 > window:
        raise SpecchatError(f"--context must leave room for the tree: at most {window - tree - 1} here")
    dev = torch_device(device)
    model = random_model(config, float_type, dev, attention, seed=seed)
    name = forward_path(model)
    draft = random_tree(tree, seed=seed, vocab=config.vocab_size)
    cache = TreeCache(config.num_hidden_layers, max(contexts) + tree + 1)
    target = target_forward(model, cache)
    timer = Timer(dev, repeats=repeats, warmup=WARMUP)

    def forward(tokens, *, positions, tree_mask):
        return target(tokens, positions, tree_mask, cache)

    rows = []
    with torch.inference_mode():
        for context in contexts:
            step(f"context {context}")
            fill_cache(cache, context, config, float_type, dev)
            calls = {
                kind: verification_forward(forward, cache, dev, tree=nodes, root_token=1)
                for kind, nodes in (("decode", 0), ("verify", draft))
            }
            seconds = timer.seconds_each(calls)
            decode_s, verify_s = seconds["decode"], seconds["verify"]
            rows.append(
                VerifyCostRow(
                    context=context,
                    tree=tree,
                    layers=config.num_hidden_layers,
                    forward=name,
                    decode_ms=significant(decode_s * 1e3),
                    verify_ms=significant(verify_s * 1e3),
                    verify_over_decode=significant(verify_s / decode_s),
                )
            )
    return rows


def fill_cache(cache, length: int, config, dtype: torch.dtype, device: torch.device) -> None:
    """Bring the cache to `length` committed positions, appending random keys/values through the layers' own
    update + commit (going back when it holds more, from the start where a sliding window cannot)."""
    cache.truncate(cache.reach(length))
    kv_heads = config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    cache.allocate(kv_heads, head_dim, dtype, device)
    while cache.length < length:
        chunk = min(FILL_CHUNK, cache.rows_per_forward, length - cache.length)
        for layer in cache.layers:
            keys, values = torch.randn(2, 1, kv_heads, chunk, head_dim, dtype=dtype, device=device)
            layer.update(keys, values)
        cache.commit()


@dataclass
class ModelVerifyCostRow:
    kv_cache: str  # the target's KV cache: "auto" (the activations' dtype) or "int8"
    context: int  # committed tokens in the cache
    nodes: int  # draft nodes below the root (0: a decode step)
    ms: float  # one forward over the root and the nodes
    over_decode: float  # ms / a decode step's ms at this context
    gb_s: float | None  # a decode step: the weights and the cache's keys and values it reads / its time
    of_copy: float | None  # gb_s / a large copy's rate (read + written bytes / time) on this device


def model_verify_cost(engine, *, contexts: list[int], trees: list[int], repeats: int = 5) -> list[ModelVerifyCostRow]:
    """Milliseconds of the engine's forward over a chain of each size in `trees` (0 = a decode step) at each
    context, its cache filled with random keys and values (timing does not depend on them); a decode step's
    bytes (weights and cache) per second against a copy's."""
    check_contexts(contexts)
    for nodes in trees:
        check_range("--tree", nodes, 0, MAX_TREE)
    config, cache, device = engine.model.config, engine.cache, engine.device
    if max(contexts) + max(trees) + 1 > cache.max_len:
        raise SpecchatError(f"--context must leave room for the tree: at most {cache.max_len - max(trees) - 1} here")
    timer = Timer(device, repeats=repeats, warmup=WARMUP)
    _, copy_rate = copy_bandwidth(timer, device)
    weights, per_token = weight_bytes(engine.model), token_bytes(engine.model, cache.kv_cache)
    sizes = sorted(set(trees) | {0})
    rows = []
    with torch.inference_mode():
        for context in contexts:
            fill_cache(cache, context, config, engine.model.dtype, device)
            calls = {nodes: verification_forward(engine._forward, cache, device, tree=nodes) for nodes in sizes}
            seconds = timer.seconds_each(calls)
            rate = (weights + cache_read(engine.model, context, per_token)) / seconds[0]
            for nodes in trees:
                decode = nodes == 0
                rows.append(ModelVerifyCostRow(
                    cache.kv_cache, context, nodes, significant(seconds[nodes] * 1e3),
                    significant(seconds[nodes] / seconds[0]), significant(rate / 1e9) if decode else None,
                    significant(rate / copy_rate) if decode else None,
                ))  # fmt: skip
    return rows


def cache_read(model, context: int, per_token: int) -> int:
    """The cache's bytes a decode step at `context` reads (`per_token` over every layer): each layer's keys and
    values within its window (Gemma 3's sliding layers read at most that many)."""
    windows = [layer.window or context for layer in parts(model).layers]
    return sum(min(context, window) for window in windows) * per_token // len(windows)
