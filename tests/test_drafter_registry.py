"""One registry names the drafters: the CLI, the chat's /drafter, bench and models all read it."""

from __future__ import annotations

from pathlib import Path

import pytest
from tui_harness import tiny_loaded

from specchat.cli.common import default_drafter
from specchat.drafters import (
    KINDS,
    NAMES,
    OPTION_FLAGS,
    DrafterChoice,
    check_option,
    parse_drafter,
    resolve_drafter,
    usable_drafters,
)
from specchat.engine.sampling import SamplingConfig
from specchat.errors import SpecchatError
from specchat.profiles import load_profiles
from specchat.tui.commands import parse_command
from specchat.tui.session import ChatSession, ChatSettings
from specchat.writer.start import writer_drafter


def test_names_and_checkpoints_parse_in_one_place():
    assert NAMES == ("none", "ngram", "longspec", "glide", "tokenswift", "model", "eagle3")
    assert parse_drafter("ngram") == DrafterChoice("ngram")
    assert parse_drafter("longspec:~/draft") == DrafterChoice("longspec", Path("~/draft").expanduser())
    with pytest.raises(SpecchatError, match="unknown drafter 'eagle'; available: none, ngram, longspec, glide, "
                                            "tokenswift, model, eagle3"):
        parse_drafter("eagle")
    assert parse_drafter("ngram:x") == DrafterChoice("ngram", Path("x"))  # a table of answers (answer_store.py)
    with pytest.raises(SpecchatError, match="takes no checkpoint"):
        parse_drafter("none:x")
    # the chat's command reads the same registry
    assert parse_command("/drafter glide:./d").value == "glide:./d"
    with pytest.raises(SpecchatError, match="unknown drafter 'eagle'"):
        parse_command("/drafter eagle")


def test_profiles_say_which_drafters_a_model_has():
    profiles = load_profiles()
    assert usable_drafters(profiles["smollm2-135m"]) == ["none", "ngram", "longspec", "tokenswift", "model"]
    assert usable_drafters(profiles["vicuna-7b-16k"]) == ["none", "ngram", "longspec", "model"]
    assert profiles["longchat-7b-32k"].drafters["model"] == "JackFram/llama-68m"  # SpecExtend's published pairs
    assert resolve_drafter(DrafterChoice("longspec"), profiles["vicuna-7b-16k"], "vicuna-7b-16k").repo == (
        "sail/longspec-vicuna-7b-v1.5-16k"
    )
    with pytest.raises(SpecchatError, match=r"no published glide drafter \(it has: none, ngram, longspec, model\)"):
        resolve_drafter(DrafterChoice("glide"), profiles["vicuna-7b-16k"], "vicuna-7b-16k")
    assert all(kind.build or name == "none" for name, kind in KINDS.items())


def test_the_registry_names_each_kinds_build_and_fetch_and_its_options_match_builds_signature():
    """The options a kind lists are exactly the keyword arguments its `build` takes (none silently dropped, none
    that a flag cannot reach), and every named function exists."""
    import inspect

    from specchat.drafters import function

    for name, kind in KINDS.items():
        if not kind.build:
            continue
        parameters = inspect.signature(function(kind.build)).parameters
        assert list(parameters)[:2] == ["target", "checkpoint"], name
        keywords = {p for p, spec in parameters.items() if spec.kind is inspect.Parameter.KEYWORD_ONLY}
        assert keywords == set(kind.options), name
        assert set(kind.options) <= set(OPTION_FLAGS), name
        if kind.fetch:
            assert list(inspect.signature(function(kind.fetch)).parameters) == ["repo"], name


def test_a_profile_names_the_drafters_measured_fastest_on_its_model():
    profiles = load_profiles()
    for name, profile in profiles.items():  # each default is a drafter the model has
        for default in filter(None, (profile.drafter, profile.writer)):
            for part in default.split("+"):
                assert part in usable_drafters(profile), (name, default)
    assert (default_drafter(None), default_drafter("smollm2-135m")) == ("ngram", profiles["smollm2-135m"].drafter)
    assert default_drafter("someone/some-model") == "ngram"  # no profile: n-gram, which every model has
    assert writer_drafter(profiles["smollm2-135m"]) == "none"  # every drafter measured slower on its books
    assert writer_drafter(profiles["llama3.1-8b"]) == "tokenswift"  # not measured here: the published heads
    assert writer_drafter(None) == "ngram"


