"""A Llama-family decoder of our own in torch (llama, mistral, qwen2, qwen3, phi3, granite, smollm3): the target's
forward wherever the compiled CPU decoder does not run it (GPUs, fp32 activations).

transformers' modules cost about 1000 kernel launches per forward and cannot be captured whole (their cache
and mask code runs on the host). Here a layer is four matmuls over fused weights (q/k/v and gate/up each one
matrix; the residual added inside the output projections' matmuls) and four custom ops (`decoder_ops`): RMSNorm,
RoPE with the KV write, tree attention, SiLU-and-multiply. Everything a forward reads (tokens, positions,
tree mask, the cache's length) is a tensor, so a CUDA graph of it replays at any context length
(`specchat.engine.cuda_graphs`), and `torch.compile(fullgraph=True)` traces it without a break.

On CUDA a forward of up to 2 * PIECE rows (a decode step, a verification) multiplies its rows zero-padded to PIECE
rows a product, one or two: cuBLAS picks its kernel, and with it the order a row's sums run in, by the row count, so
a verified row gets the decode step's bits only at one count (at a fixed count a row's bits depend on nothing else).

transformers supplies the config and the weights (`from_model`); a quantized projection or embedding is called
as the module it is (its own kernel), a dense one is multiplied here.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specchat.architectures import parts
from specchat.architectures.rope import attention_scaling, inverse_frequencies, rope_parameters, uses_long_factors
from specchat.engine import decoder_ops as ops
from specchat.engine.attention import sliding_window
from specchat.engine.cache import TreeCache
from specchat.engine.forward_output import ForwardOutput
from specchat.errors import SpecchatError
from specchat.quant.fused import fuse_projections

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "granite", "smollm3")
PIECE = 64  # rows of every product of a decode step or a verification on CUDA
Projection = torch.Tensor | nn.Module  # a dense weight [out, in], or a layer computing x -> x W^T (+ bias)


@dataclass
class Layer:
    input_norm: torch.Tensor
    qkv: Projection  # q, k, v stacked: [(Hq + 2 Hkv) D, hidden]
    qkv_bias: torch.Tensor | None  # qwen2's (a dense projection's; a module adds its own)
    qk_norm: torch.Tensor | None  # qwen3's per-head norms [2, D]: queries', keys'
    o: Projection
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: Projection  # [2 I, hidden]: gate, then up
    gate_up_bias: torch.Tensor | None
    down: Projection
    down_bias: torch.Tensor | None
    rotates: bool = True  # False: a NoPE layer (SmolLM3's), rotated by the identity


class TorchDecoder:
    def __init__(self, config, layers: list[Layer], embed: Projection, norm: torch.Tensor, head: Projection,
                 *, dtype: torch.dtype, device: torch.device, max_positions: int | None = None,
                 capacity: int | None = None, scale: float | None = None):  # fmt: skip
        check_config(config)
        self.config = config
        self.layers = layers
        self.embed, self.norm, self.head = embed, norm, head
        self.dtype, self.device = dtype, device
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = config.rms_norm_eps
        self.scale = scale or self.head_dim**-0.5
        # Granite's multipliers (1 elsewhere): the embedding's rows, each half's output, the logits (divided)
        self.embedding_scale = getattr(config, "embedding_multiplier", 1.0)
        self.residual_scale = getattr(config, "residual_multiplier", 1.0)
        self.logit_scale = getattr(config, "logits_scaling", 1.0)
        positions = torch.arange(max_positions or config.max_position_embeddings, device=device).float()
        rope = rope_parameters(config)
        long = capacity is not None and uses_long_factors(rope, capacity)  # LongRoPE's, for a cache this large
        angles = positions[:, None] * inverse_frequencies(rope, self.head_dim, long=long).to(device)[None]
        scaling = attention_scaling(rope, config.max_position_embeddings)  # YaRN's temperature, LongRoPE's, else 1
        self.cos, self.sin = angles.cos() * scaling, angles.sin() * scaling  # [max_positions, D / 2], fp32
        # a NoPE layer's tables (SmolLM3's): cos 1 and sin 0 give its queries and keys back bit for bit
        nope = not all(layer.rotates for layer in layers)
        self.identity = (torch.ones_like(self.cos), torch.zeros_like(self.sin)) if nope else None

    @classmethod
    def from_model(cls, model: nn.Module, **kwargs) -> TorchDecoder:
        """From a loaded transformers model of the Llama family, its weights shared: q/k/v and gate/up are fused
        in place (`fuse_projections`, as the CPU decoder fuses them), so no weight is held twice."""
        decoder = parts(model)
        layers = []
        for layer in decoder.layers:
            qkv = _projection(fuse_projections(layer.attention, layer.qkv_names))
            gate_up = _projection(fuse_projections(layer.mlp, layer.gate_up_names))
            norms = layer.q_norm, layer.k_norm
            layers.append(
                Layer(
                    input_norm=layer.input_norm.weight,
                    qkv=qkv[0],
                    qkv_bias=qkv[1],
                    qk_norm=None if norms[0] is None else torch.stack([norm.weight for norm in norms]),
                    o=_projection(layer.o)[0],
                    o_bias=_projection(layer.o)[1],
                    post_norm=layer.mlp_norm.weight,
                    gate_up=gate_up[0],
                    gate_up_bias=gate_up[1],
                    down=_projection(layer.down)[0],
                    down_bias=_projection(layer.down)[1],
                    rotates=layer.rotates,
                )
            )
        embed = decoder.embed.weight if type(decoder.embed) is nn.Embedding else decoder.embed
        head, _ = _projection(decoder.head)
        return cls(model.config, layers, embed, decoder.norm.weight, head, dtype=model.dtype, device=model.device,
                   scale=decoder.layers[0].scaling, **kwargs)  # fmt: skip

    def new_cache(self, capacity: int) -> TreeCache:
        """An allocated cache of `capacity` slots for this decoder."""
        cache = TreeCache(len(self.layers), capacity)
        cache.allocate(self.kv_heads, self.head_dim, self.dtype, self.device)
        return cache

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, cache: TreeCache,
                 tree_mask: torch.Tensor | None = None, *, last_only: bool = False,
                 every_layer: bool = False, feature_layers: tuple[int, ...] = ()) -> ForwardOutput:  # fmt: skip
        """`tokens` [rows] at `positions` [rows], their keys and values written after the cache's committed prefix
        (whose length is read from `cache.length_tensor`; the bookkeeping is the caller's: `cache.claim`).
        `tree_mask` [rows, rows] bool (True: row may attend column, the diagonal included) makes it a tree
        verification; without one the rows are causal (one row: a decode step; several: a prefill). Queries: the
        last layer's, or with `every_layer` every layer's. Features: the residual stream entering each of
        `feature_layers` (the layer count: the last layer's output), side by side."""
        with _row_independent_products(self.device, self.dtype):
            return self._forward(tokens, positions, cache, tree_mask, last_only, every_layer, feature_layers)

    def _forward(self, tokens, positions, cache, tree_mask, last_only, every_layer, feature_layers) -> ForwardOutput:
        rows = tokens.shape[0]
        causal = tree_mask is None
        if causal:
            tree_mask = torch.ones(rows, rows, dtype=torch.bool, device=tokens.device).tril_()
        length = cache.length_tensor
        x = F.embedding(tokens, self.embed) if isinstance(self.embed, torch.Tensor) else self.embed(tokens)
        x = x if self.embedding_scale == 1.0 else x * self.embedding_scale
        width = _width(rows, x.device)
        x = _padded(x, width)
        queries, features = [], {}
        for i, layer in enumerate(self.layers):
            if i in feature_layers:
                features[i] = x[:rows]
            h = ops.rms_norm(x, layer.input_norm, self.eps)
            qkv = _linear(h, layer.qkv, layer.qkv_bias)[:rows]
            cos, sin = (self.cos, self.sin) if layer.rotates else self.identity
            q = ops.rope_write(qkv, positions, cos, sin, length, cache.keys, cache.values, i, layer.qk_norm, self.eps)
            if every_layer:
                queries.append(q)
            attended = ops.tree_attention(q, cache.keys, cache.values, i, length, tree_mask, self.scale, causal, width)
            x = _add_projection(x, attended.view(width, -1), layer.o, layer.o_bias, self.residual_scale)
            h = ops.rms_norm(x, layer.post_norm, self.eps)
            gated = ops.silu_mul(_linear(h, layer.gate_up, layer.gate_up_bias))
            x = _add_projection(x, gated, layer.down, layer.down_bias, self.residual_scale)
        x = x[:rows]
        features[len(self.layers)] = x
        last = x[-1:] if last_only else x
        normed = ops.rms_norm(_padded(last, _width(len(last), x.device)), self.norm, self.eps)
        kept = torch.cat([features[i] for i in feature_layers], dim=-1) if feature_layers else x[:, :0]
        logits = _linear(normed, self.head)[: len(last)]
        logits = logits if self.logit_scale == 1.0 else logits / self.logit_scale
        return ForwardOutput(logits, x, torch.stack(queries) if every_layer else q, kept)


def _projection(module: nn.Module) -> tuple[Projection, torch.Tensor | None]:
    """(what `_linear` multiplies by, its bias): a dense layer's weight and bias, else the layer itself."""
    if type(module) is nn.Linear:
        return module.weight, module.bias
    return module, None


@contextmanager
def _row_independent_products(device: torch.device, dtype: torch.dtype):
    """Where a forward's products run: on a CPU in bf16 / fp16, ATen's own kernels, which sum each row in the same
    order whatever rows share the call. oneDNN's (torch's default there) choose a kernel by the row count, so a
    verified row's sums differ from the decode step's (seen on an Ice Lake Xeon's AVX-512 without BF16, at every
    shape of a real layer); fp32 products and CUDA's are left as they are."""
    if device.type != "cpu" or dtype not in (torch.bfloat16, torch.float16):
        yield
        return
    enabled = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = enabled


FEW_ROWS = range(2, 17)


def _streams_weight(x: torch.Tensor) -> bool:
    """Whether `x`'s product takes `(W x^T)^T`: 2-16 rows in fp32 on a CPU, where torch's kernel for a few rows
    repacks all of W (1.5-3.5x a single row's time; a verification forward is a few rows) and this streams W once."""
    return x.shape[0] in FEW_ROWS and x.device.type == "cpu" and x.dtype == torch.float32


def _width(rows: int, device: torch.device) -> int:
    """Rows a forward of `rows` multiplies: on CUDA up to 2 * PIECE of them padded to whole pieces (a prefill's
    more as they are), elsewhere as they are (a CPU's products keep rows apart)."""
    if device.type != "cuda" or rows > 2 * PIECE:
        return rows
    return -(-rows // PIECE) * PIECE


def _padded(x: torch.Tensor, rows: int) -> torch.Tensor:
    """`x` [r, width] with zero rows after its own up to `rows`."""
    return x if x.shape[0] == rows else F.pad(x, (0, 0, 0, rows - x.shape[0]))


def _pieces(x: torch.Tensor) -> bool:
    """Whether `x`'s product runs PIECE rows at a time: two pieces of a padded forward on CUDA."""
    return x.device.type == "cuda" and x.shape[0] == 2 * PIECE


def _linear(x: torch.Tensor, projection: Projection, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x W^T (+ bias)` of `x` [rows, in]."""
    if not isinstance(projection, torch.Tensor):
        return projection(x)
    if _streams_weight(x):
        out = (projection @ x.T).T.contiguous()
        return out if bias is None else out + bias
    if _pieces(x):
        return torch.cat([F.linear(piece, projection, bias) for piece in x.split(PIECE)])
    return F.linear(x, projection, bias)


def _add_projection(residual: torch.Tensor, x: torch.Tensor, projection: Projection, bias: torch.Tensor | None,
                    scale: float = 1.0) -> torch.Tensor:  # fmt: skip
    """`residual + scale (x W^T (+ bias))`; a dense product adds the residual in the matmul itself (one kernel)."""
    if not isinstance(projection, torch.Tensor) or _streams_weight(x) or (bias is not None and scale != 1.0):
        out = _linear(x, projection, bias)
        return residual + (out if scale == 1.0 else out * scale)
    if _pieces(x):
        out = torch.cat([torch.addmm(r, piece, projection.t(), alpha=scale)
                         for r, piece in zip(residual.split(PIECE), x.split(PIECE))])  # fmt: skip
    else:
        out = torch.addmm(residual, x, projection.t(), alpha=scale)
    return out if bias is None else out + bias


def refusal(config) -> str | None:
    """Why this decoder does not compute `config`'s model exactly, or None where it does."""
    family = config.model_type
    if family not in FAMILIES:
        return f"the torch decoder runs {', '.join(FAMILIES)} models, not {family} (GPUs, fp32)"
    if config.hidden_act != "silu":
        return f"the torch decoder runs SiLU MLPs, not {config.hidden_act}"
    if sliding_window(config):
        return "the torch decoder has no sliding-window attention"
    if rope_parameters(config).get("partial_rotary_factor", 1.0) != 1.0:
        return "the torch decoder rotates whole heads (partial_rotary_factor 1)"
    return None


def check_config(config) -> None:
    """A one-line error for a config this decoder does not compute exactly."""
    if reason := refusal(config):
        raise SpecchatError(reason)
