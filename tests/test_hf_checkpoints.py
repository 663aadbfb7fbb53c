"""Gemma 3 and 2, Phi-3 and Granite from a Hugging Face checkpoint (config.json and safetensors, as `save_pretrained`
writes them): on a CPU they load into specchat's own modules (`hf_checkpoint`) and run on the CPU decoder, computing
what transformers' model computes, past the window too; speculation equals the target alone. The checkpoints are the
tiny GGUF models of test_gguf_architectures, dequantized by transformers' model and saved."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch
from conftest import tiny_model
from gguf_files import write_tiny_model
from safetensors.torch import load_file, save_file
from test_gguf_architectures import (
    WINDOW,
    assert_computes_transformers_forward,
    assert_speculation_equals_autoregressive,
)
from test_gguf_model import GREEDY, SAMPLED, generate
from test_speculative import VOCAB
from transformers import PreTrainedTokenizerFast

from specchat.architectures import gemma3_model, llama_model, parts
from specchat.engine.cache import TreeCache
from specchat.engine.generate import Engine
from specchat.engine.lean_forward import lean_forward
from specchat.errors import SpecchatError
from specchat.loading import embedded_gguf_path, gguf_checkpoint, load_model
from specchat.quant.gguf_linear import GGUFEmbedding
from specchat.quant.gguf_model import dequantized_model

OWN = {"gemma3": gemma3_model.CausalLM, "gemma2": gemma3_model.CausalLM, "phi3": llama_model.CausalLM,
       "granite": llama_model.CausalLM}  # fmt: skip


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Each architecture's tiny model as a checkpoint directory in bf16, and transformers' model of it in fp32."""
    made = {}

    def of(architecture: str):
        if architecture not in made:
            folder = tmp_path_factory.mktemp(architecture)
            path = write_tiny_model(folder / f"tiny-{architecture}.gguf", embedded_gguf_path(),
                                    architecture=architecture, unquantized=True)  # fmt: skip
            config_dir = gguf_checkpoint(path)
            reference = dequantized_model(path, config_dir)
            for weight in reference.parameters():  # as saved in bf16 (its buffers, the rotary tables, stay fp32)
                weight.data = weight.data.to(torch.bfloat16).float()
            copy.deepcopy(reference).to(torch.bfloat16).save_pretrained(folder / "checkpoint")
            PreTrainedTokenizerFast.from_pretrained(config_dir).save_pretrained(folder / "checkpoint")
            made[architecture] = folder / "checkpoint", reference
        return made[architecture]

    return of


@torch.inference_mode()
@pytest.mark.parametrize("architecture", OWN)
def test_a_checkpoint_runs_on_the_cpu_decoder_as_transformers_runs_it(checkpoints, architecture):
    """fp32 activations, past the window and on tree rows, against transformers' model of the same weights."""
    directory, theirs = checkpoints(architecture)
    ours = load_model(str(directory), dtype="float32").model
    assert type(ours) is OWN[architecture]
    assert_computes_transformers_forward(ours, theirs, WINDOW[architecture])


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_speculation_on_a_checkpoint_equals_autoregressive(checkpoints, sampling, cpu_isa):
    loaded = load_model(str(checkpoints("gemma3")[0]))
    assert loaded.dtype == "bfloat16"
    assert_speculation_equals_autoregressive(loaded, sampling)


def test_an_fp16_checkpoint_keeps_its_weights_and_speculates_exactly(checkpoints, tmp_path):
    """Saved in fp16, its matrices stay fp16 beside bf16 activations (HalfLinear: each weight exact in the product);
    run in fp16 activations (`--dtype float16`), its fp16 products are the CPU decoder's own too, rows apart."""
    directory, reference = checkpoints("gemma3")
    copy.deepcopy(reference).half().save_pretrained(tmp_path)
    PreTrainedTokenizerFast.from_pretrained(directory).save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path))
    assert loaded.dtype == "bfloat16"
    layer = parts(loaded.model).layers[0]
    assert isinstance(layer.down, llama_model.HalfLinear) and layer.down.weight.dtype == torch.float16
    assert_speculation_equals_autoregressive(loaded, SAMPLED)
    half = load_model(str(tmp_path), dtype="float16")
    assert type(parts(half.model).layers[0].down) is torch.nn.Linear and half.model.dtype == torch.float16
    assert_speculation_equals_autoregressive(half, SAMPLED)


