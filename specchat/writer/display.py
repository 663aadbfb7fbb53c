"""The command line's view of a book being written: a rich progress bar on stderr, and the final report."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import asdict

from rich.console import Console
from rich.progress import BarColumn, TextColumn

from specchat.logged_progress import LoggedProgress
from specchat.writer.write import WriteReport, WriteStatus


@contextmanager
def write_progress(console: Console, book_tokens: int, target: int):
    """A bar with tokens, tokens/s, tau, acceptance, refills and the time left; yields the callback the loop calls.

    The time left is the tokens left at the rate shown, this run's: a book's cost per token is flat once the
    window is full, and a refill's prefill stalls the bar for seconds, which an estimate over the last seconds
    (rich's) reads as the rate halving."""
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} tokens"),
        TextColumn("{task.fields[figures]}"),
        TextColumn("{task.fields[left]} left"),
    )
    with LoggedProgress(*columns, console=console, transient=False, refresh_per_second=4) as progress:
        task = progress.add_task("writing", total=target, completed=book_tokens, figures="", left=time_left(None))

        def update(status: WriteStatus) -> None:
            tau = f"tau {status.mean_accepted_length:.2f}" if status.mean_accepted_length else "tau -"
            accept = f"acc {status.acceptance_rate:.0%}" if status.acceptance_rate is not None else "acc -"
            figures = f"{status.tokens_per_second:6.1f} tok/s  {tau}  {accept}  refills {status.refills}"
            description = "replaying" if status.replaying else "writing"
            rate = status.tokens_per_second if not status.replaying else 0.0
            left = time_left((target - status.tokens) / rate if rate else None)
            progress.update(task, completed=status.tokens, description=description, figures=figures, left=left)

        yield update


def time_left(seconds: float | None) -> str:
    """H:MM:SS, as rich shows a time; dashes while there is no rate yet."""
    if seconds is None:
        return "-:--:--"
    whole = round(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def report_lines(report: WriteReport, path) -> list[str]:
    speed = f"{report.tokens_per_second:.1f} tok/s"
    if report.speedup_vs_ar is not None:
        speed += f" ({report.speedup_vs_ar:.2f}x autoregressive at {report.ar_tokens_per_second:.1f} tok/s)"
    tau = f"tau {report.mean_accepted_length:.2f}" if report.mean_accepted_length else "no decode step"
    accept = f", acceptance {report.acceptance_rate:.0%}" if report.acceptance_rate is not None else ""
    return [
        f"{path}: {report.tokens} tokens ({report.written} written now, {report.finish_reason or 'stopped'}) "
        f"in {report.seconds:.1f} s, {speed}",
        f"{tau}{accept}; distinct-1..4 {report.distinct_1:.2f} / {report.distinct_2:.2f} / "
        f"{report.distinct_3:.2f} / {report.distinct_4:.2f}; {report.refills} refills "
        f"(prefills {report.prefill_seconds:.1f} s)",
    ]


def report_json(report: WriteReport) -> dict:
    return {name: round(value, 4) if isinstance(value, float) else value for name, value in asdict(report).items()}
