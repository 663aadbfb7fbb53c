"""`specchat cache`: what specchat keeps on disk, and removing what is stale or everything a load makes again."""

from __future__ import annotations

import typer

from specchat.cli.common import app

cache_app = typer.Typer(help="What specchat keeps on disk, entry by entry: its size, what it is and was made from.")
app.add_typer(cache_app, name="cache")


@cache_app.callback(invoke_without_command=True)
def cache(ctx: typer.Context) -> None:
    """List each entry: its size, what it is and what it was made from, and why it is stale where it is."""
    if ctx.invoked_subcommand is not None:
        return
    from specchat.cache_entries import cache_entries
    from specchat.disk_cache import cache_dir

    entries = cache_entries()
    typer.echo(f"{cache_dir()} ($SPECCHAT_CACHE moves it), and the compiled kernels in torch's extension cache:\n")
    for entry in entries:
        made = f", from {', '.join(str(path) for path in entry.sources)}" if entry.sources else ""
        typer.echo(f"{_size(entry.size):>10}  {_shown(entry.path)}\n{'':>10}  {entry.kind}{made}")
        if entry.stale:
            typer.echo(f"{'':>10}  stale: {entry.stale}")
    stale = sum(entry.size for entry in entries if entry.stale)
    removable = sum(entry.size for entry in entries if entry.removable)
    typer.echo(f"\n{_size(sum(entry.size for entry in entries))} in all. `specchat cache prune` frees {_size(stale)} "
               f"(the stale entries), `specchat cache clear` {_size(removable)} (all but model files: a load makes "
               "again what it needs).")  # fmt: skip


@cache_app.command()
def prune() -> None:
    """Remove the stale entries: made from a file that is gone, built from other code of specchat, or left half
    written by a process that died."""
    from specchat.cache_entries import cache_entries

    _remove([entry for entry in cache_entries() if entry.stale])


@cache_app.command()
def clear() -> None:
    """Remove everything but model files: conversions, packed weights, compiled kernels (the next start compiles
    them again, a minute or more) and measurements are made again when a load needs them."""
    from specchat.cache_entries import cache_entries

    _remove([entry for entry in cache_entries() if entry.removable])


def _remove(entries) -> None:
    from specchat.cache_entries import remove

    for entry in entries:
        remove(entry)
        typer.echo(f"removed {_shown(entry.path)} ({_size(entry.size)})")
    typer.echo(f"{_size(sum(entry.size for entry in entries))} freed")


def _shown(path) -> str:
    """A path under specchat's cache as it lies there, others in full."""
    from specchat.disk_cache import cache_dir

    return str(path.relative_to(cache_dir())) if path.is_relative_to(cache_dir()) else str(path)


def _size(size: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"
