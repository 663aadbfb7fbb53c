"""The target's forward as the engine calls it, whichever decoder runs it.

`forward(tokens [q], positions [q], tree_mask [q, q] or None, cache, last_only=, every_layer=, feature_layers=)`
writes the rows' keys and values after the cache's committed prefix (pending until the caller commits them) and
returns a `ForwardOutput`: logits, the last layer's output before the final norm, its rotated queries (or every
layer's: what a drafter ranking each layer's keys asks for), and the residual stream entering the layers a drafter
reads (EAGLE-3 fuses a low, a middle and a high one). Two decoders implement it: the compiled CPU
decoder (`LeanForward`, canonical attention) and the torch decoder (`TorchForward`, hybrid attention), which on
a GPU replays the engine's forwards of up to 64 rows as CUDA graphs. The model's attention choice
(`use_attention`) picks one.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from specchat.architectures import parts
from specchat.engine.attention import attention_of
from specchat.engine.cache import TreeCache
from specchat.engine.cuda_graphs import BUCKETS, GraphedDecoder
from specchat.engine.forward_output import ForwardOutput
from specchat.engine.lean_forward import LeanForward, lean_forward, serves
from specchat.engine.torch_decoder import TorchDecoder, refusal
from specchat.kernels.cpu.cpu_decoder import DENSE_PRODUCT, cpu_decoder
from specchat.quant.quantized_linear import QuantizedLinear


class TargetForward(Protocol):
    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor | None,
                 cache: TreeCache, *, last_only: bool = False, every_layer: bool = False,
                 feature_layers: tuple[int, ...] = ()) -> ForwardOutput: ...  # fmt: skip


class TorchForward:
    """The torch decoder over the engine's cache (`cache`) or another one with the same shapes (a drafter's
    copy). On a GPU, forwards over the engine's cache that fit a row bucket replay CUDA graphs, captured on the
    first one, and so does a drafter's one-row forward over its own cache (TokenSwift's over its partial cache);
    their outputs are copied out of the graphs' buffers, which the next replay overwrites."""

    def __init__(self, model, cache: TreeCache):
        # rotary tables for every position (training shifts them), LongRoPE's factors for this cache's capacity
        self.decoder = TorchDecoder.from_model(model, capacity=cache.max_len)
        self.cache = cache
        self.graphed = model.device.type == "cuda"
        self.graphs: dict[tuple[int, ...], GraphedDecoder] = {}  # per set of feature layers read
        self.draft_graph: GraphedDecoder | None = None  # over the last drafter's cache seen (one holds it alive)

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor | None,
                 cache: TreeCache, *, last_only: bool = False, every_layer: bool = False,
                 feature_layers: tuple[int, ...] = ()) -> ForwardOutput:  # fmt: skip
        decoder = self.decoder
        cache.allocate(decoder.kv_heads, decoder.head_dim, decoder.dtype, decoder.device)
        cache.claim(tokens.shape[0])
        graphs = self._graphs(cache, tokens.shape[0], feature_layers) if self.graphed and not every_layer else None
        if graphs is None:
            return decoder(tokens, positions, cache, tree_mask, last_only=last_only, every_layer=every_layer,
                           feature_layers=feature_layers)  # fmt: skip
        out = graphs(tokens, positions, tree_mask)
        logits = out.logits[-1:] if last_only else out.logits
        return ForwardOutput(logits.clone(), out.hidden.clone(), out.queries.clone(), out.features.clone())

    def _graphs(self, cache: TreeCache, rows: int, feature_layers: tuple[int, ...]) -> GraphedDecoder | None:
        """The graphs a forward of `rows` rows over `cache` replays, captured on first use: the engine's cache's,
        one per row bucket (while a bucket's pad rows fit after its length), or a drafter's cache's one-row graph;
        None where none serves (the forward then runs as called: a prefill, a text embedded over a cache of its own)."""
        if cache is self.cache:
            graphs = self.graphs.get(feature_layers)
            if rows > BUCKETS[-1] or (graphs is None and cache.length + BUCKETS[-1] > cache.max_len):
                return None
            if graphs is None:
                graphs = GraphedDecoder(self.decoder, cache, feature_layers=feature_layers)
                self.graphs[feature_layers] = graphs
            return graphs
        if rows > 1 or feature_layers or not 0 < cache.length < cache.max_len:  # a draft forward after a context
            return None
        if self.draft_graph is None or self.draft_graph.cache is not cache:
            self.draft_graph = GraphedDecoder(self.decoder, cache, buckets=(1,))
        return self.draft_graph


def canonical(model) -> bool:
    """Whether the CPU decoder is to run `model`: chosen (canonical), or by auto where it serves the model and each
    of its products computes a row on its own (`rows_apart`), or where the torch decoder cannot run it (Gemma 3)."""
    choice = attention_of(model)
    automatic = choice == "auto" and (rows_apart(model) or refusal(model.config))
    return (choice == "canonical" or automatic) and serves(model)


def rows_apart(model) -> bool:
    """Whether the CPU decoder's products compute each row of `model`'s on its own, as exact speculation needs: on
    quantized matrices, and on dense ones where it has a dense product of its own (`DENSE_PRODUCT`, any width; bf16,
    fp16 and fp32 activations); ATen's products sum in an order that depends on the rows sharing the call."""
    return DENSE_PRODUCT or not any(type(module) is nn.Linear for module in model.modules())


def held_kv_cache(model, kv_cache: str) -> str:
    """`kv_cache` made concrete: auto holds the keys and values in bf16 beside fp32 activations where the CPU
    decoder runs quantized weights (as llama.cpp keeps an f16 cache beside f32 activations: half the bytes a long
    context reads, and a rounding the weights' own error dwarfs), else in the activations' dtype."""
    if kv_cache != "auto" or model.dtype != torch.float32 or not canonical(model):
        return kv_cache
    return "bf16" if any(isinstance(module, QuantizedLinear) for module in model.modules()) else kv_cache


def target_forward(model, cache: TreeCache) -> LeanForward | TorchForward:
    """The forward of `model` over `cache`: the CPU decoder where it is to run it and builds here, else the torch
    decoder. Its RoPE is fitted to the cache's capacity first (LongRoPE's factors)."""
    for rotary in parts(model).rotaries:
        if hasattr(rotary, "fit"):
            rotary.fit(cache.max_len)
    lean = lean_forward(model) if canonical(model) else None
    return lean if lean is not None else TorchForward(model, cache)


def forward_path(model) -> str:
    """Which decoder runs `model`, for reports and calibration keys: the CPU decoder, the instruction set its
    kernels use and its threads, or the torch decoder on the model's device (with CUDA graphs on a GPU)."""
    count = torch.get_num_threads()
    threads = f", {count} thread{'s' if count > 1 else ''}"
    if canonical(model):
        try:
            return f"CPU decoder, {cpu_decoder().isa()}{threads}"
        except RuntimeError:
            pass
    device = model.device.type
    return f"torch decoder, {device}{' + CUDA graphs' if device == 'cuda' else threads}"
