"""SVG snapshots of the chat app: the main screen at 80x24 and wider, the overlay, the help screen.

The conversation is a saved chat (tests/data/chat.json, answers of the real default model with their
per-token origins) and the overlay shows fixed figures, so every pixel is deterministic. Update after a
deliberate change with `pytest tests/test_tui_snapshots.py --snapshot-update` and look at the report.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tui_harness import make_app, ready, send, tiny_loaded

from specchat.tui.chat_input import ChatInput
from specchat.tui.figures import Figures
from specchat.tui.overlay import AcceptanceOverlay

CHAT = Path(__file__).parent / "data" / "chat.json"
FIGURES = Figures(
    tokens=19, tau=4.5, acceptance_rate=0.938, tokens_per_second=35.5, ar_tokens_per_second=9.67, ar_context=87,
    per_depth=(1.0, 1.0, 0.75, 0.75, 0.5), recent_tau=(1, 2, 2, 1, 4, 5, 5, 6, 5, 1),
    context_used=106, context_max=8128, drafter="ngram", budget=8, adaptive=True, mean_budget=6.2,
    memory_bytes=1_400 * 2**20, memory_kind="RSS", prompt_tokens=87, reused_tokens=67, prefill_seconds=0.137,
)  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tokenizer):
    return tiny_loaded(tokenizer)


@pytest.fixture
def chat_app(tiny):
    return make_app(tiny, drafter="ngram")


async def _loaded_chat(pilot) -> None:
    await ready(pilot)
    pilot.app.query_one(ChatInput).cursor_blink = False
    await send(pilot, f"/load {os.path.relpath(CHAT)}")  # the path is shown: relative to the repository
    pilot.app.query_one(AcceptanceOverlay).figures = FIGURES
    await pilot.pause()


def test_main_screen_80x24(snap_compare, chat_app):
    assert snap_compare(chat_app, terminal_size=(80, 24), run_before=_loaded_chat)


def test_main_screen_with_overlay_wide(snap_compare, chat_app):
    assert snap_compare(chat_app, terminal_size=(120, 36), run_before=_loaded_chat)


def test_plain_markdown_view_without_overlay(snap_compare, chat_app):
    async def run_before(pilot):
        await _loaded_chat(pilot)
        await pilot.press("f2", "ctrl+t")

    assert snap_compare(chat_app, terminal_size=(80, 24), run_before=run_before)


def test_help_screen(snap_compare, chat_app):
    async def run_before(pilot):
        await _loaded_chat(pilot)
        await pilot.press("f1")

    assert snap_compare(chat_app, terminal_size=(100, 36), run_before=run_before)


def test_the_overlay_and_stats_show_the_same_budget():
    """One number for the adaptive budget: this answer's mean, in the overlay as in /stats (the overlay said
    "budget 0 auto" while /stats said 0.7)."""
    from dataclasses import replace

    from specchat.tui.overlay import resources_text

    idle = replace(FIGURES, budget=0, mean_budget=0.7)
    assert "budget   auto, mean 0.7" in str(resources_text(idle)) and "budget auto, mean 0.7" in idle.describe()
    fixed = replace(FIGURES, adaptive=False)
    assert "budget   8\n" in str(resources_text(fixed)) and "budget 8 " in fixed.describe() + " "


def test_help_keeps_a_gap_between_each_command_or_key_and_its_meaning():
    from specchat.tui.commands import COMMANDS
    from specchat.tui.help_screen import KEYS, help_text

    lines = str(help_text()).splitlines()
    for name in [spec.usage for spec in COMMANDS] + list(KEYS):
        line = next(line for line in lines if line.startswith(name))
        assert line[len(name) : len(name) + 2] == "  " and line[len(name) + 2 :].strip(), line
