"""Dense matrices written as GGUF blocks (`kernels/cpu/gguf/quantize.h`) and `--quantize q4_k_m` / `q8_0`'s choice of
block type per matrix (`quant/gguf_quantize.py`): the bytes ggml reads, as close to the dense values as ggml's own
quantizer's, and llama-quantize's types."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from transformers import AutoConfig, AutoModelForCausalLM

from specchat.architectures import parts
from specchat.kernels.cpu.cpu_decoder import cpu_decoder
from specchat.quant.gguf_linear import GGUFEmbedding, GGUFLinear
from specchat.quant.gguf_quantize import more_bits, quantize_to_gguf
from specchat.quant.gguf_types import BLOCK_TYPES, Q4_K, Q5_0, Q6_K, Q8_0
from specchat.quant.q4_k import k_quant_blocks

Q5_K = 13
# the RMS error over the RMS value each type reaches on `_matrix` (ggml's quantizer reaches the same)
RELATIVE_ERROR = {Q4_K: 0.0897, Q5_K: 0.0452, Q6_K: 0.0260, Q8_0: 0.0088, Q5_0: 0.0699}


def _matrix(rows: int = 256, cols: int = 1536) -> torch.Tensor:
    """Gaussian weights with a column of outliers every 97, as trained matrices have."""
    weight = torch.randn(rows, cols, generator=torch.Generator().manual_seed(0)) * 0.02
    weight[:, ::97] *= 8
    return weight


def _relative_error(blocks: np.ndarray, type_id: int, weight: torch.Tensor) -> float:
    back = torch.from_numpy(dequantize(blocks, GGMLQuantizationType(type_id))).reshape(weight.shape)
    return ((back - weight).pow(2).mean() / weight.pow(2).mean()).sqrt().item()


@pytest.mark.parametrize("type_id", list(RELATIVE_ERROR), ids=lambda t: BLOCK_TYPES[t].name)
def test_blocks_are_read_back_by_ggml_close_to_the_dense_values(type_id):
    """gguf-py's dequantization (ggml's layout) and the CPU decoder's give the same values, within the type's
    error of the dense ones; bf16 rows are quantized from their values."""
    weight = _matrix()
    blocks = cpu_decoder().gguf_quantize(weight, type_id)
    assert blocks.shape == (256, BLOCK_TYPES[type_id].row_bytes(1536))
    back = torch.from_numpy(dequantize(blocks.numpy(), GGMLQuantizationType(type_id))).reshape(weight.shape)
    assert torch.equal(back, cpu_decoder().gguf_rows(blocks, type_id, 1, 1536, torch.arange(256)))
    assert _relative_error(blocks.numpy(), type_id, weight) < RELATIVE_ERROR[type_id]
    assert torch.equal(cpu_decoder().gguf_quantize(weight.bfloat16(), type_id),
                       cpu_decoder().gguf_quantize(weight.bfloat16().float(), type_id))  # fmt: skip


def test_the_k_quant_search_beats_fitting_each_range():
    """The searched scales and minima of Q4_K / Q5_K against the sub-block's range split evenly (`quant/q4_k.py`,
    the drafts' quantizer): closer on the same matrix."""
    weight = _matrix()
    for bits, type_id in ((4, Q4_K), (5, Q5_K)):
        searched = _relative_error(cpu_decoder().gguf_quantize(weight, type_id).numpy(), type_id, weight)
        ranged = _relative_error(k_quant_blocks(weight, bits=bits).numpy(), type_id, weight)
        assert searched < 0.96 * ranged


def test_a_zero_row_and_a_constant_row_are_held_exactly():
    weight = torch.zeros(2, 512)
    weight[1] = 0.25
    for type_id in RELATIVE_ERROR:
        blocks = cpu_decoder().gguf_quantize(weight, type_id)
        torch.testing.assert_close(cpu_decoder().gguf_rows(blocks, type_id, 1, 512, torch.arange(2)), weight,
                                   atol=1e-3, rtol=0)  # fmt: skip


def test_rows_of_no_whole_block_and_other_types_are_refused():
    with pytest.raises(RuntimeError, match="no whole number"):
        cpu_decoder().gguf_quantize(torch.zeros(4, 96), Q4_K)
    with pytest.raises(RuntimeError, match="no quantizer"):
        cpu_decoder().gguf_quantize(torch.zeros(4, 256), 10)  # Q2_K


