"""Write a BF16 GGUF file with a real model's shapes and random weights, laid out as llama.cpp's converter lays out
that architecture: a speed figure's model where its file cannot be fetched. Its tokenizer is the embedded model's,
padded with unused tokens to the model's vocabulary (the LM head's size is what a step reads). Quantize it as files
ship with `scripts/requantize_gguf.py OUT.gguf Q4_K_M.gguf --type q4_k_m --llama-cpp`.

    python scripts/shaped_gguf.py gemma3-1b|gemma3-4b|gemma2-2b|phi4-mini|phi3.5-mini|llama3.1-8b|smollm3-3b OUT.gguf

The tensors are spooled to a temporary file as they are drawn: an 8B's 16 GB of bf16 never sit in memory at once.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter, RopeScalingType

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' helpers
from gguf_files import _fields, llama3_frequency_factors, tokenizer_fields  # noqa: E402

from specchat.loading import embedded_gguf_path  # noqa: E402

# From each model's config.json: google/gemma-3-1b-it, google/gemma-3-4b-it (text), google/gemma-2-2b-it,
# microsoft/Phi-4-mini-instruct, microsoft/Phi-3.5-mini-instruct, meta-llama/Llama-3.1-8B-Instruct,
# HuggingFaceTB/SmolLM3-3B
SHAPES = {
    "gemma3-1b": dict(architecture="gemma3", hidden=1152, intermediate=6912, layers=26, heads=4, kv_heads=1,
                      head_dim=256, vocab=262144, context=32768, window=512),
    "gemma3-4b": dict(architecture="gemma3", hidden=2560, intermediate=10240, layers=34, heads=8, kv_heads=4,
                      head_dim=256, vocab=262208, context=131072, window=1024, linear_scaling=8.0),
    "gemma2-2b": dict(architecture="gemma2", hidden=2304, intermediate=9216, layers=26, heads=8, kv_heads=4,
                      head_dim=256, vocab=256000, context=8192, window=4096, caps=(50.0, 30.0)),
    "phi4-mini": dict(architecture="phi3", hidden=3072, intermediate=8192, layers=32, heads=24, kv_heads=8,
                      head_dim=128, vocab=200064, context=131072, rotated=96, trained=4096),
    # its vocabulary is 32,064, under the embedded tokenizer's 49,152: the head is written that size (~2% more bytes a
    # step); its name has no "phi3" or "phi-3", which would make llama.cpp look up Phi-3's special tokens
    "phi3.5-mini": dict(architecture="phi3", hidden=3072, intermediate=8192, layers=32, heads=32, kv_heads=32,
                        head_dim=96, vocab=49152, context=131072, rotated=96, trained=4096, head=True,
                        name="phi 3.5 mini-shaped (random weights)"),
    "llama3.1-8b": dict(architecture="llama", hidden=4096, intermediate=14336, layers=32, heads=32, kv_heads=8,
                        head_dim=128, vocab=128256, context=131072, head=True, rope_base=500000.0, llama3_factor=8.0),
    "smollm3-3b": dict(architecture="smollm3", hidden=2048, intermediate=11008, layers=36, heads=16, kv_heads=4,
                       head_dim=128, vocab=128256, context=65536, rope_base=5000000.0),
}  # fmt: skip


def main() -> None:
    shape, out = SHAPES[sys.argv[1]], Path(sys.argv[2])
    arch, hidden, layers, dim = shape["architecture"], shape["hidden"], shape["layers"], shape["head_dim"]
    heads, kv_heads, intermediate, vocab = shape["heads"], shape["kv_heads"], shape["intermediate"], shape["vocab"]
    rng = np.random.default_rng(0)
    writer = GGUFWriter(str(out), arch, use_temp_file=True)
    writer.add_name(shape.get("name", f"{sys.argv[1]}-shaped (random weights)"))
    size = _fields(embedded_gguf_path(), "tokenizer.")[1]
    tokenizer_fields(writer, embedded_gguf_path(), pad=vocab - size)
    writer.add_context_length(shape["context"])
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(intermediate)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-6)
    if arch == "gemma3":
        writer.add_key_length(dim)
        writer.add_value_length(dim)
        writer.add_rope_freq_base(1e6)
        writer.add_sliding_window(shape["window"])
        writer.add_key_value("gemma3.rope.freq_base_swa", 10000.0, GGUFValueType.FLOAT32)
        if "linear_scaling" in shape:  # the full-attention layers' positions stretched
            writer.add_rope_scaling_type(RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(shape["linear_scaling"])
    elif arch == "gemma2":  # a window on every other layer, soft caps
        writer.add_key_length(dim)
        writer.add_value_length(dim)
        writer.add_sliding_window(shape["window"])
        writer.add_float32("gemma2.attn_logit_softcapping", shape["caps"][0])
        writer.add_float32("gemma2.final_logit_softcapping", shape["caps"][1])
    elif arch in ("llama", "smollm3"):
        writer.add_rope_freq_base(shape["rope_base"])
        writer.add_rope_dimension_count(dim)
    else:  # Phi-3's LongRoPE over its rotated dims
        writer.add_rope_freq_base(10000.0)
        writer.add_rope_dimension_count(shape["rotated"])
        writer.add_rope_scaling_orig_ctx_len(shape["trained"])
        writer.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(shape["context"] / shape["trained"])
                                                       / math.log(shape["trained"])))  # fmt: skip
        writer.add_sliding_window(0)

    def bf16(name: str, rows: int, columns: int, std: float) -> None:
        values = torch.from_numpy(rng.standard_normal((rows, columns), dtype=np.float32) * std).to(torch.bfloat16)
        writer.add_tensor(name, values.view(torch.int16).numpy(), raw_dtype=GGMLQuantizationType.BF16)

    def f32(name: str, values: np.ndarray) -> None:
        writer.add_tensor(name, values.astype(np.float32))

    bf16("token_embd.weight", vocab, hidden, 0.03)
    for i in range(layers):
        gemma, separate = arch in ("gemma3", "gemma2"), arch != "phi3"
        norms = ("attn_norm", "ffn_norm") + (("post_attention_norm", "post_ffw_norm") if gemma else ())
        for name in norms:
            f32(f"blk.{i}.{name}.weight", rng.uniform(0.8, 1.2, hidden))
        if arch == "gemma3":
            f32(f"blk.{i}.attn_q_norm.weight", rng.uniform(0.8, 1.2, dim))
            f32(f"blk.{i}.attn_k_norm.weight", rng.uniform(0.8, 1.2, dim))
        if separate:
            matrices = [("attn_q", heads * dim, hidden), ("attn_k", kv_heads * dim, hidden),
                        ("attn_v", kv_heads * dim, hidden), ("ffn_gate", intermediate, hidden),
                        ("ffn_up", intermediate, hidden)]  # fmt: skip
        else:
            matrices = [("attn_qkv", (heads + 2 * kv_heads) * dim, hidden), ("ffn_up", 2 * intermediate, hidden)]
        matrices += [("attn_output", hidden, heads * dim), ("ffn_down", hidden, intermediate)]
        for name, rows, columns in matrices:
            bf16(f"blk.{i}.{name}.weight", rows, columns, 0.02)
    f32("output_norm.weight", rng.uniform(0.8, 1.2, hidden))
    if shape.get("head"):  # an output head of its own (the others tie it to the embedding)
        bf16("output.weight", vocab, hidden, 0.02)
    if "llama3_factor" in shape:  # Llama 3.1's RoPE scaling, as its converter writes it: a factor per rotary pair
        f32("rope_freqs.weight", np.array(llama3_frequency_factors(shape["llama3_factor"], base=shape["rope_base"],
                                                                   dim=dim)))
    if arch == "phi3":
        f32("rope_factors_long.weight", rng.uniform(1.0, 40.0, shape["rotated"] // 2))
        f32("rope_factors_short.weight", rng.uniform(1.0, 1.5, shape["rotated"] // 2))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main()
