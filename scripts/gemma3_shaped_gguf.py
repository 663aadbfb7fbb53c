"""Write a BF16 GGUF file with Gemma 3 1B's shapes and random weights, laid out as llama.cpp's converter lays out
Gemma 3 (norms holding 1 + w): a speed figure's model where no Gemma file can be fetched. Its tokenizer is the
embedded model's, padded with unused tokens to Gemma's 262,144 (the LM head's size is what a step reads).
Quantize it as files ship with `scripts/requantize_gguf.py OUT.gguf Q4_K_M.gguf --type q4_k_m --llama-cpp`.

    python scripts/gemma3_shaped_gguf.py OUT.gguf
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' helpers
from gguf_files import _fields  # noqa: E402

from specchat.loading import embedded_gguf_path  # noqa: E402

# google/gemma-3-1b-it's config.json
HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 1152, 6912, 26, 4, 1, 256
VOCAB, WINDOW, CONTEXT = 262144, 512, 32768


def main() -> None:
    out = Path(sys.argv[1])
    rng = np.random.default_rng(0)
    writer = GGUFWriter(str(out), "gemma3")
    writer.add_name("gemma-3-1b-shaped (random weights)")
    fields, size = _fields(embedded_gguf_path(), "tokenizer.")
    for name, value, kind, element in fields:
        if name in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type"):
            pad = [f"<unused{i}>" for i in range(VOCAB - size)] if name.endswith("tokens") else [4] * (VOCAB - size)
            writer.add_key_value(name, [*value, *pad], kind, sub_type=element)
        elif element is None:
            writer.add_key_value(name, value, kind)
        else:
            writer.add_key_value(name, list(value), kind, sub_type=element)
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_freq_base(1e6)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_sliding_window(WINDOW)
    writer.add_key_value("gemma3.rope.freq_base_swa", 10000.0, GGUFValueType.FLOAT32)

    def bf16(name: str, rows: int, columns: int, std: float) -> None:
        values = torch.from_numpy(rng.normal(0, std, (rows, columns)).astype(np.float32)).to(torch.bfloat16)
        writer.add_tensor(name, values.view(torch.int16).numpy(), raw_dtype=GGMLQuantizationType.BF16)

    def norm(name: str, size: int) -> None:
        writer.add_tensor(name, rng.uniform(0.8, 1.2, size).astype(np.float32))

    bf16("token_embd.weight", VOCAB, HIDDEN, 0.03)
    for i in range(LAYERS):
        for name in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            norm(f"blk.{i}.{name}.weight", HIDDEN)
        norm(f"blk.{i}.attn_q_norm.weight", HEAD_DIM)
        norm(f"blk.{i}.attn_k_norm.weight", HEAD_DIM)
        for name, rows, columns in (("attn_q", HEADS * HEAD_DIM, HIDDEN), ("attn_k", KV_HEADS * HEAD_DIM, HIDDEN),
                                    ("attn_v", KV_HEADS * HEAD_DIM, HIDDEN), ("attn_output", HIDDEN, HEADS * HEAD_DIM),
                                    ("ffn_gate", INTERMEDIATE, HIDDEN), ("ffn_up", INTERMEDIATE, HIDDEN),
                                    ("ffn_down", HIDDEN, INTERMEDIATE)):  # fmt: skip
            bf16(f"blk.{i}.{name}.weight", rows, columns, 0.02)
    norm("output_norm.weight", HIDDEN)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main()
