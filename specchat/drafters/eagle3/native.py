"""EAGLE-3's draft layer inside the compiled CPU decoder: a depth's rows and their logits in one call.

A draft depth is a few rows. Run as torch operations (the norms, the fused projections, rotary, attention over
the draft's cache, the MLP, the head) it is ~40 calls whose overhead costs more than its matmuls; the CPU decoder
runs the same layer with the kernels and loops the target's layers use (`Eagle3Layer` in
`kernels/cpu/decoder.cpp`), on the same weights (quantized or dense).
"""

from __future__ import annotations

import warnings

import torch

from specchat.drafters.eagle3.model import Eagle3Draft
from specchat.engine.lean_forward import HEAD_DIMS, native_projection
from specchat.kernels.cpu.cpu_decoder import cpu_decoder


class NativeEagle3:
    def __init__(self, native, draft: Eagle3Draft):
        """`draft`: fused (`Eagle3Draft.fused`), in the activations' dtype, its linears quantized or dense."""
        config, layer = draft.config, draft.midlayer
        decoder = native.Decoder(
            [native.Layer(native_projection(native, layer.self_attn.qkv_proj),
                          native_projection(native, layer.self_attn.o_proj),
                          native_projection(native, layer.mlp.gate_up_proj),
                          native_projection(native, layer.mlp.down_proj),
                          layer.hidden_norm.weight.detach(), layer.post_attention_layernorm.weight.detach())],
            draft.norm.weight.detach(), config.num_attention_heads, config.num_key_value_heads, config.head_dim,
            config.intermediate_size, config.rms_norm_eps, config.head_dim**-0.5,
        )  # fmt: skip
        self.native = native
        embed_norm, head = layer.input_layernorm.weight.detach(), native_projection(native, draft.lm_head)
        self.layer = native.Eagle3Layer(decoder, embed_norm, head, config.norm_before_residual)
        self.draft = draft

    def __call__(self, hidden: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor, keys: torch.Tensor,
                 values: torch.Tensor, prefix: int, tree_mask: torch.Tensor | None,
                 last_only: bool) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Outputs [q, H] and logits (the last row's with `last_only`) of rows reading `hidden` and `embeds` at
        `positions`: every row sees the cache's first `prefix` rows; the rows are the last of `tree_mask`'s
        [q, span] columns after them, and see those their row marks (None: the rows are written at `prefix` and
        causal)."""
        cos, sin = self.draft.tables(positions, torch.float32)
        return self.native.eagle3_forward(self.layer, hidden, embeds, cos, sin, keys, values, prefix, tree_mask,
                                          last_only)  # fmt: skip


def native_eagle3(draft: Eagle3Draft, device: torch.device) -> NativeEagle3 | None:
    """The draft layer in the CPU decoder, or None where that cannot run it (not a CPU, a head size it is not
    compiled for, no compiler: the torch layer then runs)."""
    if device.type != "cpu" or draft.config.head_dim not in HEAD_DIMS:
        return None
    try:
        return NativeEagle3(cpu_decoder(), draft)
    except RuntimeError as error:
        warnings.warn(f"{error}; the EAGLE-3 draft runs as torch operations (slower)", stacklevel=2)
        return None
