"""A progress display written to a log prints its line as it goes, not only at the end."""

import io

from rich.console import Console
from rich.progress import TextColumn

from specchat.logged_progress import LoggedProgress


def _lines(every: float, steps: int) -> list[str]:
    log = io.StringIO()
    with LoggedProgress(TextColumn("{task.description} {task.completed:.0f}/{task.total:.0f}"), every=every,
                        console=Console(file=log, width=80)) as progress:  # fmt: skip
        task = progress.add_task("training", total=steps)
        for _ in range(steps):
            progress.advance(task)
    return log.getvalue().splitlines()


def test_a_log_gets_a_line_at_each_interval_and_the_last_at_the_end():
    assert _lines(every=0.0, steps=3) == ["training 1/3", "training 2/3", "training 3/3"]


def test_lines_wait_for_the_interval():
    assert _lines(every=3600.0, steps=3) == ["training 3/3"]


def test_a_logged_line_is_not_cut_to_a_terminal_width():
    log = io.StringIO()
    with LoggedProgress(TextColumn("{task.description}"), TextColumn("{task.fields[left]}"), every=0.0,
                        console=Console(file=log)) as progress:  # fmt: skip
        task = progress.add_task("x" * 100, left="")
        progress.update(task, left="0:25:19")
    assert log.getvalue().splitlines()[0] == "x" * 100 + " 0:25:19"