def test_every_alias_names_its_target():
    """Each part of an alias (family, size, context) is in the target's repo id: longchat-7b-16k named a 32K model."""
    for name, profile in load_profiles().items():
        target = "".join(c for c in profile.target.lower() if c.isalnum())
        assert all(part.replace(".", "") in target for part in name.split("-")), (name, profile.target)


def test_llama31_runs_the_longspec_draft_published_for_llama3_262k(tmp_path):
    """`specchat chat --model llama3.1-8b --drafter longspec` resolves to LongSpec's Llama-3-8B-262k draft (same
    tokenizer and shapes), found offline in a Hugging Face cache made here; `models` says what it was trained on."""
    import os
    import subprocess
    import sys

    repo = "sail/longspec-Llama-3-8B-Instruct-262k"
    cached = tmp_path / "hub" / f"models--{repo.replace('/', '--')}"
    snapshot = cached / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (cached / "refs").mkdir()
    (cached / "refs" / "main").write_text("0" * 40)
    for name in ("config.json", "model.safetensors"):
        (snapshot / name).write_text("{}")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")}
    code = (
        "from specchat.drafters import fetch_published, parse_drafter, resolve_drafter\n"
        "from specchat.profiles import load_profiles\n"
        "choice = resolve_drafter(parse_drafter('longspec'), load_profiles()['llama3.1-8b'], 'llama3.1-8b')\n"
        "print(choice.repo, fetch_published(choice.repo))"
    )
    resolved = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert resolved.stdout.split() == [repo, str(snapshot)], resolved.stderr
    listing = subprocess.run([sys.executable, "-m", "specchat", "models"], capture_output=True, text=True, env=env,
                             timeout=60)  # fmt: skip
    assert f"longspec: {repo} (here; trained on Llama-3-8B-Instruct-262k" in listing.stdout, listing.stdout


def test_changing_the_drafter_in_a_chat_keeps_its_cache(tokenizer):
    session = ChatSession(tiny_loaded(tokenizer), SamplingConfig(), ChatSettings(drafter="ngram", max_new_tokens=12))
    _, _, ids, _ = session.begin_turn("Hello there")
    with session.lock:
        list(session.run(ids))
    engine = session.engine
    session.choose_drafter("none")
    _, _, ids, _ = session.begin_turn("And again")
    with session.lock:
        updates = list(session.run(ids))
    assert session.engine is engine and engine.drafter is None
    assert updates[-1].event.stats.reused_tokens > len(ids) // 2  # the first turn was not prefilled again
    with pytest.raises(SpecchatError, match="no published glide drafter"):
        session.choose_drafter("glide")
    assert session.settings.drafter == "none"


def test_build_options_are_for_the_kinds_that_take_them():
    check_option(parse_drafter("tokenswift"), "kv_budget")
    check_option(parse_drafter("longspec+ngram"), "cache")  # a part reads a draft cache
    with pytest.raises(SpecchatError, match=r"^--draft-kv-budget is for the tokenswift drafter, not ngram\+model$"):
        check_option(parse_drafter("ngram+model"), "kv_budget")
    with pytest.raises(SpecchatError, match=r"^--draft-cache is for the longspec and model drafters, not glide$"):
        check_option(parse_drafter("glide"), "cache")


def test_a_chat_keeps_its_draft_cache_for_the_drafters_that_read_one(tokenizer, tmp_path):
    """`chat --draft-cache`: checked by name (a saved chat may hold it while its drafter is n-gram), applied to
    the model or LongSpec part of whatever drafter the chat runs, ignored by the others."""
    from test_longspec import random_layer

    from specchat.drafters.longspec.model import save_longspec
    from specchat.tui.session import check_settings

    with pytest.raises(SpecchatError, match="the draft cache must be one of full, streaming, retrieval"):
        check_settings(ChatSettings(draft_cache="lru"))
    loaded = tiny_loaded(tokenizer)
    save_longspec(tmp_path / "draft", random_layer(loaded.model))
    session = ChatSession(loaded, SamplingConfig(), ChatSettings(drafter="ngram", draft_cache="streaming"))
    session.use_drafter()  # n-gram reads no cache
    session.update_settings(drafter=f"longspec:{tmp_path / 'draft'}+ngram")
    session.use_drafter()
    assert session.engine.drafter.first.policy.name == "streaming"
