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
from specchat.ollama_models import manifest_path, ollama_gguf, ollama_models, ollama_stop, ollama_system
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
    pull(ollama, "smol:135m", embedded_gguf_path(), params={"temperature": 0.7, "top_k": 20, "stop": ["."]},
         system="Be brief.")  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OLLAMA_MODELS": str(ollama)}
    by_name = run_specchat(["run", "Name a colour.", "--model", "smol:135m", "-n", "8", "--seed", "3", "--json"],
                           env=env)  # fmt: skip
    by_path = run_specchat(["run", "Name a colour.", "--model", str(embedded_gguf_path()), "-n", "8", "--seed", "3",
                            "--temperature", "0.7", "--top-k", "20", "--top-p", "0.9", "--repetition-penalty", "1.1",
                            "--system", "Be brief.", "--stop", ".", "--json"], env=env)  # fmt: skip
    assert by_name.returncode == 0, by_name.stderr
    assert json.loads(by_name.stdout)["model"] == "smol:135m"
    assert json.loads(by_name.stdout)["token_ids"] == json.loads(by_path.stdout)["token_ids"]
    listed = run_specchat(["models"], env=env)
    assert "smol:135m" in listed.stdout and str(ollama) in listed.stdout
    assert_one_line_error(run_specchat(["run", "hi", "--model", "smol:7b"], env=env), "unknown model 'smol:7b'")


def test_a_pulled_models_stop_strings_end_its_answers_where_a_request_names_none(ollama, tokenizer):
    """`PARAMETER stop` lines: read as ollama keeps them, a one-line error where they are not strings; a chat answer
    and a served completion end before one (a request's own stop strings replace them), as under ollama."""
    from starlette.testclient import TestClient
    from tui_harness import tiny_loaded

    from specchat.engine.generate import Engine
    from specchat.engine.prompt import encode_chat
    from specchat.engine.sampling_config import SamplingConfig
    from specchat.server.app import Served, create_app
    from specchat.server.worker import EngineWorker
    from specchat.tui.session import ChatSession, ChatSettings

    pull(ollama, "stops", embedded_gguf_path(), params={"stop": ["<|im_end|>", "User:"]})
    pull(ollama, "one", embedded_gguf_path(), params={"stop": "User:"})
    pull(ollama, "odd", embedded_gguf_path(), params={"stop": [3]})
    assert ollama_stop("stops") == ("<|im_end|>", "User:") and ollama_stop("one") == ("User:",)
    assert ollama_stop("plain:1b") == ()  # none pulled by that name
    with pytest.raises(SpecchatError, match="'odd' give a stop that is not a list of strings"):
        ollama_stop("odd")

    loaded = tiny_loaded(tokenizer)
    ids = encode_chat(tokenizer, [{"role": "user", "content": "Hi"}])

    def chat(stop: tuple[str, ...]) -> str:
        session = ChatSession(loaded, SamplingConfig(), ChatSettings(drafter="none", stop=stop))
        return "".join(piece for update in session.run(ids, max_new_tokens=16, keep=False) for piece in update.pieces)

    whole = chat(())
    stop = whole[6:9]
    assert stop.strip() and chat((stop,)) == whole[: whole.index(stop)]

    engine = Engine(loaded.model, loaded.tokenizer, max_len=256)
    served = Served(engine, tokenizer, "tiny", frozenset(), "none", {}, stop=(stop,))
    worker = EngineWorker(lambda: served, max_queue=4)
    worker.start()
    worker.ready.wait()
    try:
        http = TestClient(create_app(worker, api_key=None, max_body_bytes=1 << 20))
        body = {"model": "tiny", "prompt": ids, "max_tokens": 16, "temperature": 0}
        texts = [http.post("/v1/completions", json=body | extra).json()["choices"][0]["text"]
                 for extra in ({}, {"stop": ["never said"]})]  # fmt: skip
    finally:
        worker.stop()
        worker.join(10)
    assert texts == [whole[: whole.index(stop)], whole]
