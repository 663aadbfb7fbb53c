"""Quantized weights: the embedded GGUF's codes load exactly (packed once per machine), every quantized matmul and
canonical attention is row-independent, and speculative output on the quantized default model equals its
autoregressive output."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_model
from drafters_for_tests import RandomTreeDrafter
from gguf_files import reader

from specchat.drafters.ngram.drafter import NgramDrafter
from specchat.engine.generate import Engine
from specchat.engine.prompt import encode_prompt
from specchat.engine.sampling import SamplingConfig
from specchat.engine.target_forward import forward_path
from specchat.loading import embedded_checkpoint, embedded_gguf_path, gguf_checkpoint, load_model
from specchat.quant.gguf_model import load_gguf_model
from specchat.quant.int4_linear import Int4Linear
from specchat.quant.int8_linear import Int8Linear
from specchat.quant.quantize import quantize_model

VERIFY_ROWS = (2, 3, 4, 5, 8, 9, 16, 17, 33, 65)  # 1 + tree sizes the engine verifies


@pytest.fixture(scope="module")
def quantized_model():
    """The embedded model as `--dtype auto` loads it on a CPU: the GGUF's own Q4_1 / Q8_0 codes."""
    return load_model(None, device="cpu")


def _layers(seed=0, out_features=192, in_features=576):
    torch.manual_seed(seed)
    groups = torch.rand(out_features, in_features // 32) * 0.01
    for dtype in (torch.bfloat16, torch.float32):
        int4 = Int4Linear(torch.randint(0, 16, (out_features, in_features)), groups, -8 * groups, group_size=32,
                          dtype=dtype)  # fmt: skip
        int8 = Int8Linear(torch.randint(-128, 128, (out_features, in_features), dtype=torch.int8), groups, dtype=dtype)
        yield from (pytest.param(layer, dtype, id=f"{type(layer).__name__}-{dtype}") for layer in (int4, int8))


@pytest.mark.parametrize(("layer", "dtype"), list(_layers()))
def test_quantized_matmuls_are_row_independent(layer, dtype):
    for rows in VERIFY_ROWS:
        x = torch.randn(rows, layer.in_features, dtype=dtype)
        together = layer(x)
        alone = torch.cat([layer(x[i : i + 1]) for i in range(rows)])
        assert torch.equal(together, alone), f"{rows} rows"
        assert torch.equal(layer(x[None])[0], together)  # a batch of one sequence: the same rows


@pytest.mark.slow
def test_loaded_weights_are_the_gguf_values(quantized_model, default_model):
    """In fp32 the kernel's weights equal gguf-py's dequantization, and transformers' own GGUF conversion
    (rows of q/k un-permuted as it does) — code for code, no rounding."""
    from gguf.quants import dequantize

    from specchat.loading import embedded_checkpoint

    model = load_gguf_model(embedded_gguf_path(), embedded_checkpoint(dense=False), torch.float32)
    tensors = {t.name: t for t in reader(embedded_gguf_path()).tensors}
    layer = model.model.layers[3]
    tensor = tensors["blk.3.ffn_down.weight"]
    down = torch.from_numpy(dequantize(np.array(tensor.data), tensor.tensor_type))
    assert torch.equal(layer.mlp.down_proj.dequantize(), down)
    head = tensors["token_embd.weight"]
    embedding = torch.from_numpy(dequantize(np.array(head.data), head.tensor_type))
    assert torch.equal(model.lm_head.dequantize(), embedding)
    ids = torch.tensor([[0, 17, 49151]])
    assert torch.equal(model.model.embed_tokens(ids)[0], embedding[ids[0]])

    dense = default_model.model  # transformers' conversion of the same file
    for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj"):
        assert torch.equal(layer.get_submodule(name).dequantize(), dense.model.layers[3].get_submodule(name).weight)


def test_the_tensor_table_maps_the_same_bytes_as_gguf_py():
    from specchat.quant.gguf_model import gguf_tensors

    reference = reader(embedded_gguf_path()).tensors  # gguf-py's parse
    ours = gguf_tensors(embedded_gguf_path())
    assert [t.name for t in ours] == [t.name for t in reference]
    for mine, theirs in zip(ours, reference):
        assert mine.tensor_type == theirs.tensor_type and list(mine.shape) == list(theirs.shape)
        assert mine.data.dtype == theirs.data.dtype and np.array_equal(mine.data, theirs.data)


@pytest.mark.slow
def test_default_cpu_load_runs_the_gguf_codes(quantized_model):
    assert quantized_model.weights == "q4_1"
    assert forward_path(quantized_model.model).startswith("CPU decoder")
    assert quantized_model.dtype == "float32"  # its int8 activations in two terms, a bf16 cache beside them
    assert not any(p.dtype == torch.float32 and p.numel() > 1_000_000 for p in quantized_model.model.parameters())


def test_the_embedded_models_conversion_replaces_those_of_other_versions(tmp_path, monkeypatch):
    """A new release's conversion of the embedded model removes the older ones (540 MB of fp32 weights each); a
    conversion still being written and other models' stay."""
    read = Path(gguf_checkpoint(embedded_gguf_path()))  # the file's tokenizer and config, from the tests' cache
    shutil.copytree(read, tmp_path / read.name)
    older, writing, other = (tmp_path / name for name in ("smollm2-135m-0123456789ab", "smollm2-135m-0a.7.partial",
                                                           "gguf-qwen2.5-coder-1.5b-0123456789ab"))  # fmt: skip
    for folder in (older, writing, other):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"weights")
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path))
    converted = Path(embedded_checkpoint(dense=False))
    assert (converted / "config.json").is_file()
    assert sorted(tmp_path.iterdir()) == sorted([converted, writing, other, tmp_path / read.name])