@torch.inference_mode()
def test_a_multimodal_gemma3_checkpoint_loads_its_text_model(checkpoints, tmp_path):
    """Gemma 3 4B and larger are published with a vision tower: their text model's tensors under
    `language_model.model.` (or `model.language_model.`), the config's under `text_config`."""
    directory, _ = checkpoints("gemma3")
    text = load_model(str(directory)).model
    prompt = torch.randint(3, 2000, (30,), generator=torch.Generator().manual_seed(1))
    want = lean_forward(text)(prompt, torch.arange(30), None, TreeCache(2, 64, windows=[0, 0])).logits
    for prefix, head in (("language_model.model.", "language_model.lm_head."), ("model.language_model.", "lm_head.")):
        multimodal = tmp_path / prefix.replace(".", "_")
        shutil.copytree(directory, multimodal)
        tensors = {_renamed(name, prefix, head): t for name, t in load_file(multimodal / "model.safetensors").items()}
        tensors["vision_tower.vision_model.post_layernorm.weight"] = torch.ones(4)
        save_file(tensors, multimodal / "model.safetensors", metadata={"format": "pt"})
        config = json.loads((directory / "config.json").read_text())
        (multimodal / "config.json").write_text(json.dumps({"model_type": "gemma3", "architectures":
            ["Gemma3ForConditionalGeneration"], "text_config": config}))  # fmt: skip
        model = load_model(str(multimodal)).model
        assert model.config.model_type == "gemma3_text"
        got = lean_forward(model)(prompt, torch.arange(30), None, TreeCache(2, 64, windows=[0, 0])).logits
        assert torch.equal(got, want)


def _renamed(name: str, prefix: str, head: str) -> str:
    """A text model's tensor as a multimodal checkpoint names it."""
    return prefix + name.removeprefix("model.") if name.startswith("model.") else head + name.removeprefix("lm_head.")


def test_a_checkpoint_quantized_on_load_runs_on_the_cpu_decoder(checkpoints):
    loaded = load_model(str(checkpoints("phi3")[0]), quantize="int8")
    engine = Engine(loaded.model, loaded.tokenizer, max_len=128)
    assert engine.canonical and parts(loaded.model).layers[0].q.format.startswith("int8")
    assert len(generate(engine, [5, 6, 7, 8], 8, GREEDY)) == 8


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_speculation_on_a_checkpoint_quantized_to_gguf_blocks_equals_autoregressive(checkpoints, sampling, tmp_path,
                                                                                     monkeypatch):  # fmt: skip
    """`--quantize q4_k_m` on Gemma 3 (a tied head, its embedding scaled on lookup): the GGUF kernels' model."""
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path))  # its kept blocks
    loaded = load_model(str(checkpoints("gemma3")[0]), quantize="q4_k_m")
    decoder = parts(loaded.model)
    assert isinstance(decoder.embed, GGUFEmbedding) and decoder.embed.scale == decoder.model.config.hidden_size**0.5
    assert decoder.head.format == "q6_k" and loaded.dtype == "bfloat16"
    assert_speculation_equals_autoregressive(loaded, sampling)


def test_the_blocks_of_a_quantized_checkpoint_are_kept_for_its_next_load(checkpoints, tmp_path, monkeypatch):
    """The second load reads the blocks the first wrote, quantizing nothing (the same model, bit for bit); a weights
    file changed since is quantized anew, its blocks replacing the first's."""
    from specchat.quant import gguf_quantize

    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))
    directory = tmp_path / "checkpoint"
    shutil.copytree(checkpoints("phi3")[0], directory)
    first = load_model(str(directory), quantize="q4_k_m").model
    kept = list((tmp_path / "cache" / "quantized").iterdir())
    assert len(kept) == 1 and kept[0].suffix == ".safetensors"
    with monkeypatch.context() as refusing:
        refusing.setattr(gguf_quantize, "block_kernels", None)  # any quantizing would fail
        again = load_model(str(directory), quantize="q4_k_m").model
    for (name, ours), theirs in zip([*first.named_parameters(), *first.named_buffers()],
                                    [*again.parameters(), *again.buffers()]):  # fmt: skip
        assert torch.equal(ours, theirs), name
    (directory / "model.safetensors").touch()
    load_model(str(directory), quantize="q4_k_m")
    replacing = list((tmp_path / "cache" / "quantized").iterdir())
    assert len(replacing) == 1 and replacing != kept


