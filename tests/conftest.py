"""Shared fixtures: tiny random models of each family and the real default model (loaded once)."""

from __future__ import annotations

import inspect
import os
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# the tests' conversions and measurements of their own temporary models stay out of the user's cache
os.environ.setdefault("SPECCHAT_CACHE", str(Path(__file__).resolve().parent.parent / ".test-cache"))
if not torch.cuda.is_available():  # Triton kernels then run in the interpreter; set before triton.jit runs
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1":
    try:
        from triton_interpreter import patch_interpreter
    except ImportError:  # no triton: its tests skip
        pass
    else:
        patch_interpreter()

if "PYTEST_XDIST_WORKER_COUNT" in os.environ:  # `make test` runs workers side by side: share the cores out
    _threads = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ["OMP_NUM_THREADS"] = str(_threads)  # the commands the tests start inherit it
    torch.set_num_threads(_threads)

TINY_FAMILIES = ("llama", "qwen2", "qwen3", "mistral")


def _cpu_flags() -> set[str]:
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    return next((set(line.split(":", 1)[1].split()) for line in lines if line.startswith("flags")), set())


# The CPU decoder builds this machine runs (SPECCHAT_CPU_ISA): its own, and on an x86 CPU with more than AVX2 the
# AVX2 build as well (marked other_isas: `make test-isas` compiles and tests it), so every kernel path the machine can
# run is tested on it. Its own build runs the GGUF kernels' AVX2 path too (test_gguf_kernels.py).
CPU_ISAS = ["native"]
if {"avx2", "fma", "f16c"} <= _cpu_flags() and _cpu_flags() & {"avx512f", "avx_vnni"}:
    CPU_ISAS.append(pytest.param("avx2", marks=pytest.mark.other_isas))


@pytest.fixture(params=CPU_ISAS)
def cpu_isa(request, monkeypatch) -> str:
    """Each CPU decoder build this machine runs in turn, selected for the test's whole run."""
    monkeypatch.setenv("SPECCHAT_CPU_ISA", request.param)
    return request.param


def pytest_sessionstart(session):
    """The tests write new GGUF files each run and convert each (`gguf_checkpoint`) into SPECCHAT_CACHE, where a later
    file with the same tokenizer reads an earlier one's: those whose files an earlier run removed are pruned here as
    `specchat cache prune` prunes them, by the controller (xdist's, or the one process)."""
    if hasattr(session.config, "workerinput"):
        return
    from specchat.cache_entries import KINDS, cache_entries, remove

    for entry in cache_entries():
        if entry.kind == KINDS["gguf-"] and entry.stale is not None:
            remove(entry)


EXIT_STATUS = pytest.StashKey[int]()


def pytest_sessionfinish(session, exitstatus):
    session.config.stash[EXIT_STATUS] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Leave without the interpreter's finalization, once every report is out: triton (which transformers
    imports, and the kernel tests run in its interpreter) prints ~30 lines of nanobind "leaks" there."""
    if EXIT_STATUS in config.stash:
        config.get_terminal_writer().flush()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(config.stash[EXIT_STATUS])


def tiny_model(family: str, *, vocab_size: int = 49152, seed: int = 0, head_dim: int | None = None, kv_heads: int = 2,
               heads: int = 4):  # fmt: skip
    """A 2-layer random model of `family` (`heads` query heads, `kv_heads` KV heads, head_dim 16 unless given, hidden
    size 16 a head; smollm3's second layer without RoPE), fp32, eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        family,
        vocab_size=vocab_size,
        hidden_size=16 * heads,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=2048,
        initializer_range=0.3,  # peaked logits: greedy ties are then practically impossible
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        **({} if head_dim is None else {"head_dim": head_dim}),
        **({"no_rope_layers": [1, 0]} if family == "smollm3" else {}),
    )
    torch.manual_seed(seed)
    eager = family == "gemma2"  # soft-capped scores: transformers' eager attention only
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                             attn_implementation="eager" if eager else "sdpa")  # fmt: skip
    return model.eval().requires_grad_(False)


def transformers_forward(model, cache, **inputs):
    """transformers' own forward over `inputs`, its keys and values kept in `cache` (a `DynamicCache`), passed by the
    name the installed transformers takes (`cache` from 5.24; `past_key_values`, which 5.40 drops, before)."""
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    return model(**inputs, **{name: cache}, use_cache=True)


def fresh_kv(model, ids: list[int]):
    """Per-layer (keys, values) of transformers' one forward over `ids`."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        transformers_forward(model, cache, input_ids=torch.tensor([ids]))
    return [(layer.keys, layer.values) for layer in cache.layers]


@pytest.fixture(scope="session")
def default_model():
    """The embedded SmolLM2-135M-Instruct in fp32 on CPU."""
    from specchat.loading import load_model

    return load_model(None, dtype="float32", device="cpu")


@pytest.fixture(scope="session")
def tokenizer(default_model):
    return default_model.tokenizer


@pytest.fixture(scope="session")
def hf_tokenizer():
    """transformers' tokenizer of the embedded model, for tests that add tokens to one or save it (specchat's own
    does neither) and for comparing with it."""
    from transformers import AutoTokenizer

    from specchat.loading import embedded_checkpoint

    return AutoTokenizer.from_pretrained(embedded_checkpoint(dense=False))
