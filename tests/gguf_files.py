"""Synthetic GGUF data for tests: blocks of random codes and scales in each type's layout, and a tiny random
qwen2 / llama model written as a GGUF file with gguf-py's writer (the embedded model's tokenizer inside)."""

from __future__ import annotations

import functools
import math
import mmap
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q

from specchat.gguf_header import ARRAY, STRING, Cursor, tensor_table
from specchat.gguf_header import LAYOUTS as LAYOUTS_OF_VALUES

# type -> (values per block, bytes per block, byte offsets of its fp16 scale fields)
LAYOUTS = {
    Q.Q4_0: (32, 18, [0]),
    Q.Q4_1: (32, 20, [0, 2]),
    Q.Q5_0: (32, 22, [0]),
    Q.Q5_1: (32, 24, [0, 2]),
    Q.Q8_0: (32, 34, [0]),
    Q.Q2_K: (256, 84, [80, 82]),
    Q.Q3_K: (256, 110, [108]),
    Q.Q4_K: (256, 144, [0, 2]),
    Q.Q5_K: (256, 176, [0, 2]),
    Q.Q6_K: (256, 210, [208]),
    Q.IQ4_NL: (32, 18, [0]),
    Q.IQ4_XS: (256, 136, [0]),
    Q.IQ2_XXS: (256, 66, [0]),
    Q.IQ2_XS: (256, 74, [0]),
    Q.IQ2_S: (256, 82, [0]),
    Q.IQ3_XXS: (256, 98, [0]),
    Q.IQ3_S: (256, 110, [0]),
    Q.IQ1_S: (256, 50, [0]),
    Q.IQ1_M: (256, 56, []),  # its fp16 scale is the top nibbles of its last four 16-bit words (`random_blocks`)
}
# per type: the fp16 scales' magnitude that gives weights of std ~0.1-0.3 (codes and sub-block scales vary)
SCALE = {Q.Q4_0: 0.05, Q.Q4_1: 0.05, Q.Q5_0: 0.02, Q.Q5_1: 0.02, Q.Q8_0: 0.004, Q.Q2_K: 0.01, Q.Q3_K: 5e-3,
         Q.Q4_K: 6e-4, Q.Q5_K: 3e-4, Q.Q6_K: 2e-4, Q.IQ4_NL: 3e-3, Q.IQ4_XS: 2e-4, Q.IQ2_XXS: 4e-3,
         Q.IQ2_XS: 4e-3, Q.IQ2_S: 4e-3, Q.IQ3_XXS: 3e-3, Q.IQ3_S: 1e-2, Q.IQ1_S: 1e-2, Q.IQ1_M: 1e-2}  # fmt: skip


