"""A LongSpec draft layer started from the target's last decoder layer: its projections, norms and MLP
neurons are the target's."""

from __future__ import annotations

import pytest
import torch
from tui_harness import tiny_loaded

from specchat.architectures import parts
from specchat.models.longspec import LongSpecConfig, LongSpecLayer
from specchat.quant.fused import Rows, fuse_projections
from specchat.quant.quantized_linear import dense_weight
from specchat.training.layer_start import start_from_last_layer


@pytest.fixture(scope="module")
def loaded(tokenizer):
    """The tiny target with its last layer's q/k/v and gate/up fused as the CPU decoder fuses a quantized target's
    (the projections become `Rows` views of one layer): what a start meets after features were computed."""
    loaded = tiny_loaded(tokenizer)
    last = parts(loaded.model).layers[-1]
    fuse_projections(last.attention, last.qkv_names)
    fuse_projections(last.mlp, last.gate_up_names)
    assert isinstance(last.q, Rows) and isinstance(last.mlp.up_proj, Rows)
    return loaded


def _started(model, intermediate: int = 0) -> LongSpecLayer:
    torch.manual_seed(0)
    layer = LongSpecLayer(LongSpecConfig.for_target(model.config, intermediate=intermediate))
    start_from_last_layer(layer, model)
    return layer


def test_a_full_width_start_is_the_targets_last_layer(loaded):
    model = loaded.model
    last = parts(model).layers[-1]
    layer = _started(model)
    for draft, target in ((layer.self_attn.q_proj, last.q), (layer.self_attn.k_proj, last.k),
                          (layer.self_attn.v_proj, last.v), (layer.self_attn.o_proj, last.o),
                          (layer.cross_attn.q_proj, last.q), (layer.cross_attn.o_proj, last.o)):  # fmt: skip
        assert torch.equal(draft.weight, dense_weight(target))
        if draft.bias is not None:  # the target's bias, or none (zero) where it has none
            expected = target.bias if getattr(target, "bias", None) is not None else torch.zeros_like(draft.bias)
            assert torch.equal(draft.bias, expected)
    assert torch.equal(layer.input_layernorm.weight, last.input_norm.weight)
    assert torch.equal(layer.post_self_attention_layernorm.weight, last.input_norm.weight)
    assert torch.equal(layer.post_cross_attention_layernorm.weight, last.post_attention_norm.weight)
    x = torch.randn(5, model.config.hidden_size)
    torch.testing.assert_close(layer.mlp(x), last.mlp(x))  # every neuron kept: the same MLP


def test_a_narrower_mlp_keeps_the_targets_strongest_neurons_in_order(loaded):
    model = loaded.model
    mlp = parts(model).layers[-1].mlp
    gate, up, down = (dense_weight(projection) for projection in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))
    width = model.config.intermediate_size // 4
    layer = _started(model, intermediate=width)
    kept = [int((gate == row).all(dim=1).nonzero()) for row in layer.mlp.gate_proj.weight]
    assert kept == sorted(kept) and len(set(kept)) == width
    assert torch.equal(layer.mlp.up_proj.weight, up[kept]) and torch.equal(layer.mlp.down_proj.weight, down[:, kept])
    strength = gate.norm(dim=1) * up.norm(dim=1) * down.norm(dim=0)
    dropped = [i for i in range(len(strength)) if i not in kept]
    assert strength[dropped].max() <= strength[kept].min()