@torch.inference_mode()
def test_phi3_minis_96_wide_heads_run_on_the_cpu_decoder(checkpoints, tmp_path):
    """Phi-3-mini's shape (heads of 96, as many KV heads as query heads, RoPE over every dim, LongRoPE's factors, a
    window on every layer): the CPU decoder computes transformers' forward, and speculation in bf16 equals
    autoregression."""
    from transformers import Phi3Config, Phi3ForCausalLM

    directory, _ = checkpoints("phi3")
    fields = json.loads((directory / "config.json").read_text())
    rope = fields["rope_parameters"]
    del rope["partial_rotary_factor"]
    generator = torch.Generator().manual_seed(3)
    for name in ("long_factor", "short_factor"):  # one per rotated pair: 48
        rope[name] = (1 + torch.rand(48, generator=generator) * (4 if name == "long_factor" else 0.5)).tolist()
    fields |= {"hidden_size": 384, "num_key_value_heads": 4}
    torch.manual_seed(0)
    theirs = Phi3ForCausalLM(Phi3Config.from_dict(fields)).eval()
    for weight in theirs.parameters():  # as saved in bf16
        weight.data = weight.data.to(torch.bfloat16).float()
    copy.deepcopy(theirs).to(torch.bfloat16).save_pretrained(tmp_path)
    PreTrainedTokenizerFast.from_pretrained(directory).save_pretrained(tmp_path)
    ours = load_model(str(tmp_path), dtype="float32").model
    assert parts(ours).layers[0].head_dim == 96
    assert_computes_transformers_forward(ours, theirs, WINDOW["phi3"])
    assert_speculation_equals_autoregressive(load_model(str(tmp_path)), GREEDY)


def test_a_checkpoint_without_safetensors_is_refused_in_one_line(checkpoints, tmp_path):
    directory = tmp_path / "bin-only"
    shutil.copytree(checkpoints("granite")[0], directory)
    (directory / "model.safetensors").rename(directory / "pytorch_model.bin")
    with pytest.raises(SpecchatError, match="has no model.safetensors"):
        load_model(str(directory))


@torch.inference_mode()
@pytest.mark.parametrize("family", ["mistral", "qwen2"])
def test_a_checkpoint_with_sliding_windows_runs_on_the_cpu_decoder(family, hf_tokenizer, tmp_path):
    """Mistral's window on every layer, Qwen2's from `max_window_layers` on (its `layer_types`): transformers'
    attention modules do not say which layers have one as the CPU decoder reads it, specchat's own do."""
    from transformers import AutoModelForCausalLM

    plain = tiny_model(family, vocab_size=VOCAB, head_dim=64)
    fields = {k: v for k, v in plain.config.to_dict().items() if k != "layer_types"}  # built again from these
    fields["sliding_window"] = 24
    if family == "qwen2":
        fields |= {"use_sliding_window": True, "max_window_layers": 1}
    theirs = AutoModelForCausalLM.from_config(plain.config.__class__.from_dict(fields), attn_implementation="sdpa")
    theirs.load_state_dict(plain.state_dict())
    theirs.eval().save_pretrained(tmp_path)
    hf_tokenizer.save_pretrained(tmp_path)
    ours = load_model(str(tmp_path), dtype="float32").model
    windows = [layer.window for layer in parts(ours).layers]
    assert windows == ([24, 24] if family == "mistral" else [0, 24])
    prompt = torch.randint(3, VOCAB, (60,), generator=torch.Generator().manual_seed(0))
    logits = lean_forward(ours)(prompt, torch.arange(60), None, TreeCache(2, 128, windows=windows)).logits
    torch.testing.assert_close(logits, theirs(input_ids=prompt[None]).logits[0], atol=2e-4, rtol=1e-4)


def test_a_checkpoint_is_found_by_its_repo_id_in_the_hub_cache(checkpoints, tmp_path, monkeypatch):
    """Offline, as `hf download google/gemma-3-1b-it` leaves it: its snapshot in the Hugging Face cache."""
    from huggingface_hub import constants

    repo = tmp_path / "models--google--gemma-3-tiny"
    shutil.copytree(checkpoints("gemma3")[0], repo / "snapshots" / "0123abcd")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    loaded = load_model("google/gemma-3-tiny")
    assert type(loaded.model) is gemma3_model.CausalLM
    assert loaded.model.name_or_path == str(repo / "snapshots" / "0123abcd")
