"""Models ollama has pulled run by the names ollama gives them: a models directory laid out as ollama lays it out
(manifests by host / namespace / model / tag, blobs named by their sha256), written here with the embedded model's
GGUF file as the blob (no ollama runs on this machine)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from cli_fork import run_specchat
from test_cli import assert_one_line_error

from specchat.errors import SpecchatError
from specchat.loading import embedded_gguf_path, resolve_model
from specchat.ollama_models import manifest_path, ollama_gguf, ollama_models, ollama_system
from specchat.profiles import profile_of


def pull(root: Path, name: str, blob: Path | None, *, layer: str = "application/vnd.ollama.image.model",
         params: dict | None = None, system: str | None = None) -> None:  # fmt: skip
    """What `ollama pull NAME` leaves: the manifest, and the model file as a blob (a link to `blob`); None leaves
    the manifest alone, naming a blob that is not there. `params` and `system`: its Modelfile's PARAMETER lines (as
    ollama stores them, JSON) and SYSTEM prompt, each a blob of its own."""
    digest = "sha256:" + (hashlib.sha256(str(blob).encode()).hexdigest() if blob else "0" * 64)
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    if blob is not None:
        link = root / "blobs" / digest.replace(":", "-")
        if not link.exists():  # one blob, however many names hold it
            link.symlink_to(blob)
    manifest = manifest_path(name)
    manifest.parent.mkdir(parents=True, exist_ok=True)
    layers = [{"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "1" * 64},
              {"mediaType": layer, "digest": digest, "size": 1}]  # fmt: skip
    for kind, content in (("params", None if params is None else json.dumps(params)), ("system", system)):
        if content is not None:
            stored = "sha256:" + hashlib.sha256(content.encode()).hexdigest()
            (root / "blobs" / stored.replace(":", "-")).write_text(content)
            layers.append({"mediaType": f"application/vnd.ollama.image.{kind}", "digest": stored})
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))


@pytest.fixture
def ollama(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "models"
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    return root


def test_names_map_to_manifests_as_ollama_keeps_them(ollama):
    manifests = ollama / "manifests"
    assert manifest_path("smollm2") == manifests / "registry.ollama.ai/library/smollm2/latest"
    assert manifest_path("qwen2.5-coder:1.5b") == manifests / "registry.ollama.ai/library/qwen2.5-coder/1.5b"
    assert manifest_path("someone/model:q4") == manifests / "registry.ollama.ai/someone/model/q4"
    assert manifest_path("hf.co/bartowski/X-GGUF:Q4_K_M") == manifests / "hf.co/bartowski/X-GGUF/Q4_K_M"
    for not_a_name in ["", "/abs/path", "./x", "a/../b", "a/b/c/d", "x:a/b"]:
        assert manifest_path(not_a_name) is None, not_a_name


def test_a_pulled_model_runs_from_its_blob_with_the_profile_its_file_has(ollama):
    pull(ollama, "smol:135m", embedded_gguf_path())
    source = resolve_model("smol:135m")
    assert source.gguf and Path(source.location).resolve() == embedded_gguf_path().resolve()
    assert source.name == "smol:135m"
    assert profile_of("smol:135m") == profile_of(str(embedded_gguf_path()))  # the one its file's header names
    assert ollama_gguf("smol") is None  # another tag: not pulled
    assert resolve_model("org/model").location == "org/model"  # not pulled: a Hugging Face repo id, as before


def test_a_broken_pull_is_one_line(ollama):
    pull(ollama, "gone", None)
    with pytest.raises(SpecchatError, match=r"ollama's model file of 'gone' is missing .*`ollama pull gone`"):
        resolve_model("gone")
    pull(ollama, "adapter", embedded_gguf_path(), layer="application/vnd.ollama.image.adapter")
    with pytest.raises(SpecchatError, match="ollama's manifest of 'adapter' .* names no model file"):
        resolve_model("adapter")
    with pytest.raises(SpecchatError, match="or a model ollama has pulled"):
        resolve_model("never-pulled:1b")


def test_a_pulled_models_parameters_and_system_prompt_are_its_defaults(ollama):
    """As under `ollama run`: its Modelfile's parameters over ollama's own defaults, its SYSTEM for every prompt."""
    pull(ollama, "tuned", embedded_gguf_path(), params={"temperature": 0.6, "repeat_last_n": 0, "stop": ["<x>"]},
         system="Answer in French.")  # fmt: skip
    pull(ollama, "plain", embedded_gguf_path())
    assert resolve_model("tuned").decoding == {"temperature": 0.6, "top_k": 40, "top_p": 0.9, "penalty": 1.0,
                                               "penalty_window": 64}  # repeat_last_n 0: no repetition penalty
    assert resolve_model("plain").decoding == {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "penalty": 1.1,
                                               "penalty_window": 64}  # fmt: skip
    assert resolve_model(str(embedded_gguf_path())).decoding is None  # not ollama's: the profile's defaults
    assert (ollama_system("tuned"), ollama_system("plain"), ollama_system("smollm2-135m")) == ("Answer in French.",
                                                                                              None, None)  # fmt: skip


def test_models_lists_what_ollama_holds(ollama):
    for name in ["smol:135m", "someone/smol:q4", "hf.co/org/smol-GGUF:Q4_1"]:
        pull(ollama, name, embedded_gguf_path())
    pull(ollama, "gone:1b", None)
    assert [model.name for model in ollama_models()] == ["hf.co/org/smol-GGUF:Q4_1", "smol:135m", "someone/smol:q4"]
    assert all(model.size == embedded_gguf_path().stat().st_size for model in ollama_models())


@pytest.mark.slow
def test_run_and_models_take_ollamas_names(ollama):
    """By name, a model ollama holds answers as its file does given its parameters and system prompt."""
    pull(ollama, "smol:135m", embedded_gguf_path(), params={"temperature": 0.7, "top_k": 20}, system="Be brief.")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OLLAMA_MODELS": str(ollama)}
    by_name = run_specchat(["run", "Name a colour.", "--model", "smol:135m", "-n", "8", "--seed", "3", "--json"],
                           env=env)  # fmt: skip
    by_path = run_specchat(["run", "Name a colour.", "--model", str(embedded_gguf_path()), "-n", "8", "--seed", "3",
                            "--temperature", "0.7", "--top-k", "20", "--top-p", "0.9", "--repetition-penalty", "1.1",
                            "--system", "Be brief.", "--json"], env=env)  # fmt: skip
    assert by_name.returncode == 0, by_name.stderr
    assert json.loads(by_name.stdout)["model"] == "smol:135m"
    assert json.loads(by_name.stdout)["token_ids"] == json.loads(by_path.stdout)["token_ids"]
    listed = run_specchat(["models"], env=env)
    assert "smol:135m" in listed.stdout and str(ollama) in listed.stdout
    assert_one_line_error(run_specchat(["run", "hi", "--model", "smol:7b"], env=env), "unknown model 'smol:7b'")