def random_blocks(kind: Q, rows: int, columns: int, rng: np.random.Generator) -> np.ndarray:
    """[rows, bytes per row] uint8: random codes and sub-block scales, random finite fp16 block scales."""
    values, size, halves = LAYOUTS[kind]
    raw = rng.integers(0, 256, (rows, columns // values, size), dtype=np.uint8)
    scale = rng.uniform(0.5, 1.5, raw.shape[:2]) * SCALE[kind] * rng.choice([-1, 1], raw.shape[:2])
    for offset in halves:
        raw[..., offset : offset + 2] = scale.astype(np.float16)[..., None].view(np.uint8)
    if kind == Q.IQ1_M:  # nibble m of the fp16 scale is the top nibble of word m of the last four
        bits = scale.astype(np.float16).view(np.uint16)
        for m in range(4):
            raw[..., 49 + 2 * m] = (raw[..., 49 + 2 * m] & 0x0F) | (((bits >> 4 * m) & 0x0F) << 4).astype(np.uint8)
    return raw.reshape(rows, -1)


@functools.cache
def reader(path: Path):
    """gguf-py's reader of the GGUF file at `path`, parsed once per test process (the embedded model's takes 4-5 s:
    gguf-py reads its 49K-token vocabulary field by field); read only, its tensors memory-mapped."""
    from gguf import GGUFReader

    return GGUFReader(path)


def tokenizer_fields(writer, source: Path, pad: int = 0, chat_template: str | None = None) -> int:
    """Copy a GGUF file's tokenizer (its `tokenizer.*` fields) into `writer`, with `pad` unused tokens listed after its
    own (as a larger model's vocabulary pads its tokenizer's) and `chat_template` in place of its own where given;
    returns the vocabulary size."""
    fields, size = _fields(source, "tokenizer.")
    padding = {"tokenizer.ggml.tokens": [f"<unused{i}>" for i in range(pad)], "tokenizer.ggml.token_type": [4] * pad,
               "tokenizer.ggml.scores": [0.0] * pad}  # fmt: skip
    for name, value, kind, element in fields:
        if element is None:
            value = chat_template if name == "tokenizer.chat_template" and chat_template is not None else value
            writer.add_key_value(name, value, kind)
        else:
            writer.add_key_value(name, [*value, *padding.get(name, [])], kind, sub_type=element)
    return size + pad


def copy_fields(writer, source: Path, prefix: str = "") -> int:
    """Copy a GGUF file's metadata fields whose names start with `prefix` into `writer` (never the architecture the
    writer was made with); returns the vocabulary size."""
    fields, size = _fields(source, prefix)
    for name, value, kind, element in fields:
        if name == "general.architecture":
            continue
        if element is None:
            writer.add_key_value(name, value, kind)
        else:
            writer.add_key_value(name, list(value), kind, sub_type=element)
    return size


@functools.cache
def _fields(source: Path, prefix: str) -> tuple[tuple, int]:
    """The fields of a GGUF file whose names start with `prefix` as (name, value, type, element type) and the
    vocabulary size, read once per test process (the values are tuples: never changed in place) through specchat's
    header cursor: gguf-py's reader takes 4-5 s over the embedded model's 49K-token vocabulary, this 0.2 s."""
    from gguf import GGUFValueType

    size, fields = 0, []
    with source.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        cursor = Cursor(data)
        field_count = cursor.take("<4sIQQ")[3]
        for _ in range(field_count):
            name = cursor.string()
            (kind,) = cursor.take("<I")
            if not name.startswith(prefix):
                cursor.skip(kind)
            elif kind == ARRAY:
                element, count = cursor.take("<IQ")
                if element == STRING:
                    value = tuple(cursor.string() for _ in range(count))
                else:
                    value = cursor.take(f"<{count}{LAYOUTS_OF_VALUES[element][1:]}")
                size = max(size, count) if name == "tokenizer.ggml.tokens" else size
                fields.append((name, value, GGUFValueType(kind), GGUFValueType(element)))
            else:
                fields.append((name, cursor.value(kind), GGUFValueType(kind), None))
    return tuple(fields), size


def tensor_values(path: Path, name: str, dtype: torch.dtype) -> torch.Tensor:
    """Tensor `name` of a GGUF file as `dtype` values [rows, row length], read at its offset in the file's table."""
    ((_, _, shape, offset, size),) = [row for row in tensor_table(path) if row[0] == name]
    with path.open("rb") as file:
        file.seek(offset)
        return torch.frombuffer(bytearray(file.read(size)), dtype=dtype).reshape(shape[::-1])


GEMMA3_WINDOW = 48  # the tiny Gemma 3's sliding window: prompts cross it
GEMMA2_WINDOW, GEMMA2_CAPS = 32, (1.5, 2.0)  # the tiny Gemma 2's window; its caps, low enough to bite on its scores
PHI3_WINDOW, PHI3_ROTATED, PHI3_TRAINED = 40, 48, 4096  # the tiny Phi-3's window, rotated dims, LongRoPE's window
# the tiny Granite's multipliers (Granite 3.x's, but for the attention's: 1 / 64 with its heads of 64)
GRANITE_SCALES = {"embedding_scale": 12.0, "residual_scale": 0.22, "attention.scale": 0.015625, "logit_scale": 8.0}


def write_tiny_model(path: Path, tokenizer_source: Path | None, *, architecture: str = "qwen2", seed: int = 0,
                     layers: int = 2, tied: bool = False, name: str | None = None,
                     frequency_factors: list[float] | None = None, unquantized: bool | str = False,
                     padded_vocab: int = 0, chat_template: str | None = None) -> Path:  # fmt: skip
    """A random `architecture` model (hidden 256, 4 heads of 64 (qwen3, gemma2: 128, gemma3: 256), 2 KV heads, MLP 512)
    whose matrices use every block type (`unquantized`: F32, or "F16" / "BF16"), with q/k/v biases for qwen2 and q/k
    norms for qwen3; gemma3 with Gemma 3's norms, its first layer of each two over a window of GEMMA3_WINDOW keys
    (llama.cpp's names and layout: norms hold 1 + w); gemma2 with the same norms but q/k's, a window of GEMMA2_WINDOW
    keys on its first layer and its scores and logits soft-capped (GEMMA2_CAPS); phi3 as Phi-4-mini (fused q/k/v and
    gate/up, LongRoPE over PHI3_ROTATED of its 64 dims) with a window of PHI3_WINDOW keys on every layer; granite with
    GRANITE_SCALES; smollm3 as llama (llama.cpp leaves RoPE out of every fourth layer); the tokenizer of the GGUF file
    `tokenizer_source` (None: 512 stand-in tokens); `name` its `general.name`; `frequency_factors` its `rope_freqs`
    tensor (32 factors, RoPE base 10000); `padded_vocab` unused tokens listed after the tokenizer's (and rows of the
    embedding and head for them); `chat_template` in place of the tokenizer's."""
    from gguf import GGUFWriter

    rng = np.random.default_rng(seed)
    hidden, intermediate, heads, kv_heads = 256, 512, 4, 2
    gemma = architecture in ("gemma3", "gemma2")
    # qwen3's heads are wider than hidden / heads, as in Qwen3-0.6B's; Gemma 3's are 256 wide
    dim = {"qwen3": 128, "gemma2": 128, "gemma3": 256}.get(architecture, 64)
    writer = GGUFWriter(str(path), architecture)
    if name is not None:
        writer.add_name(name)
    if tokenizer_source is None:  # a stand-in vocabulary: the tokens' count alone (no tokenizer can be built)
        vocab = 512
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list([f"t{i}" for i in range(vocab)])
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
    else:
        vocab = tokenizer_fields(writer, tokenizer_source, padded_vocab, chat_template)
    phi3 = architecture == "phi3"  # as llama.cpp's converter writes Phi-3: 2x the trained window, LongRoPE's factor
    writer.add_context_length(2 * PHI3_TRAINED if phi3 else 4096)  # room for the 3K-token tests
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(intermediate)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(1e6 if architecture == "gemma3" else 10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_dimension_count(PHI3_ROTATED if phi3 else dim)
    if architecture in ("qwen3", "gemma3", "gemma2"):
        writer.add_key_length(dim)
        writer.add_value_length(dim)
    if architecture == "gemma3":
        writer.add_sliding_window(GEMMA3_WINDOW)
        writer.add_uint32("gemma3.attention.sliding_window_pattern", 2)
    if architecture == "gemma2":
        writer.add_sliding_window(GEMMA2_WINDOW)
        writer.add_float32("gemma2.attn_logit_softcapping", GEMMA2_CAPS[0])
        writer.add_float32("gemma2.final_logit_softcapping", GEMMA2_CAPS[1])
    if architecture == "granite":
        for key, value in GRANITE_SCALES.items():
            writer.add_float32(f"granite.{key}", value)
    if phi3:
        writer.add_rope_scaling_orig_ctx_len(PHI3_TRAINED)
        writer.add_rope_scaling_attn_factors((1 + np.log(2) / np.log(PHI3_TRAINED)) ** 0.5)
        writer.add_sliding_window(PHI3_WINDOW)

    padding = np.random.default_rng(seed + 1)  # the padded tokens' rows: a padded file is its unpadded one plus them

    def matrix(name: str, kind: Q, rows: int, columns: int) -> None:
        padded = rows == vocab and padded_vocab
        parts = [(rows - padded_vocab, rng), (padded_vocab, padding)] if padded else [(rows, rng)]
        if unquantized:
            # drawn in fp32: a float64 draw, then a copy to fp32, took ~3 s of each 100 MB file's 4
            drawn = [draw.standard_normal((n, columns), dtype=np.float32) for n, draw in parts]
            values = np.concatenate(drawn) if len(drawn) > 1 else drawn[0]
            values *= 0.05
            if unquantized == "BF16":  # each value's top 16 bits
                bits = (values.view(np.uint32) >> 16).astype(np.uint16)
                writer.add_tensor(name, bits.view(np.uint8).reshape(rows, 2 * columns), raw_dtype=Q.BF16)
            else:
                writer.add_tensor(name, values.astype(np.float16) if unquantized == "F16" else values)
        else:
            blocks = np.concatenate([random_blocks(kind, n, columns, draw) for n, draw in parts])
            writer.add_tensor(name, blocks, raw_dtype=kind)

    def dense(name: str, values: np.ndarray) -> None:
        writer.add_tensor(name, values.astype(np.float32))

    kinds = list(LAYOUTS)
    matrix("token_embd.weight", Q.Q8_0, vocab, hidden)
    for i in range(layers):
        dense(f"blk.{i}.attn_norm.weight", rng.uniform(0.8, 1.2, hidden))
        dense(f"blk.{i}.ffn_norm.weight", rng.uniform(0.8, 1.2, hidden))
        if gemma:
            dense(f"blk.{i}.post_attention_norm.weight", rng.uniform(0.8, 1.2, hidden))
            dense(f"blk.{i}.post_ffw_norm.weight", rng.uniform(0.8, 1.2, hidden))
        if architecture in ("qwen3", "gemma3"):
            dense(f"blk.{i}.attn_q_norm.weight", rng.uniform(0.8, 1.2, dim))
            dense(f"blk.{i}.attn_k_norm.weight", rng.uniform(0.8, 1.2, dim))
        shapes = [("attn_q", heads * dim, hidden), ("attn_k", kv_heads * dim, hidden),
                  ("attn_v", kv_heads * dim, hidden), ("attn_output", hidden, heads * dim),
                  ("ffn_gate", intermediate, hidden), ("ffn_up", intermediate, hidden),
                  ("ffn_down", hidden, intermediate)]
        if phi3:  # q/k/v in one matrix, gate and up in another (gate's rows first)
            shapes = [("attn_qkv", (heads + 2 * kv_heads) * dim, hidden), ("attn_output", hidden, heads * dim),
                      ("ffn_up", 2 * intermediate, hidden), ("ffn_down", hidden, intermediate)]
        for j, (name, rows, columns) in enumerate(shapes):
            matrix(f"blk.{i}.{name}.weight", kinds[(i * 7 + j) % len(kinds)], rows, columns)
            if architecture == "qwen2" and name in ("attn_q", "attn_k", "attn_v"):
                dense(f"blk.{i}.{name}.bias", rng.normal(0, 0.5, rows))
    dense("output_norm.weight", rng.uniform(0.8, 1.2, hidden))
    if frequency_factors is not None:
        dense("rope_freqs.weight", np.array(frequency_factors))
    if phi3:
        dense("rope_factors_long.weight", rng.uniform(1.0, 8.0, PHI3_ROTATED // 2))
        dense("rope_factors_short.weight", rng.uniform(1.0, 1.5, PHI3_ROTATED // 2))
    if not tied:
        matrix("output.weight", Q.Q6_K, vocab, hidden)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def llama3_frequency_factors(factor: float, *, base: float = 10000.0, dim: int = 64, low: float = 1.0,
                             high: float = 4.0, old_context: int = 8192) -> list[float]:  # fmt: skip
    """The `rope_freqs` factors llama.cpp's converter writes for Llama 3's RoPE scaling: per rotary pair, 1 for
    wavelengths under `old_context / high`, `factor` over `old_context / low`, interpolated between (in float64)."""
    factors = []
    for i in range(0, dim, 2):
        wavelength = 2 * math.pi * base ** (i / dim)
        if wavelength < old_context / high:
            factors.append(1.0)
        elif wavelength > old_context / low:
            factors.append(factor)
        else:
            smooth = (old_context / wavelength - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return factors


SENTENCEPIECE_WORDS = ("the", "hello", "world", "a", "tool", "call", "weather", "city", "is", "what", "in", "paris")
SENTENCEPIECE_TEMPLATE = ("{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{{ eos_token }}"
                          "{% endfor %}{% if tools %}[tools] {{ tools | tojson }}{% endif %}"
                          "{% if add_generation_prompt %}[assistant] {% endif %}")  # fmt: skip


def write_sentencepiece_vocabulary(path: Path) -> Path:
    """A GGUF file holding only a tokenizer (`tokenizer.*` fields) of a sentencepiece vocabulary, as llama.cpp writes
    Llama 2's, Phi-3's and Gemma's: <unk>, <s>, </s> and an end-of-turn control token, the 256 byte tokens, the letters
    and SENTENCEPIECE_WORDS with their pieces (scores preferring longer ones), BOS added, a chat template."""
    from gguf import GGUFWriter

    pieces = {"\u2581": 0.0}
    for word in SENTENCEPIECE_WORDS:
        spelled = "\u2581" + word
        for end in range(2, len(spelled) + 1):  # every prefix, so each piece is a merge of two pieces listed
            pieces.setdefault(spelled[:end], -float(len(pieces)))
        for letter in word:
            pieces.setdefault(letter, -100.0 - ord(letter))
    tokens = ["<unk>", "<s>", "</s>", "<|end|>", *(f"<0x{byte:02X}>" for byte in range(256)), *pieces]
    types = [2, 3, 3, 3, *[6] * 256, *[1] * len(pieces)]  # unknown, control, byte, normal
    writer = GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * 260 + list(pieces.values()))
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_chat_template(SENTENCEPIECE_TEMPLATE)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
