"""The slash commands in Textual's command palette (Ctrl+P).

A command without an argument runs at once; one that takes an argument is typed into the input, ready
to be completed.
"""

from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

from specchat.tui.commands import COMMANDS, CommandSpec


class SlashCommands(Provider):
    async def discover(self) -> Hits:
        for spec in COMMANDS:
            yield DiscoveryHit(spec.usage, partial(self._choose, spec), help=spec.help)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for spec in COMMANDS:
            score = matcher.match(spec.usage)
            if score > 0:
                yield Hit(score, matcher.highlight(spec.usage), partial(self._choose, spec), help=spec.help)

    def _choose(self, spec: CommandSpec) -> None:
        self.app.choose_command(spec)
