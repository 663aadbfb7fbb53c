"""`specchat bench attention` and `bench verify-cost` on CPU with tiny shapes: every row is there, every time is
positive, every attention method computes the same thing, and bad input is a one-line error."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch
from test_cli import assert_one_line_error, specchat

from specchat.bench.attention import attention_bench, peak_bandwidth
from specchat.bench.synthetic import random_tree
from specchat.bench.verify_cost import llama31_8b_config, verify_cost
from specchat.cli import command_status
from specchat.engine.tree import ROOT
from specchat.errors import SpecchatError

TINY_ATTENTION = {"tree": 8, "heads": 4, "kv_heads": 2, "head_dim": 16, "dtype": "float32", "device": "cpu"}
CPU_METHODS = ["hybrid-torch", "sdpa-mask", "eager", "flex", "prefix-torch"]


def tiny_llama_config():
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=256, hidden_size=256, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512,
    )  # fmt: skip  (heads of 64: the CPU decoder runs it too)


def test_random_tree_has_the_asked_size_and_valid_parents():
    tree = random_tree(64, seed=3, vocab=5)  # a small vocab forces redraws of repeated siblings
    assert len(tree) == 64
    assert all(ROOT <= parent < i for i, parent in enumerate(tree.parents))
    siblings = [(parent, token) for parent, token in zip(tree.parents, tree.tokens)]
    assert len(set(siblings)) == 64
    assert random_tree(64, seed=3, vocab=5) == tree


def test_attention_rows_on_cpu():
    rows = attention_bench(contexts=[40, 300], repeats=2, **TINY_ATTENTION)
    copy = rows[0]
    assert copy.method == "copy" and copy.context is None and copy.gb_s > 0 and copy.of_copy == 1.0
    assert "cpu" in copy.note and copy.of_peak is None  # no spec-sheet peak for a CPU
    assert [(row.context, row.method) for row in rows[1:]] == [(c, m) for c in (40, 300) for m in CPU_METHODS]
    for row in rows[1:]:
        assert row.us > 0, row
        if row.method.startswith("prefix"):
            assert row.gb_s > 0 and row.of_copy > 0 and row.vs_sdpa is None
        else:
            assert row.vs_sdpa > 0 and row.gb_s is None
        if row.method not in ("sdpa-mask", "prefix-torch"):  # same attention as SDPA with the dense mask
            error = float(re.search(r"max abs diff vs sdpa (\S+)", row.note).group(1))
            assert error < 1e-5, row


def test_prefix_bandwidth_counts_the_kv_bytes_read():
    rows = attention_bench(contexts=[1000], repeats=1, **TINY_ATTENTION)
    prefix = rows[-1]
    kv_bytes = 2 * 2 * 1000 * 16 * 4  # K and V, 2 KV heads, 1000 keys, head_dim 16, fp32
    assert prefix.gb_s == pytest.approx(kv_bytes / (prefix.us * 1e-6) / 1e9, rel=1e-3)
    # of_copy, gb_s and the copy's rate are each rounded to 4 significant digits: up to 5e-4 off apiece.
    assert prefix.of_copy == pytest.approx(prefix.gb_s / rows[0].gb_s, rel=2e-3)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"heads": 6, "kv_heads": 4}, "multiple of --kv-heads"),
        ({"dtype": "float8"}, "invalid dtype 'float8'"),
        ({"contexts": [0]}, "--context must be at least 1"),
        ({"contexts": []}, "--context needs"),
        ({"tree": 0}, "--tree must be between 1 and 256"),
        ({"tree": 1000}, "--tree must be between 1 and 256"),
        ({"head_dim": 0}, "--head-dim"),
        ({"repeats": 0}, "--repeats"),
        ({"device": "tpu"}, "device"),
    ],
)
def test_attention_bad_input(options, message):
    with pytest.raises(SpecchatError, match=re.escape(message)):
        attention_bench(**{"contexts": [16], **TINY_ATTENTION, **options})


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 3.35e12),
        ("NVIDIA H100 PCIe", 2.0e12),
        ("NVIDIA H200", 4.8e12),
        ("NVIDIA GH200 480GB", 4.0e12),
        ("NVIDIA A100-SXM4-80GB", 2.039e12),
        ("NVIDIA A100-SXM4-40GB", 1.555e12),
        ("NVIDIA A100-PCIE-40GB", 1.555e12),
        ("NVIDIA L40S", 0.864e12),
        ("NVIDIA L4", 0.3e12),
        ("Some Future GPU", None),
    ],
)
def test_peak_bandwidth_by_device_name(monkeypatch, name, peak):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert peak_bandwidth(torch.device("cuda")) == peak
    assert peak_bandwidth(torch.device("cpu")) is None


@pytest.mark.parametrize(("attention", "forward"), [("hybrid", "torch decoder"), ("canonical", "CPU decoder")])
def test_verify_cost_rows_with_a_tiny_config(attention, forward):
    config = tiny_llama_config()
    rows = verify_cost(
        contexts=[300, 20], tree=16, dtype="float32", device="cpu", attention=attention, repeats=1, config=config
    )
    assert [row.context for row in rows] == [300, 20]  # any order: the cache is truncated or refilled
    for row in rows:
        assert (row.tree, row.layers) == (16, 2) and row.forward.startswith(forward)
        assert row.decode_ms > 0 and row.verify_ms > 0
        assert row.verify_over_decode == pytest.approx(row.verify_ms / row.decode_ms, rel=0.02)
    assert config.num_hidden_layers == 2  # the caller's config is left alone


def test_verify_cost_with_fewer_layers():
    config = tiny_llama_config()
    (row,) = verify_cost(contexts=[8], tree=2, layers=1, dtype="float32", device="cpu", repeats=1, config=config)
    assert row.layers == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"layers": 3}, "--layers must be between 1 and 2"),
        ({"contexts": [500]}, "at most 447"),  # 512 positions - 64 tree nodes - the root
        ({"attention": "flex"}, "unknown attention 'flex'"),
        ({"dtype": "int8"}, "invalid dtype"),
        ({"tree": 0}, "--tree"),
    ],
)
def test_verify_cost_bad_input(options, message):
    with pytest.raises(SpecchatError, match=re.escape(message)):
        verify_cost(**{"contexts": [16], "device": "cpu", "config": tiny_llama_config(), **options})


def test_llama31_8b_shapes():
    config = llama31_8b_config()
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (4096, 14336, 32)
    assert (config.num_attention_heads, config.num_key_value_heads, config.vocab_size) == (32, 8, 128256)
    assert config.max_position_embeddings == 131072 and config.rope_parameters["rope_theta"] == 500000.0


def test_cli_attention_json():
    result = specchat(
        "bench", "attention", "--context", "16,64", "--tree", "4", "--heads", "4", "--kv-heads", "2",
        "--head-dim", "16", "--dtype", "float32", "--device", "cpu", "--repeats", "1", "--json", warm=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [(row["context"], row["method"]) for row in rows] == [(None, "copy")] + [
        (c, m) for c in (16, 64) for m in CPU_METHODS
    ]
    assert all(row["us"] > 0 for row in rows)


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("attention", "--context", "4096,lots"), ("--context takes comma-separated integers",)),
        (("attention", "--context", "0"), ("--context must be at least 1",)),
        (("attention", "--heads", "32", "--kv-heads", "5"), ("multiple of --kv-heads",)),
        (("attention", "--dtype", "fp8"), ("invalid dtype", "bfloat16")),
        (("attention", "--device", "tpu"), ("device",)),
        (("attention", "--device", "cuda"), ("no CUDA GPU",)),
        (("verify-cost", "--attention", "flex"), ("unknown attention", "hybrid")),
        (("verify-cost", "--layers", "0"), ("--layers must be between 1 and 32",)),
        (("verify-cost", "--context", "200000"), ("at most 131007",)),
        (("verify-cost", "--context", "x"), ("--context takes comma-separated integers",)),
    ],
)
def test_cli_bad_input_is_one_line(monkeypatch, capsys, args, needles):
    """In process (a subprocess per case costs seconds of imports): what the console script runs, less its exit."""
    monkeypatch.setattr(sys, "argv", ["specchat", "bench", *args])
    status = command_status()
    captured = capsys.readouterr()
    assert_one_line_error(subprocess.CompletedProcess(args, status, captured.out, captured.err), *needles)


@pytest.mark.slow
def test_cli_verify_cost_with_llama_shapes():
    """One layer of Llama-3.1-8B's shapes still means 2 GB of bf16 embeddings and LM head: ~6 s here."""
    result = specchat(
        "bench", "verify-cost", "--layers", "1", "--context", "8", "--tree", "1", "--repeats", "1",
        "--dtype", "bfloat16", "--device", "cpu", "--attention", "hybrid", "--threads", "1", "--json", warm=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)
    assert (row["context"], row["tree"], row["layers"], row["forward"]) == (8, 1, 1, "torch decoder, cpu, 1 thread")
    assert row["decode_ms"] > 0 and row["verify_ms"] > 0
