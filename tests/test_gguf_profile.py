"""A GGUF file named by path finds the profile of the model it holds: another quantization of a profile's target
takes that profile's drafters and decoding defaults. Found from the header's `general.*` fields alone, and the
file named is still the one that runs."""

from __future__ import annotations

import pytest
from gguf_files import llama3_frequency_factors, write_tiny_model

from specchat.cli.common import default_drafter
from specchat.gguf_header import general_fields
from specchat.loading import embedded_gguf_path, is_available, load_model, resolve_model
from specchat.profiles import gguf_profile, load_profiles

CODER = "qwen2.5-coder-1.5b"


@pytest.mark.parametrize(
    "fields, profile",
    [
        ({"general.name": "Qwen2.5 Coder 1.5B Instruct GGUF"}, CODER),  # the official file's
        ({"general.name": "Qwen2.5 Coder 1.5B Instruct"}, CODER),  # as others name their quantizations
        ({"general.basename": "Qwen2.5-Coder", "general.size_label": "1.5B", "general.finetune": "Instruct"}, CODER),
        ({"general.name": "Qwen2.5 Coder 0.5B Instruct"}, None),
        ({"general.name": "Qwen2.5 Coder 1.5B"}, None),  # the base model, not the instruct one
        ({"general.name": "Llama 3.1 8B Instruct"}, "llama3.1-8b"),
        ({"general.name": "Meta Llama 3.1 8B Instruct"}, "llama3.1-8b"),  # converted from Meta-Llama-3.1-8B-Instruct
        ({"general.basename": "Meta-Llama-3.1", "general.size_label": "8B", "general.finetune": "Instruct"},
         "llama3.1-8b"),
        ({"general.name": "Llama 3 8B Instruct"}, None),
        ({"general.name": "Meta Llama 3 8B Instruct"}, None),
        ({}, None),
    ],
)
def test_a_file_finds_the_profile_of_the_model_it_holds(fields, profile):
    found = gguf_profile(fields, load_profiles())
    assert (found.name if found else None) == profile


@pytest.fixture(scope="module")
def named_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "coder-q8_0.gguf"
    write_tiny_model(path, embedded_gguf_path(), name="Qwen2.5 Coder 1.5B Instruct")
    return path


def test_the_header_is_read_up_to_its_general_fields(named_gguf, tmp_path):
    assert general_fields(named_gguf) == {"general.architecture": "qwen2",
                                          "general.name": "Qwen2.5 Coder 1.5B Instruct"}
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(named_gguf.read_bytes()[:40])  # a header cut short: no fields, no profile, no error
    assert general_fields(cut) == {} and resolve_model(str(cut)).profile is None


def test_a_file_of_a_profiles_model_runs_itself_with_the_profile(named_gguf):
    assert default_drafter(str(named_gguf)) == load_profiles()[CODER].drafter != "ngram"  # read before torch loads
    assert default_drafter("./nope.gguf") == "ngram"  # the load says what is missing
    source = resolve_model(str(named_gguf))
    assert source.profile.name == CODER and source.gguf_path() == named_gguf and is_available(source)
    loaded = load_model(str(named_gguf))  # the file named (a tiny model), not the profile's 1.1 GB one
    assert loaded.model.config.hidden_size == 256 and loaded.source.profile.name == CODER


def test_the_mission_profile_runs_its_gguf_on_a_cpu_found_in_the_hub_cache(tmp_path, monkeypatch):
    """`--model llama3.1-8b` on a CPU is the profile's Q4_K_M file (a tiny stand-in here, under the name and in the
    place `hf download` puts it, offline); on a GPU the profile names its target's own weights."""
    import torch
    from huggingface_hub import constants

    profile = load_profiles()["llama3.1-8b"]
    repo, _, name = profile.gguf.rpartition("/")
    snapshot = tmp_path / f"models--{repo.replace('/', '--')}" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("0123abcd")
    write_tiny_model(snapshot / name, embedded_gguf_path(), architecture="llama", name="Llama 3.1 8B Instruct",
                     frequency_factors=llama3_frequency_factors(8.0))  # as the real file stores its RoPE scaling
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    source = resolve_model("llama3.1-8b")
    assert source.gguf_path(download=False) == snapshot / name and is_available(source, torch.device("cpu"))
    assert source.runs_gguf(torch.device("cpu")) and not source.runs_gguf(torch.device("cuda"))
    assert not is_available(source, torch.device("cuda"))  # a GPU runs the target's own weights: not cached here
    loaded = load_model("llama3.1-8b", device="cpu")
    assert loaded.model.config.model_type == "llama" and loaded.model.config.hidden_size == 256
    assert loaded.model.config.rope_parameters["rope_type"] == "llama3"
    assert loaded.source.profile.name == "llama3.1-8b"
