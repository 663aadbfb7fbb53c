"""The tensor table read from a GGUF header directly is gguf-py's: names, types, shapes, offsets and sizes, past
every kind of metadata field and under a custom data alignment; a header cut anywhere is a ValueError."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFWriter
from gguf_files import random_blocks

from specchat.gguf_header import general_fields, header_fields, tensor_table


@pytest.fixture(scope="module")
def mixed_gguf(tmp_path_factory):
    """Fields of every kind (strings, arrays of strings and numbers, scalars), tensors of four types, data
    aligned to 64 bytes."""
    path = tmp_path_factory.mktemp("gguf") / "mixed.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_name("Mixed")
    writer.add_custom_alignment(64)
    writer.add_token_list(["<s>", "a", "bé", "日本"] * 50)
    writer.add_token_scores([0.5] * 200)
    writer.add_uint32("llama.block_count", 1)
    writer.add_float32("llama.rope.freq_base", 10000.0)
    writer.add_bool("tokenizer.ggml.add_bos_token", True)
    rng = np.random.default_rng(0)
    writer.add_tensor("norm.weight", rng.standard_normal(96).astype(np.float32))
    writer.add_tensor("embed.weight", rng.standard_normal((3, 96)).astype(np.float16))
    for kind in (Q.Q8_0, Q.Q4_K):
        blocks = random_blocks(kind, 5, 256, rng)
        writer.add_tensor(f"{kind.name.lower()}.weight", blocks, raw_shape=blocks.shape, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_tensor_table_is_gguf_pys(mixed_gguf):
    reference = [[t.name, int(t.tensor_type), [int(n) for n in t.shape], int(t.data_offset), int(t.n_bytes)]
                 for t in GGUFReader(mixed_gguf).tensors]  # fmt: skip
    assert tensor_table(mixed_gguf) == reference
    assert all(offset % 64 == 0 for _, _, _, offset, _ in reference)
    assert general_fields(mixed_gguf) == {"general.architecture": "llama", "general.name": "Mixed"}


def test_a_cut_header_is_a_value_error(mixed_gguf, tmp_path):
    whole = mixed_gguf.read_bytes()
    data_start = min(offset for _, _, _, offset, _ in tensor_table(mixed_gguf))
    cut = tmp_path / "cut.gguf"
    for length in [0, 3, 20, *range(24, data_start - 64, 97)]:  # into the magic, the counts, fields, tensor infos
        cut.write_bytes(whole[:length])
        with pytest.raises(ValueError):
            tensor_table(cut)


def test_the_fields_are_gguf_pys_with_arrays_as_their_length(mixed_gguf, tmp_path):
    fields = header_fields(mixed_gguf)
    reference = {}
    for name, field in GGUFReader(mixed_gguf).fields.items():
        if name.startswith("GGUF."):
            continue
        value = field.contents()
        reference[name] = len(value) if isinstance(value, list) else value
    assert fields.keys() == reference.keys() and fields["tokenizer.ggml.tokens"] == 200
    for name, value in reference.items():
        assert fields[name] == pytest.approx(value) if isinstance(value, float) else fields[name] == value, name
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(mixed_gguf.read_bytes()[:300])
    with pytest.raises(ValueError):
        header_fields(cut)
