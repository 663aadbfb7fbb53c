"""RoPE's inverse frequencies and attention scaling (`specchat.architectures.rope`) bit for bit transformers' for
every rope type specchat runs, and `--yarn`'s stretch of a model's window."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from specchat.architectures.llama_model import ModelConfig
from specchat.architectures.rope import attention_scaling, inverse_frequencies, stretch_with_yarn
from specchat.errors import SpecchatError

YARN = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 32768}
ROPES = {
    "default": {"rope_type": "default", "rope_theta": 1e6},
    "linear": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0},
    "llama3": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "yarn": YARN,  # Qwen2.5's model cards' 128K setting
    "yarn-betas": {**YARN, "rope_theta": 1e4, "factor": 2.5, "original_max_position_embeddings": 4096,
                   "beta_fast": 16, "beta_slow": 2},
    "yarn-untruncated": {**YARN, "truncate": False},
    "yarn-mscale": {**YARN, "mscale": 0.707, "mscale_all_dim": 0.707},  # DeepSeek's: the temperature cancels
    "yarn-attention-factor": {**YARN, "attention_factor": 1.25},
}  # fmt: skip


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("name", ROPES)
def test_frequencies_and_scaling_are_transformers(name, head_dim):
    rope = ROPES[name]
    window = int(rope.get("original_max_position_embeddings", 4096) * rope.get("factor", 1))
    config = AutoConfig.for_model("qwen2", hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
                                  max_position_embeddings=window, rope_parameters=dict(rope))  # fmt: skip
    want, scaling = ROPE_INIT_FUNCTIONS[rope["rope_type"]](config, "cpu") if name != "default" else (None, 1.0)
    got = inverse_frequencies(rope, head_dim)
    assert got.dtype == torch.float32 and got.shape == (head_dim // 2,)
    if want is not None:
        assert torch.equal(got, want)
    assert attention_scaling(rope) == scaling


def test_yarn_keeps_the_fast_pairs_and_divides_the_slow_ones():
    plain, stretched = inverse_frequencies(ROPES["default"], 128), inverse_frequencies(YARN, 128)
    assert torch.equal(stretched[:8], plain[:8])  # many turns over 32K tokens: positions stay told apart
    torch.testing.assert_close(stretched[-16:], plain[-16:] / 4)  # under one turn: interpolated
    assert attention_scaling(YARN) == pytest.approx(1 + 0.1 * torch.tensor(4.0).log().item())


def test_stretching_a_window_with_yarn():
    config = ModelConfig({"num_attention_heads": 4, "hidden_size": 256, "max_position_embeddings": 32768,
                          "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}})  # fmt: skip
    stretch_with_yarn(config, 4)
    assert config.max_position_embeddings == 131072 and config.rope_parameters == YARN

    with pytest.raises(SpecchatError, match=r"stretches plain RoPE; this model's is scaled already \(yarn\)"):
        stretch_with_yarn(config, 2)
    llama3 = ModelConfig({"num_attention_heads": 4, "hidden_size": 256, "max_position_embeddings": 131072,
                          "rope_parameters": ROPES["llama3"]})  # fmt: skip
    with pytest.raises(SpecchatError, match=r"scaled already \(llama3\)"):
        stretch_with_yarn(llama3, 2)
