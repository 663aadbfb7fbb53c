"""`specchat models`: the model profiles, whether each is here, and their drafters."""

from __future__ import annotations

import typer

from specchat.cli.common import (
    app,
)


@app.command()
def models() -> None:
    """List model profiles: whether each is on this machine, and the drafters it runs with."""
    from specchat.drafters import KINDS, usable_drafters
    from specchat.hub_download import offline, reachable
    from specchat.loading import is_available, resolve_model
    from specchat.profiles import DEFAULT_PROFILE, load_profiles

    missing = ("not cached (offline)" if offline() else "not cached (no connection)" if not reachable()
               else "downloads on first use")  # fmt: skip
    trained = [name for name, kind in KINDS.items() if kind.trained and not kind.optional]
    typer.echo("--model ALIAS (any Hugging Face repo id or local model directory works too):\n")
    for name, profile in load_profiles().items():
        alias = f"{name} (default)" if name == DEFAULT_PROFILE else name
        here = "here" if is_available(resolve_model(name)) else missing
        typer.echo(f"  {alias:<24} {profile.target}\n      {here}; drafters: {', '.join(usable_drafters(profile))}")
        for kind, repo in profile.drafters.items():
            state = "cannot load yet" if kind not in KINDS else "here" if _cached(repo) else missing
            other = profile.trained_on.get(kind)
            note = f"; trained on {other}, runs exactly here, may be accepted less" if other else ""
            typer.echo(f"      {kind}: {repo} ({state}{note})")
        others = [kind for kind in trained if kind not in profile.drafters]
        if others:
            typer.echo(f"      {', '.join(others)}: none published; --drafter NAME:DIR runs a local checkpoint")
    _ollama_models()


def _ollama_models() -> None:
    """The models ollama has pulled here, which `--model NAME` runs in place."""
    from specchat.ollama_models import models_dir, ollama_models
    from specchat.profiles import profile_of

    pulled = ollama_models()
    if not pulled:
        return
    typer.echo(f"\n--model NAME, a model ollama has pulled ({models_dir()}), run from its file in place:\n")
    for model in pulled:
        profile = profile_of(model.name)
        note = f"; {profile.name}'s drafters" if profile else ""
        typer.echo(f"  {model.name:<24} {model.size / 1e9:.2f} GB{note}")


def _cached(repo: str) -> bool:
    """Whether a profile's checkpoint is here: shipped with specchat, or in the Hugging Face cache."""
    from huggingface_hub import try_to_load_from_cache

    from specchat.drafters import bundled_checkpoint

    if repo.endswith(".gguf"):
        from specchat.loading import find_gguf

        return find_gguf(repo, download=False) is not None
    bundled = bundled_checkpoint(repo)
    if bundled is not None:
        return (bundled / "config.json").is_file()
    return isinstance(try_to_load_from_cache(repo, "config.json"), str)