def test_blocks_are_ggmls_own_where_llama_cpp_is_installed():
    """Against ggml's quantizer itself (llama-cpp-python's library): the same error, and the same bytes but for
    blocks where a near tie falls the other way in another order of float sums."""
    llama_cpp = pytest.importorskip("llama_cpp")
    library = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    library.ggml_quantize_chunk.restype = ctypes.c_size_t
    library.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                            ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]  # fmt: skip
    weight = _matrix()
    values = weight.numpy()
    for type_id, identical in ((Q4_K, 0.97), (Q5_K, 0.98), (Q6_K, 0.999), (Q8_0, 0.999), (Q5_0, 0.999)):
        theirs = np.zeros((256, BLOCK_TYPES[type_id].row_bytes(1536)), np.uint8)
        library.ggml_quantize_chunk(type_id, values.ctypes.data, theirs.ctypes.data, 0, 256, 1536, None)
        ours = cpu_decoder().gguf_quantize(weight, type_id).numpy()
        width = BLOCK_TYPES[type_id].bytes
        assert (ours.reshape(-1, width) == theirs.reshape(-1, width)).all(1).mean() >= identical
        assert _relative_error(ours, type_id, weight) == pytest.approx(_relative_error(theirs, type_id, weight),
                                                                        rel=1e-3)  # fmt: skip


def test_more_bits_are_the_layers_llama_cpp_gives_them():
    """Qwen2.5-Coder-1.5B's Q4_K_M file (28 layers) holds attn_v and ffn_down in Q6_K in these layers."""
    assert [i for i in range(28) if more_bits(i, 28)] == [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27]


def _model(hidden: int, *, tied: bool):
    config = AutoConfig.for_model("llama", vocab_size=512, hidden_size=hidden, intermediate_size=512,
                                  num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                                  tie_word_embeddings=tied)  # fmt: skip
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval().requires_grad_(False)


def _types(module) -> list[int]:
    return module.type_ids if isinstance(module, GGUFLinear) else [module.type_id]


@torch.inference_mode()
def test_q4_k_m_gives_each_matrix_llama_quantizes_type():
    model = _model(256, tied=False)
    quantize_to_gguf(model, "q4_k_m", dtype=torch.float32)
    decoder = parts(model)
    for i, layer in enumerate(decoder.layers):
        precise = [Q6_K] if i in (0, 3, 6, 7) else [Q4_K]
        assert _types(layer.v) == precise and _types(layer.down) == precise
        assert all(_types(m) == [Q4_K] for m in (layer.q, layer.k, layer.o, layer.module.mlp.up_proj))
    assert _types(decoder.head) == [Q6_K] and isinstance(decoder.embed, GGUFEmbedding)
    assert _types(decoder.embed) == [Q4_K]


@torch.inference_mode()
def test_a_tied_head_and_its_embedding_share_one_table():
    model = _model(256, tied=True)
    dense = model.model.embed_tokens.weight.clone()
    quantize_to_gguf(model, "q4_k_m", dtype=torch.float32)
    decoder = parts(model)
    assert _types(decoder.embed) == _types(decoder.head) == [Q6_K]
    ids = torch.tensor([3, 7, 500])
    torch.testing.assert_close(decoder.embed(ids), decoder.head.dequantize_rows(ids))
    torch.testing.assert_close(decoder.embed(ids), dense[ids], atol=0.03 * dense.abs().max().item(), rtol=0)


@torch.inference_mode()
def test_rows_of_no_whole_group_fall_back_as_llama_cpps_do():
    """Rows of 96 values (no 256-value group): Q4_K's matrices in Q5_0, Q6_K's in Q8_0."""
    model = _model(96, tied=False)
    quantize_to_gguf(model, "q4_k_m", dtype=torch.float32)
    decoder = parts(model)
    assert _types(decoder.layers[1].q) == [Q5_0] and _types(decoder.layers[0].v) == [Q8_0]
    assert _types(decoder.layers[1].down) == [Q4_K]  # its rows hold 512 values
    assert _types(decoder.head) == [Q8_0]


@torch.inference_mode()
def test_q8_0_computes_the_dense_model_closely():
    model = _model(256, tied=False)
    ids = torch.randint(0, 512, (1, 24), generator=torch.Generator().manual_seed(1))
    dense = model(ids).logits.log_softmax(-1)
    quantize_to_gguf(model, "q8_0", dtype=torch.float32)
    assert all(_types(m) == [Q8_0] for m in (parts(model).layers[0].q, parts(model).head, parts(model).embed))
    quantized = model(ids).logits.log_softmax(-1)
    kl = (dense.exp() * (dense - quantized)).sum(-1).mean().item()
    assert kl < 1e-3
