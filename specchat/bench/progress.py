"""What a benchmark is running, on stderr: a bar with the step now running, steps done of all, time so far and
an ETA. Benchmarks on a CPU run for minutes; without it they were silent."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

NO_PROGRESS: Callable[[str], None] = lambda _what: None  # noqa: E731 - the benchmarks' default: say nothing


@contextmanager
def bench_progress(total: int) -> Iterator[Callable[[str], None]]:
    """Yields `step(what)`, to call as each of `total` steps starts (the one before it is then done). The bar
    shows on a terminal only and leaves the screen when the benchmark ends."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("ETA"), TimeRemainingColumn())  # fmt: skip
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task, started = bar.add_task("starting", total=total), 0

        def step(what: str) -> None:
            nonlocal started
            bar.update(task, completed=started, description=what)
            started += 1

        yield step
