"""`--quantize q4_k_m` / `q8_0`: a checkpoint's matrices written as GGUF blocks when it loads, each of the type
llama-quantize gives it, so that the model runs on the kernels a GGUF file runs on (its trees cost what a GGUF
file's do, where torch's int4 kernel computes each extra row in full).

The blocks come out of ggml's reference searches (`kernels/cpu/gguf/quantize.h`). Q4_K_M, as llama.cpp names it:
Q4_K, but Q6_K for the LM head and for attn_v and ffn_down in the first and last eighth of the layers and every third
layer between; the token embedding Q4_K, or where the head is tied to it one Q6_K table for both. A matrix whose rows
are no whole number of 256-value groups falls back to Q5_0 (Q6_K's to Q8_0), as llama.cpp's do. Q8_0: every matrix,
the embedding and the head included. Norms and biases stay dense in the activation dtype.

The blocks are kept in specchat's cache (`quantized/`, the size of the quantized model) under the files they came
from: a second load of the same checkpoint reads them, mapped, in the time a GGUF file of them would take.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from specchat.architectures import parts
from specchat.quant.gguf_linear import GGUFEmbedding, GGUFLinear, block_kernels
from specchat.quant.gguf_types import BLOCK_TYPES, Q4_K, Q5_0, Q6_K, Q8_0
from specchat.quant.kept_tensors import KeptTensors, kept_tensors

SCHEMES = {"q4_k_m": (Q4_K, Q6_K), "q8_0": (Q8_0, Q8_0)}  # (most matrices, those given more bits)
FALLBACK = {Q4_K: Q5_0, Q6_K: Q8_0}  # where rows are no whole number of 256-value groups
QUANTIZER = Path(__file__).parents[1] / "kernels" / "cpu" / "gguf" / "quantize.h"


def more_bits(layer: int, layers: int) -> bool:
    """Whether a layer's attn_v and ffn_down get the more precise type: llama.cpp's `use_more_bits`."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def block_type(type_id: int, columns: int) -> int | None:
    """`type_id`, or its fallback where a row of `columns` is no whole number of its blocks; None: none fits."""
    if columns % BLOCK_TYPES[type_id].values:
        type_id = FALLBACK.get(type_id, type_id)
    return type_id if columns % BLOCK_TYPES[type_id].values == 0 else None


def quantize_to_gguf(model: nn.Module, scheme: str, *, dtype: torch.dtype, source: list[Path] | None = None) -> None:
    """Replace `model`'s linear layers, embedding and LM head in place by GGUF blocks of `scheme`'s types; `dtype`
    is the activation dtype. Given the files the weights were read from (`source`), the blocks are kept on disk and
    read back, mapped, when the same files are quantized again (`kept_tensors.py`)."""
    base, more = SCHEMES[scheme]
    # kept under the files the weights came from, the scheme and the quantizer's code
    code = [Path(__file__), QUANTIZER]
    kept = kept_tensors("quantized", scheme, source, code, scheme) if source else KeptTensors(None)
    names = {id(module): name for name, module in model.named_modules()}
    decoder = parts(model)
    layers = decoder.layers
    for index, layer in enumerate(layers):
        precise = {id(layer.v), id(layer.down)} if more_bits(index, len(layers)) else set()
        for name, linear in list(layer.module.named_modules()):
            if isinstance(linear, nn.Linear):
                held = _blocks(kept, names[id(linear)], linear.weight, more if id(linear) in precise else base)
                if held is not None:
                    bias = None if linear.bias is None else linear.bias.detach()
                    layer.module.set_submodule(name, GGUFLinear(*held, linear.in_features, dtype=dtype, bias=bias))
    embed, head = decoder.embed, decoder.head
    tied = isinstance(head, nn.Linear) and head.weight.data_ptr() == embed.weight.data_ptr()
    head_blocks = _blocks(kept, names[id(head)], head.weight, more) if isinstance(head, nn.Linear) else None
    if tied and head_blocks is not None:
        embed_blocks, embed_type = head_blocks
    else:
        embed_blocks, embed_type = _blocks(kept, names[id(embed)], embed.weight, base) or (None, None)
    if embed_blocks is not None:
        embed = GGUFEmbedding(embed_blocks, embed_type, embed.embedding_dim, dtype=dtype,
                              scale=getattr(embed, "scale", 1.0))  # fmt: skip
    if head_blocks is not None:
        head = GGUFLinear(*head_blocks, head.in_features, dtype=dtype, bias=head.bias)
    decoder.share_embedding_and_head(embed, head)
    kept.save()


def _blocks(kept: KeptTensors, name: str, weight: torch.Tensor, type_id: int) -> tuple[torch.Tensor, int] | None:
    """`weight` [rows, columns] as blocks of `type_id` (or its fallback) and that type; None where none fits."""
    kind = block_type(type_id, weight.shape[1])
    if kind is None:
        return None
    return kept.tensors(name, lambda: {"blocks": block_kernels().gguf_quantize(weight.detach(), kind)})["blocks"], kind
