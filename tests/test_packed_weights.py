"""Draft checkpoints packed in 4 bits (`specchat train pack`).

Proven here:
- a packed matrix unpacks to within half a step of each weight, a group of equal weights exactly; norms,
  biases, vocabulary lists and matrices not of whole groups are stored as they were;
- quantizing the unpacked weights as a CPU draft runs them (int4, groups of 32) computes what the unpacked
  weights do: the stored draft is the one that runs;
- packed LongSpec, GLIDE and TokenSwift checkpoints load as their unpacked weights, a third of the size or
  less, and decode token for token as the target alone;
- packing twice, or a directory without a checkpoint, is a one-line error.
"""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model
from test_cli import assert_one_line_error, specchat_in_process
from test_glide import random_draft
from test_longspec import generate, random_layer
from test_tokenswift_drafter import random_heads
from torch import nn

from specchat.drafters.checkpoint import WEIGHTS, pack_checkpoint
from specchat.drafters.glide.drafter import GlideDrafter
from specchat.drafters.glide.model import load_glide, save_glide
from specchat.drafters.longspec.drafter import LongSpecDrafter
from specchat.drafters.longspec.model import load_longspec, save_longspec
from specchat.drafters.packed_weights import pack, unpack
from specchat.drafters.tokenswift.model import load_heads, save_heads
from specchat.engine.generate import Engine
from specchat.quant.quantize import quantize_linear

PROMPT = [5, 9, 14, 3, 22, 9, 14, 3, 40, 41, 7]


def test_each_weight_unpacks_within_half_a_step():
    generator = torch.Generator().manual_seed(0)
    matrix = torch.randn(48, 96, generator=generator) * torch.logspace(-3, 1, 48)[:, None]  # rows of every scale
    matrix[5, 32:64] = 0.25  # a group of equal weights
    others = {"norm.weight": torch.rand(96), "draft_vocab": torch.arange(10), "odd": torch.randn(4, 33),
              "bias": torch.randn(48)}  # fmt: skip
    packed = pack({"linear.weight": matrix, **others})
    assert packed["linear.weight.int4"].dtype == torch.uint8 and packed["linear.weight.int4"].shape == (48, 48)
    unpacked = unpack(packed)
    assert set(unpacked) == {"linear.weight", *others}
    for name, tensor in others.items():
        assert torch.equal(unpacked[name], tensor), name
    step = packed["linear.weight.int4_step"].float().repeat_interleave(32, dim=1)
    error = (unpacked["linear.weight"] - matrix).abs()
    assert (error <= step / 2 + 1e-3 * step + 1e-7).all()  # half a step, and the fp16 minimum's rounding
    assert torch.equal(unpacked["linear.weight"][5, 32:64], torch.full((32,), 0.25))


def test_a_cpu_draft_runs_the_stored_weights():
    """Quantized again as a draft's linear on a CPU (int4, groups of 32), the unpacked weights give back their
    own codes: the layer computes what the unpacked matrix does, to float rounding."""
    torch.manual_seed(1)
    linear = nn.Linear(256, 64, bias=False)
    nn.init.normal_(linear.weight, std=0.02)
    linear.weight.data = unpack(pack({"w": linear.weight.data}))["w"]
    x = torch.randn(5, 256)
    quantized = quantize_linear(linear, "int4", dtype=torch.float32)
    torch.testing.assert_close(quantized(x), x @ linear.weight.data.T, atol=1e-5, rtol=1e-5)


def _packed(directory, file_name=WEIGHTS) -> float:
    """Pack the checkpoint in `directory`; its size after as a fraction of before."""
    before, after = pack_checkpoint(directory)
    assert (directory / file_name).stat().st_size == after
    return after / before


def test_packed_longspec_and_glide_checkpoints_decode_as_the_target(tokenizer, tmp_path):
    model = tiny_model("qwen2", vocab_size=64)
    engine = Engine(model, tokenizer, max_len=160)
    expected = generate(engine, PROMPT, 40)

    save_longspec(tmp_path / "longspec", random_layer(model), dtype=torch.bfloat16)
    stored = unpack(pack(load_longspec(tmp_path / "longspec", model.config)[0].state_dict()))
    assert _packed(tmp_path / "longspec") < 0.4  # real drafts: 0.32; the tiny ones' norms weigh more
    layer, _ = load_longspec(tmp_path / "longspec", model.config)
    for name, tensor in layer.state_dict().items():
        assert torch.equal(tensor, stored[name]), name
    engine.set_drafter(LongSpecDrafter(engine.target, layer, weights="int4"), 8)
    assert generate(engine, PROMPT, 40) == expected

    save_glide(tmp_path / "glide", random_draft(model.config, shared_vocab=True), dtype=torch.bfloat16,
               draft_vocab=torch.arange(0, 64, 2))  # fmt: skip
    assert _packed(tmp_path / "glide") < 0.4  # real drafts: 0.32; the tiny ones' norms weigh more
    draft, draft_vocab = load_glide(tmp_path / "glide", model.config)
    engine.set_drafter(GlideDrafter(engine.target, draft, draft_vocab=draft_vocab, weights="int4"), 8)
    assert generate(engine, PROMPT, 40) == expected


def test_packed_tokenswift_heads_load_as_their_unpacked_weights(tmp_path):
    model = tiny_model("llama", vocab_size=64)
    heads = random_heads(model)
    save_heads(tmp_path / "heads", heads)
    stored = unpack(pack(load_heads(tmp_path / "heads").state_dict()))
    # the tiny heads' norms weigh as much as their linears
    assert _packed(tmp_path / "heads", "heads.safetensors") < 0.5
    for name, tensor in load_heads(tmp_path / "heads").state_dict().items():
        assert torch.equal(tensor, stored[name]), name


def test_packing_twice_or_nothing_is_one_line(tmp_path, monkeypatch, capfd):
    save_longspec(tmp_path / "draft", random_layer(tiny_model("llama", vocab_size=64)), dtype=torch.bfloat16)
    assert specchat_in_process(monkeypatch, capfd, "train", "pack", str(tmp_path / "draft")).returncode == 0
    assert_one_line_error(specchat_in_process(monkeypatch, capfd, "train", "pack", str(tmp_path / "draft")),
                          "packed already")  # fmt: skip
    assert_one_line_error(specchat_in_process(monkeypatch, capfd, "train", "pack", str(tmp_path / "none")),
                          "no draft checkpoint")  # fmt: skip


@pytest.mark.parametrize("broken", ["int4_step", "int4_low"])
def test_a_packed_matrix_missing_a_part_is_an_unreadable_checkpoint(broken, tmp_path):
    from safetensors.torch import load_file, save_file

    from specchat.errors import SpecchatError

    save_longspec(tmp_path / "draft", random_layer(tiny_model("llama", vocab_size=64)), dtype=torch.bfloat16)
    pack_checkpoint(tmp_path / "draft")
    tensors = load_file(tmp_path / "draft" / WEIGHTS)
    del tensors[f"mlp.down_proj.weight.{broken}"]
    save_file(tensors, tmp_path / "draft" / WEIGHTS)
    with pytest.raises(SpecchatError, match="^[^\n]*unreadable checkpoint[^\n]*mlp.down_proj.weight"):
        load_longspec(tmp_path / "draft", tiny_model("llama", vocab_size=64).config)
