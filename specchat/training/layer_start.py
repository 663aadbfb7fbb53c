"""A LongSpec draft layer's start from the target's last decoder layer, instead of from random weights.

The draft's cross-attention reads that layer's keys and values, and its output goes into the LM head that reads
that layer's output: the last layer's projections already map into both spaces. Its query projections serve the
draft's self- and cross-attention alike, its input norm both pre-attention norms, its post-attention norm the
pre-MLP one. A narrower draft MLP keeps the target's neurons of largest |gate| x |up| x |down| (row and column
norms), in their order. A qwen3 target's per-head query and key norms have no place in the draft layer and are
left out: its start is then only near the target's.
"""

from __future__ import annotations

import torch
from torch import nn

from specchat.architectures import parts
from specchat.models.longspec import LongSpecLayer
from specchat.quant.quantized_linear import dense_weight


@torch.no_grad()
def start_from_last_layer(layer: LongSpecLayer, model) -> None:
    """Overwrite `layer`'s weights with the target `model`'s last decoder layer's (dequantized where quantized)."""
    last = parts(model).layers[-1]
    own, cross = layer.self_attn, layer.cross_attn
    for draft, target in ((own.q_proj, last.q), (own.k_proj, last.k), (own.v_proj, last.v), (own.o_proj, last.o),
                          (cross.q_proj, last.q), (cross.o_proj, last.o)):  # fmt: skip
        _copy_linear(draft, target)
    gate, up = (getattr(last.mlp, name) for name in ("gate_proj", "up_proj"))
    gate, up, down = dense_weight(gate), dense_weight(up), dense_weight(last.down)
    width = layer.config.intermediate_size
    kept = (gate.float().norm(dim=1) * up.float().norm(dim=1) * down.float().norm(dim=0)).topk(width).indices.sort().values
    layer.mlp.gate_proj.weight.copy_(gate[kept])
    layer.mlp.up_proj.weight.copy_(up[kept])
    layer.mlp.down_proj.weight.copy_(down[:, kept])
    for draft_norm, target_norm in ((layer.input_layernorm, last.input_norm),
                                    (layer.post_self_attention_layernorm, last.input_norm),
                                    (layer.post_cross_attention_layernorm, last.post_attention_norm)):  # fmt: skip
        draft_norm.weight.copy_(target_norm.weight)


def _copy_linear(draft: nn.Linear, target: nn.Module) -> None:
    draft.weight.copy_(dense_weight(target))
    if draft.bias is not None:
        bias = getattr(target, "bias", None)
        draft.bias.copy_(bias if bias is not None else torch.zeros_like(draft.bias))
