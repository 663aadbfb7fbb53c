"""A rich progress display that also reports into a log. Rich draws a live bar on a terminal only; written to a
file (a training run or a long write under `nohup`) it renders once, at the end. Long runs need the lines as they
go, so where the console is not a terminal this one prints its tasks' line every `every` seconds, as wide as it is: a
file has no columns to fit, and at rich's 80 the line's last figures (the time left) would end in an ellipsis."""

from __future__ import annotations

import time

from rich.progress import Progress, TaskID

LOG_WIDTH = 160  # a logged line's columns: room for every figure and the bar


class LoggedProgress(Progress):
    def __init__(self, *columns, every: float = 30.0, **options):
        super().__init__(*columns, **options)
        if not self.console.is_terminal:
            self.console.width = max(self.console.width, LOG_WIDTH)
        self.every = every
        self._logged_at = time.monotonic()

    def update(self, task_id: TaskID, **fields) -> None:
        super().update(task_id, **fields)
        self._log()

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._log()

    def _log(self) -> None:
        if self.console.is_terminal or time.monotonic() - self._logged_at < self.every:
            return
        self._logged_at = time.monotonic()
        self.console.print(self.make_tasks_table(task for task in self.tasks if not task.finished))
