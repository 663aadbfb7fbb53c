"""specchat's own Llama modules, what a GGUF file loads into, against transformers' model of the same file: the
config fields the engine reads, and the parts it calls (norms, rotary tables, MLP) bit for bit; and a load that
imports none of transformers' model or config classes, whose import was 2-3 s of every launch."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from gguf_files import llama3_frequency_factors, write_tiny_model
from transformers import AutoConfig
from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

from specchat.architectures import parts
from specchat.architectures.llama_model import CausalLM
from specchat.architectures.rope import stretch_with_yarn
from specchat.engine.attention import sliding_window
from specchat.loading import embedded_gguf_path, gguf_checkpoint
from specchat.quant.gguf_model import dequantized_model, load_gguf_model

FIELDS = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "head_dim", "rms_norm_eps", "vocab_size", "max_position_embeddings", "hidden_act",
          "tie_word_embeddings", "rope_parameters")  # fmt: skip


@pytest.fixture(scope="module")
def tiny_ggufs(tmp_path_factory):
    """A tiny GGUF file by architecture (the llama one with Llama 3.1's RoPE scaling) and the directory of its
    converted config and tokenizer."""
    made = {}

    def of(architecture: str):
        if architecture not in made:
            factors = llama3_frequency_factors(8.0) if architecture == "llama" else None
            path = write_tiny_model(tmp_path_factory.mktemp("gguf") / f"tiny-{architecture}.gguf", embedded_gguf_path(),
                                    architecture=architecture, frequency_factors=factors)  # fmt: skip
            made[architecture] = path, gguf_checkpoint(path)
        return made[architecture]

    return of


@pytest.mark.parametrize("architecture", ["qwen2", "llama", "qwen3"])
def test_the_parts_compute_what_transformers_computes(tiny_ggufs, architecture):
    path, config_dir = tiny_ggufs(architecture)
    ours, theirs = load_gguf_model(path, config_dir, torch.float32), dequantized_model(path, config_dir)
    assert isinstance(ours, CausalLM)
    for field in FIELDS:
        assert getattr(ours.config, field) == getattr(theirs.config, field), field
    assert sliding_window(ours.config) == sliding_window(theirs.config) is False
    assert ours.generation_config.eos_token_id == theirs.generation_config.eos_token_id
    assert ours.name_or_path == theirs.name_or_path == config_dir

    mine, reference = parts(ours), parts(theirs)
    positions = torch.tensor([[0, 1, 7, 4000, 31999]])
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(5, ours.config.hidden_size, generator=torch.Generator().manual_seed(0)).to(dtype)
        for got, want in zip(mine.rotary(x, positions), reference.rotary(x, positions)):
            assert got.dtype == dtype and torch.equal(got, want)
        layer, layer_of_theirs = mine.layers[1], reference.layers[1]
        assert (layer.head_dim, layer.scaling) == (layer_of_theirs.head_dim, layer_of_theirs.scaling)
        assert torch.equal(layer.input_norm(x), layer_of_theirs.input_norm(x))
        assert torch.equal(mine.norm(x), reference.norm(x))
        if architecture == "qwen3":
            heads = torch.randn(3, 4, layer.head_dim).to(dtype)
            assert torch.equal(layer.q_norm(heads), layer_of_theirs.q_norm(heads))
    dense = theirs.model.layers[1].mlp  # our MLP over transformers' dense projections
    for name in ("gate_proj", "up_proj", "down_proj"):
        setattr(layer.mlp, name, getattr(dense, name))
    x = torch.randn(5, ours.config.hidden_size)
    assert torch.equal(layer.mlp(x), dense(x))


def test_a_window_stretched_by_yarn_rotates_as_transformers_rotates_it(tiny_ggufs):
    """`--yarn 4` on a file: our rotary tables (YaRN's frequencies and temperature) are transformers' for the same
    config stretched, past the trained window too."""
    path, config_dir = tiny_ggufs("qwen2")
    ours = load_gguf_model(path, config_dir, torch.float32, yarn=4.0)
    config = AutoConfig.from_pretrained(config_dir)
    stretch_with_yarn(config, 4.0)
    assert ours.config.max_position_embeddings == config.max_position_embeddings == 4 * 4096
    assert ours.config.rope_parameters == config.rope_parameters
    theirs = Qwen2RotaryEmbedding(config)
    positions = torch.tensor([[0, 1, 4095, 4096, 9000, 16383]])
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.zeros(1, dtype=dtype)
        for got, want in zip(parts(ours).rotary(x, positions), theirs(x, positions)):
            assert got.dtype == dtype and torch.equal(got, want)


def test_a_model_left_incomplete_by_its_file_is_refused(tiny_ggufs):
    """Every weight starts on the meta device: one the file does not fill is named."""
    path, config_dir = tiny_ggufs("qwen2")
    model = CausalLM(load_gguf_model(path, config_dir, torch.float32).config, torch.float32)
    missing = [name for name, p in model.named_parameters() if p.is_meta]
    assert "lm_head.weight" in missing and "model.layers.1.input_layernorm.weight" in missing
    assert not [name for name, b in model.named_buffers() if b.is_meta]  # the rotary tables are made


def test_a_gguf_load_imports_neither_transformers_nor_the_compiler(tiny_ggufs):
    """The launch path (load, engine, session, a chat template rendered) imports nothing of transformers (its import
    alone takes about a second) and not torch's compiler (which meta-device initialisation pulls in)."""
    path, _ = tiny_ggufs("llama")
    code = ("import sys; import specchat.session, specchat.engine.generate; from specchat.loading import load_model; "
            "from specchat.engine.prompt import encode_prompt; "
            f"loaded = load_model({str(path)!r}); encode_prompt(loaded.tokenizer, 'Hi'); "
            "heavy = ('transformers', 'torch._dynamo', 'accelerate'); "
            "print(sorted(m for m in sys.modules if m.startswith(heavy)))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
