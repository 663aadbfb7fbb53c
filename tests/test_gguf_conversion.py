"""A GGUF file converted once for transformers (`gguf_checkpoint`): its config, read from the header, is
transformers' own reading of it (gguf-py's) plus the RoPE scaling transformers drops (linear and YaRN from the
`rope.scaling.*` fields, Llama 3's from a `rope_freqs` tensor), and a file specchat cannot run is a ValueError
naming why; its tokenizer encodes, decodes and templates chats as `AutoTokenizer`'s conversion of the file does,
also where it is another converted file's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFWriter
from gguf_files import llama3_frequency_factors, write_tiny_model
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from specchat.errors import SpecchatError
from specchat.gguf_config import gguf_config
from specchat.gguf_header import tokenizer_digest
from specchat.loading import GGUF_DIR, embedded_gguf_path, gguf_checkpoint

SHAPES = ("max_position_embeddings", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "rms_norm_eps", "rope_parameters", "vocab_size", "tie_word_embeddings",
          "bos_token_id", "eos_token_id", "pad_token_id", "model_type")  # fmt: skip


def header(path, architecture="llama", *, scaling: dict | None = None, factors=None, drop: str | None = None):
    """A header-only llama file (hidden 256, 4 heads of 64, RoPE base 10000): the fields and tensors a config
    reads, `scaling` as `rope.scaling.*` fields, `factors` as a `rope_freqs` tensor, field `drop` left out."""
    writer = GGUFWriter(str(path), architecture)
    fields = {"context_length": 4096, "embedding_length": 256, "feed_forward_length": 512, "block_count": 2,
              "attention.head_count": 4, "attention.head_count_kv": 2, "attention.layer_norm_rms_epsilon": 1e-5,
              "rope.freq_base": 10000.0}  # fmt: skip
    for name, value in fields.items():
        if name != drop:
            add = writer.add_float32 if isinstance(value, float) else writer.add_uint32
            add(f"{architecture}.{name}", value)
    for name, value in (scaling or {}).items():
        add = {str: writer.add_string, int: writer.add_uint32, float: writer.add_float32}[type(value)]
        add(f"{architecture}.rope.scaling.{name}", value)
    writer.add_tensor("token_embd.weight", np.zeros((100, 256), dtype=np.float32))
    if factors is not None:
        writer.add_tensor("rope_freqs.weight", np.array(factors, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_rope_scaling_is_the_files(tmp_path):
    plain = gguf_config(header(tmp_path / "plain.gguf"))
    assert plain.rope_parameters == {"rope_type": "default", "rope_theta": 10000.0}
    assert plain.vocab_size == 100 and plain.tie_word_embeddings and plain.head_dim == 64
    linear = gguf_config(header(tmp_path / "linear.gguf", scaling={"type": "linear", "factor": 8.0}))
    assert linear.rope_parameters == {"rope_type": "linear", "rope_theta": 10000.0, "factor": 8.0}
    llama3 = gguf_config(header(tmp_path / "llama3.gguf", factors=llama3_frequency_factors(8.0)))
    assert llama3.rope_parameters == {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 8192}  # fmt: skip


def test_a_yarn_files_window_is_the_stretched_one(tmp_path):
    """As llama.cpp writes YaRN (Qwen2.5's `--rope-scaling yarn` config converted): type, factor, the trained
    window (else the context length, llama.cpp's default) and the ramp's ends when set; the window is the trained
    one times the factor, as vLLM reads a YaRN config."""
    yarn = gguf_config(header(tmp_path / "yarn.gguf", scaling={"type": "yarn", "factor": 4.0}))
    assert yarn.rope_parameters == {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                    "original_max_position_embeddings": 4096}  # fmt: skip
    assert yarn.max_position_embeddings == 16384
    scaling = {"type": "yarn", "factor": 4.0, "original_context_length": 1024, "yarn_beta_fast": 16.0}
    stretched = gguf_config(header(tmp_path / "stretched.gguf", scaling=scaling))  # context_length: the stretched
    assert stretched.rope_parameters == {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                         "original_max_position_embeddings": 1024, "beta_fast": 16.0}  # fmt: skip
    assert stretched.max_position_embeddings == 4096


@pytest.mark.parametrize(
    "options, message",
    [({"architecture": "falcon"}, "is a falcon model; specchat runs llama, qwen2, qwen3, mistral, phi3, granite, "
                                  "smollm3, gemma3, gemma2 GGUF files"),
     ({"scaling": {"type": "longrope", "factor": 4.0}}, "asks for longrope RoPE scaling"),
     ({"factors": [2.0] * 32}, "rope_freqs tensor \\(32 factors\\) is not Llama 3's RoPE scaling"),
     ({"drop": "block_count"}, "has no 'llama.block_count' field")],
    ids=["architecture", "longrope", "factors", "field"],
)  # fmt: skip
def test_what_specchat_cannot_run_is_named(tmp_path, options, message):
    with pytest.raises(ValueError, match=message):
        gguf_config(header(tmp_path / "bad.gguf", **options))


TEXTS = ["Hello, world", "  two leading spaces\n\n\ttab, then\r\nCRLF   ", "def f(x):\n    return x ** 2  # 1234567",
         "naïve café, Übergröße, 中文分词, 日本語のテキスト, русский, العربية, 🙂👍🏽", "don't, I'll, we've; THEY'RE",
         "<|im_start|>user\nhi<|im_end|><|endoftext|>", "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>", "x" * 300,
         "\u00a0\u2003nbsp and em space", ""]  # fmt: skip
CHATS = [[{"role": "user", "content": "Write a haiku."}],
         [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
          {"role": "assistant", "content": "Hello! 🙂"}, {"role": "user", "content": "2+2?"}]]  # fmt: skip


@pytest.mark.parametrize("name", ["embedded", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"])
def test_the_tokenizer_is_autotokenizers_conversion_of_the_file(name):
    path = embedded_gguf_path() if name == "embedded" else (GGUF_DIR / name).expanduser()
    if not path.is_file():
        pytest.skip(f"{name} is not on this machine")
    theirs = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    assert_tokenizes_as(gguf_checkpoint(path), theirs)  # as a load converts it


OWN_TEMPLATE = "{% for message in messages %}[{{ message['role'] }}] {{ message['content'] }}\n{% endfor %}"


def test_a_file_whose_tokenizer_another_has_reads_its_conversion_with_its_own_chat_template(tmp_path, monkeypatch):
    """Another quantization or size of a converted model (the same tokenizer fields; here another chat template) takes
    the converted tokenizer instead of converting the vocabulary again (Qwen's 152K tokens: 1 s against 4 s), and it
    is the file's own conversion all the same, its template included. The same fields under another architecture
    are not taken: transformers picks its conversion by the architecture."""
    import transformers.integrations.gguf

    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "cache"))
    converted = write_tiny_model(tmp_path / "a.gguf", embedded_gguf_path(), architecture="llama", layers=1)
    gguf_checkpoint(converted)
    other = write_tiny_model(tmp_path / "b.gguf", embedded_gguf_path(), architecture="llama", layers=1, seed=1,
                             chat_template=OWN_TEMPLATE)  # fmt: skip
    assert tokenizer_digest(other) == tokenizer_digest(converted)
    qwen2 = write_tiny_model(tmp_path / "c.gguf", embedded_gguf_path(), architecture="qwen2", layers=1)
    assert tokenizer_digest(qwen2) != tokenizer_digest(converted)

    def converting(*_args):
        raise AssertionError("the vocabulary was converted again")

    with monkeypatch.context() as patched:
        patched.setattr(transformers.integrations.gguf, "get_gguf_tokenizer", converting)
        shared = gguf_checkpoint(other)
    assert AutoTokenizer.from_pretrained(shared).chat_template == OWN_TEMPLATE
    assert_tokenizes_as(shared, PreTrainedTokenizerFast.from_pretrained(other.parent, gguf_file=other.name))


def assert_tokenizes_as(directory: str, theirs) -> None:
    """The tokenizer in `directory` encodes, decodes, templates chats and lists its added tokens as `theirs` does."""
    ours = AutoTokenizer.from_pretrained(directory)
    for text in TEXTS:
        ids = theirs(text)["input_ids"]
        assert ours(text)["input_ids"] == ids, text
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip), text
    for chat in CHATS:
        assert ours.apply_chat_template(chat, add_generation_prompt=True) == theirs.apply_chat_template(
            chat, add_generation_prompt=True)  # fmt: skip
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id) == (theirs.bos_token_id, theirs.eos_token_id,
                                                                         theirs.pad_token_id)  # fmt: skip
    assert ours.all_special_ids == theirs.all_special_ids and len(ours) == len(theirs)
    # listed in tokenizer_config.json, where a load reads them without parsing the whole tokenizer.json
    listed = json.loads((Path(directory) / "tokenizer_config.json").read_text())["added_tokens_decoder"]
    added = {index: token.__getstate__() for index, token in theirs.added_tokens_decoder.items()}
    assert {int(index): token for index, token in listed.items()} == added


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "qwen3", "gemma3", "gemma2"])
def test_config_and_weights_are_transformers_reading_of_the_file(architecture, tmp_path):
    """The config read from the header has transformers' shapes, token ids and RoPE, and every weight of
    `dequantized_model` is bitwise what transformers' GGUF loader makes of the file (both dequantize with gguf-py;
    llama's q/k rows restored from llama.cpp's interleaving), on files with every block type."""
    from transformers import AutoModelForCausalLM

    from specchat.quant.gguf_model import dequantized_model

    path = write_tiny_model(tmp_path / "t.gguf", None, architecture=architecture, tied=True)
    theirs = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    config = gguf_config(path)
    assert {name: getattr(config, name) for name in SHAPES} == {name: getattr(theirs.config, name) for name in SHAPES}
    assert config.head_dim == getattr(theirs.config, "head_dim", config.hidden_size // config.num_attention_heads)
    config.save_pretrained(tmp_path / "converted")
    ours = dequantized_model(path, str(tmp_path / "converted")).state_dict()
    theirs = theirs.state_dict()
    assert ours.keys() == theirs.keys()
    for name, weight in ours.items():
        assert torch.equal(weight, theirs[name]), name
    assert ours["lm_head.weight"].data_ptr() == ours["model.embed_tokens.weight"].data_ptr()


def test_a_cache_that_cannot_be_written_is_named_not_the_file(tmp_path, monkeypatch):
    """The conversion is written under SPECCHAT_CACHE: where that cannot be written (here a path through a file, which
    no user can make a directory of), the one line says so and where, not that the GGUF file could not be read."""
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path / "a-file" / "cache"))
    with pytest.raises(SpecchatError) as refused:
        gguf_checkpoint(embedded_gguf_path())
    message = str(refused.value)
    assert message.startswith(f"could not keep {embedded_gguf_path().name}'s tokenizer and config in "
                              f"{tmp_path / 'a-file' / 'cache'} (set SPECCHAT_CACHE to a writable directory): ")
    assert "could not read" not in message
