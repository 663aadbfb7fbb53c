"""Building and driving the chat app in tests: a model loader, waiting for answers, sending lines."""

from __future__ import annotations

import time

from conftest import tiny_model

from specchat.engine.sampling import SamplingConfig
from specchat.loading import LoadedModel, ModelSource
from specchat.tui.app import ChatApp
from specchat.tui.chat_input import ChatInput
from specchat.tui.conversation import Note
from specchat.tui.session import ChatSettings


def tiny_loaded(tokenizer, seed: int = 0) -> LoadedModel:
    """A 2-layer random Llama with the default model's tokenizer (and so its chat template)."""
    return LoadedModel(tiny_model("llama", seed=seed), tokenizer, ModelSource("tiny-llama", "tiny-llama"), 0.0)


def make_app(loaded: LoadedModel, sampling: SamplingConfig | None = None, prompt_cache=None, **settings) -> ChatApp:
    def loader(progress):
        progress("loading a test model")
        return loaded, sampling or SamplingConfig()

    return ChatApp(loader, ChatSettings(**settings), prompt_cache)


async def wait_until(pilot, condition, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.02)


async def ready(pilot) -> None:
    await wait_until(pilot, lambda: pilot.app.session is not None, what="the model to load")
    await pilot.pause()


async def send(pilot, line: str) -> None:
    """Put `line` in the input and submit it as Enter does (typing key by key is tested once, separately), then
    let the app handle it. Not `pilot.press`: it waits for the CPU to go idle, which it never is while an answer
    streams (3 s a line)."""
    chat_input = pilot.app.query_one(ChatInput)
    chat_input.value = line
    await chat_input.action_submit()
    await pilot.pause(0.05)


async def ask(pilot, line: str, timeout: float = 120.0):
    """Send a message and wait for the whole answer; returns the answer's Message."""
    await send(pilot, line)
    await wait_until(pilot, lambda: not pilot.app.generating, timeout, "the answer")
    await pilot.pause()
    return pilot.app.session.messages[-1]


def note_lines(app, *, errors: bool = False) -> list[str]:
    """The text of the app's notes (only the error notes with `errors`)."""
    return [str(note.content) for note in app.query(Note) if note.has_class("error") or not errors]
