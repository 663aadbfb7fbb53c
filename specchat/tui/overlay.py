"""The acceptance overlay: the running figures of the answer being generated (or the last one).

F2 toggles it, F1 explains every number (figures.EXPLANATIONS). Below NARROW columns it sits under the
conversation instead of beside it, hidden until F2 shows it.
"""

from __future__ import annotations

import statistics

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import Sparkline, Static

from specchat.tui.figures import Figures

BAR_WIDTH = 10
NARROW = 80  # terminal columns below which the overlay would squeeze the conversation
MAX_DEPTHS = 8  # depth rows shown; deeper trees are rare and the panel is small


class AcceptanceOverlay(Vertical):
    figures: reactive[Figures | None] = reactive(None, always_update=True)

    def compose(self) -> ComposeResult:
        yield Static(numbers_text(None), id="numbers")
        yield Static("τ per step (recent)", id="spark-label")
        yield Sparkline([], id="spark", summary_function=statistics.mean)  # max flattened every bar to the top
        yield Static(id="resources")

    def on_mount(self) -> None:
        self.border_title = "acceptance · F2 · F1"

    def watch_figures(self, figures: Figures | None) -> None:
        self.query_one("#numbers", Static).update(numbers_text(figures))
        self.query_one("#spark", Sparkline).data = list(figures.recent_tau) if figures else []
        self.query_one("#resources", Static).update(resources_text(figures))


def numbers_text(f: Figures | None) -> Text:
    if f is None:
        return Text("no answer yet\n", style="dim")
    rate = "-" if f.acceptance_rate is None else f"{f.acceptance_rate:.0%}"
    speedup = "-" if f.speedup is None else f"{f.speedup:.2f}x"
    text = Text()
    for label, value in (("acceptance", rate), ("tau", f"{f.tau:.2f}"), ("tokens/s", f"{f.tokens_per_second:.1f}"),
                         ("speedup", speedup)):  # fmt: skip
        text.append(f"{label:<12}", "dim").append(f"{value}\n", "bold")
    if f.ar_tokens_per_second is not None:
        text.append(f"  AR {f.ar_tokens_per_second:.1f} tok/s @ {f.ar_context}\n", "dim")
    text.append("per depth\n", "dim")
    for depth, rate in enumerate(f.per_depth[:MAX_DEPTHS], start=1):
        filled = round(rate * BAR_WIDTH)
        text.append(f"{depth:>2} ").append("█" * filled, "green").append("·" * (BAR_WIDTH - filled), "dim")
        text.append(f" {rate:>4.0%}\n")
    if not f.per_depth:
        text.append("  -\n", "dim")
    return text


def resources_text(f: Figures | None) -> Text:
    if f is None:
        return Text()
    text = Text()
    for label, value in (("context", f"{f.context_used}/{f.context_max}"), ("drafter", f.drafter),
                         ("budget", f.budget_text),
                         ("memory", f"{f.memory_bytes / 2**20:.0f} MiB {f.memory_kind}")):  # fmt: skip
        text.append(f"{label:<9}", "dim").append(f"{value}\n")
    return text
