"""The writer's progress line: the time left is the tokens left at the rate it shows."""

import io

from rich.console import Console

from specchat.writer.display import time_left, write_progress
from specchat.writer.write import WriteStatus


def _last_line(status: WriteStatus) -> str:
    log = io.StringIO()
    with write_progress(Console(file=log), 0, status.target) as update:
        update(status)
    return log.getvalue().splitlines()[-1]


def test_the_time_left_is_the_tokens_left_at_this_runs_rate():
    line = _last_line(WriteStatus(24046, 100000, 24046, 480.92, 24046, 24046, 0, 0, 8, replaying=False))
    assert "50.0 tok/s" in line and line.endswith(" 0:25:19 left")  # 75954 tokens at 50 a second


def test_a_replay_shows_no_time_left():
    line = _last_line(WriteStatus(24046, 100000, 0, 0.0, 0, 0, 0, 0, 8, replaying=True))
    assert line.startswith("replaying") and line.endswith(" -:--:-- left")


def test_times_read_as_hours_minutes_and_seconds():
    assert [time_left(s) for s in (None, 0.4, 59.6, 3600 * 27 + 61)] == ["-:--:--", "0:00:00", "0:01:00", "27:01:01"]