PROMPTS = (
    "Summarize: the lighthouse keeper wrote in the log every night. The lighthouse keeper wrote in the log "
    "every night. Then one night the log was gone.",
    "List ten fruits and describe the taste of each one.",
)


def _greedy(loaded, ids, drafter=None, budget=None, n=96):
    engine = Engine(loaded.model, loaded.tokenizer, max_len=len(ids) + n, drafter=drafter, draft_budget=budget)
    return [t for event in engine.generate(ids, sampling=SamplingConfig(temperature=0.0), max_new_tokens=n)
            for t in event.tokens]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("prompt", PROMPTS)
def test_speculative_equals_autoregressive_on_the_quantized_model(prompt, quantized_model):
    ids = encode_prompt(quantized_model.tokenizer, prompt)
    reference = _greedy(quantized_model, ids)
    assert _greedy(quantized_model, ids, NgramDrafter(), 8) == reference
    assert _greedy(quantized_model, ids, RandomTreeDrafter(vocab_size=49152, seed=5, reference=ids + reference,
                                                           p_correct=0.7), 16) == reference


@pytest.mark.slow
def test_speculative_equals_autoregressive_past_the_canonical_split(quantized_model):
    """Contexts past CHUNK + TAIL: rows read committed keys in place and a gathered tail, merged."""
    ids = encode_prompt(quantized_model.tokenizer, " ".join(["The keeper climbed the stairs at dusk."] * 30))
    assert len(ids) > 256
    reference = _greedy(quantized_model, ids, n=48)
    assert _greedy(quantized_model, ids, RandomTreeDrafter(vocab_size=49152, seed=2, reference=ids + reference,
                                                           p_correct=0.7), 32, n=48) == reference


def test_quantize_a_tiny_llama(tokenizer):
    model = tiny_model("llama", seed=4)
    dense = {name: m.weight.clone() for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    quantize_model(model, "int4", dtype=torch.bfloat16)
    q_proj = model.model.layers[0].self_attn.q_proj
    assert isinstance(q_proj, Int4Linear) and q_proj.format == "int4-g32"
    assert isinstance(model.lm_head, Int8Linear)  # the head keeps 8 bits under int4
    error = (q_proj.dequantize().float() - dense["model.layers.0.self_attn.q_proj"]).abs()
    assert error.max() <= dense["model.layers.0.self_attn.q_proj"].abs().max() / 15  # half a step, bf16 scales
    head_error = (model.lm_head.dequantize().float() - dense["lm_head"]).abs().max()
    assert head_error <= dense["lm_head"].abs().max() / 127
    model.to(torch.bfloat16)
    prompt = list(range(5, 40))
    engine = Engine(model, tokenizer, max_len=128)
    events = engine.generate(prompt, sampling=SamplingConfig(temperature=0.0), max_new_tokens=40)
    ar = [t for event in events for t in event.tokens]
    assert len(ar) == 40


def test_shapes_the_int4_kernel_cannot_take_stay_dense():
    """Output rows must come in multiples of 16, inputs in whole groups: a draft vocabulary of 1000 tokens kept
    its head dense instead of failing in torch's packing."""
    from specchat.quant.quantize import quantize_linears

    module = torch.nn.ModuleDict({"odd_rows": torch.nn.Linear(64, 1000), "odd_inputs": torch.nn.Linear(40, 64),
                                  "fits": torch.nn.Linear(64, 1024)})  # fmt: skip
    quantize_linears(module, "int8", dtype=torch.float32)
    assert type(module["odd_rows"]) is torch.nn.Linear and type(module["odd_inputs"]) is torch.nn.Linear
    assert isinstance(module["fits"], Int8Linear)
    x = torch.randn(3, 64)
    torch.testing.assert_close(module["fits"](x), x @ module["fits"].dequantize().float().T + module["fits"].bias,
                               rtol=1e-4, atol=1e-4)  # fmt: skip


def test_the_activation_dtype_is_chosen_once_whatever_the_threads(tmp_path, monkeypatch):
    """float32 and bfloat16 activations answer differently: the choice, timed once, holds for every `--threads`."""
    from specchat.quant import fastest_dtype

    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path))
    choices = iter(["float32", "bfloat16"])  # what two timings under different loads might say
    monkeypatch.setattr(fastest_dtype, "_measure", lambda weights, shape: next(choices))
    threads = torch.get_num_threads()
    try:
        picked = []
        for count in (1, 2):
            torch.set_num_threads(count)
            picked.append(fastest_dtype.fastest_activation_dtype("q4_1", (1536, 576)))
    finally:
        torch.set_num_threads(threads)
    assert picked == [torch.float32, torch.float32]
