"""`specchat write`: a long text written to a file as it is generated, resumable."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated

import typer

from specchat.checks import check_kv_cache, check_output_file, check_prompt_cache, check_yarn
from specchat.cli.common import (
    FLAGS,
    AttentionOption,
    BudgetOption,
    DeviceOption,
    DtypeOption,
    KvCacheOption,
    ModelOption,
    SeedOption,
    TemperatureOption,
    ThreadsOption,
    TopKOption,
    TopPOption,
    YarnOption,
    app,
    check_drafters,
    checked_overrides,
    quiet_transformers,
    sampling_config,
    use_threads,
)
from specchat.drafters import NAMES, check_option, parse_drafter
from specchat.errors import SpecchatError


@app.command("write")
def write(
    out: Annotated[Path, typer.Option("--out", "-o", help="The book's text file (ids and state are kept beside it).")],
    tokens: Annotated[int | None, typer.Option(
        "--tokens", help="Tokens to write (default 100000; --resume: the book's).")] = None,
    prompt: Annotated[str | None, typer.Option("--prompt", help="What to write (default: a long novel).")] = None,
    prompt_file: Annotated[Path | None, typer.Option("--prompt-file", help="Read the prompt from this file.")] = None,
    raw: Annotated[bool, typer.Option("--raw", help="Continue the prompt as text, without the chat template.")] = False,
    model: ModelOption = None,
    drafter: Annotated[str | None, typer.Option(
        "--drafter", "-d", help=f"{' | '.join(NAMES)}; A+B merges two (default: the model's best).")] = None,
    draft_budget: BudgetOption = None,
    draft_kv_budget: Annotated[int | None, typer.Option(
        "--draft-kv-budget", help="tokenswift: KV slots its draft forward reads (default 4096; 0 = the whole "
        "cache).")] = None,
    draft_forward: Annotated[bool | None, typer.Option(
        "--draft-forward/--no-draft-forward", help="tokenswift: draft the root's next token with a target forward "
        "(default on a GPU or with --draft-kv-budget), or the heads alone from the last verified state (default on "
        "a CPU).")] = None,
    penalty: Annotated[float | None, typer.Option(
        "--penalty", help="Contextual penalty theta (default 1.2; 1 = off).")] = None,
    penalty_window: Annotated[int | None, typer.Option(
        "--penalty-window", help="Tokens the penalty looks back (default 1024).")] = None,
    temperature: TemperatureOption = None,
    top_k: TopKOption = None,
    top_p: TopPOption = None,
    min_p: Annotated[float | None, typer.Option("--min-p", help="Default 0.1, keeping at least 20 tokens.")] = None,
    seed: SeedOption = None,
    stop_at_eos: Annotated[bool | None, typer.Option(
        "--stop-at-eos/--ignore-eos", help="End the book where the model ends its text (default: write on to "
        "--tokens).")] = None,
    resume: Annotated[bool, typer.Option(
        "--resume", help="Go on with the book in --out, exactly where it stopped.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing --out.")] = False,
    prompt_cache: Annotated[Path | None, typer.Option(
        "--prompt-cache", help="A file for the cache's keys and values, written at every stop: --resume reads them "
        "back instead of replaying the window (CPU decoder); the book remembers it.")] = None,
    dtype: DtypeOption = "auto",
    kv_cache: KvCacheOption = "auto",
    yarn: YarnOption = None,
    device: DeviceOption = "auto",
    threads: ThreadsOption = None,
    attention: AttentionOption = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
) -> None:
    """Write a long text to a file as it is generated (TokenSwift's settings); Ctrl-C stops, --resume goes on."""
    use_threads(threads)
    from specchat.writer import settings as book_defaults

    if tokens is not None and tokens < 1:
        raise SpecchatError("--tokens must be at least 1")
    if resume and force:
        raise SpecchatError("--resume continues the book and --force overwrites it: choose one")
    if not resume:
        check_output_file(out, force=force)
    if prompt is not None and prompt_file is not None:
        raise SpecchatError("give the prompt as --prompt or --prompt-file, not both")
    if prompt_file is not None:
        try:
            prompt = prompt_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise SpecchatError(
                f"cannot read the prompt file {prompt_file}: {getattr(error, 'strerror', None) or error}"
            ) from None
    if prompt is not None and not prompt.strip():
        raise SpecchatError("the prompt is empty")
    if drafter is not None:
        check_drafters([drafter], draft_budget)
    if draft_kv_budget is not None and draft_kv_budget != 0 and draft_kv_budget <= 16:
        raise SpecchatError("--draft-kv-budget must be 0 (the whole cache) or more than the 16 sink tokens")
    given = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p, "penalty": penalty,
             "penalty_window": penalty_window, "seed": seed}  # fmt: skip
    flags = {**FLAGS, "penalty": "--penalty", "penalty_window": "--penalty-window"}
    sampling = dataclasses.asdict(sampling_config(book_defaults.SAMPLING, given, flags))
    checked_overrides(dtype, attention)
    check_kv_cache(kv_cache)
    check_yarn(yarn)
    if prompt_cache is not None:
        check_prompt_cache(prompt_cache)

    from specchat.writer.book import Book

    book = Book.open(out) if resume else None  # a bad state file fails before the model loads
    remembered = None  # the book's own cache file, checked as a given one is; left out where the decoder cannot use it
    if book is not None and prompt_cache is None and book.progress.prompt_cache:
        remembered = Path(book.progress.prompt_cache)
        try:
            check_prompt_cache(remembered)
        except SpecchatError as error:
            raise SpecchatError(f"{error} (the file this book remembers; --prompt-cache FILE names another)") from None
    if book is not None:
        model = model or book.settings.model
        yarn = yarn or book.settings.yarn
        tokens = tokens or max(book.progress.target, book.progress.tokens)
        if book.progress.finished == "eos":
            raise SpecchatError(f"{out} ended where the model ended its text ({book.progress.tokens} tokens)")
        if tokens <= book.progress.tokens:
            raise SpecchatError(f"{out} holds {book.progress.tokens} tokens already; ask for more with --tokens")
    tokens = tokens or 100_000
    quiet_transformers()
    from rich.console import Console

    from specchat.drafters import resolve_drafter
    from specchat.engine.target_forward import canonical
    from specchat.loading import load_model, resolve_device, resolve_model
    from specchat.writer.display import report_json, report_lines, write_progress
    from specchat.writer.start import new_book, resumed_book, writer_drafter
    from specchat.writer.write import write_book

    source = resolve_model(model)
    choice = resolve_drafter(parse_drafter(drafter or writer_drafter(source.profile)), source.profile, source.name)
    for option, value in (("kv_budget", draft_kv_budget), ("draft_forward", draft_forward)):
        if value is not None:
            check_option(choice, option)
    if draft_kv_budget is not None and draft_forward is False:
        raise SpecchatError("--draft-kv-budget sizes the draft forward, which --no-draft-forward leaves out")
    resolve_device(device)
    loaded = load_model(model, dtype=dtype, device=device, attention=attention, yarn=yarn)
    if prompt_cache is not None and not canonical(loaded.model):  # before a new book's files are made
        raise SpecchatError("--prompt-cache needs the CPU decoder (--attention canonical), where keys and values read "
                            "back are bitwise a new prefill's")  # fmt: skip
    prompt_cache = prompt_cache or (remembered if canonical(loaded.model) else None)  # else the resume replays
    drafting = {"kv_cache": kv_cache, "drafter": choice, "draft_budget": draft_budget, "kv_budget": draft_kv_budget,
                "draft_forward": draft_forward}
    if book is None:
        book, engine = new_book(loaded, out, tokens, prompt or book_defaults.STORY, raw=raw, sampling=sampling,
                                stop_at_eos=bool(stop_at_eos), force=force, **drafting)  # fmt: skip
    else:
        engine = resumed_book(loaded, book, tokens, prompt=prompt, raw=raw, given=given, stop_at_eos=stop_at_eos,
                              **drafting)  # fmt: skip
    book.progress.target, book.progress.finished = tokens, None
    if prompt_cache is not None:
        book.progress.prompt_cache = str(prompt_cache.absolute())  # a plain --resume finds it
    book.save()
    console = Console(stderr=True)
    if book.progress.tokens == 0:
        console.print(f"[dim]prompt ({book.settings.prompt_tokens} tokens):[/dim] {prompt or book_defaults.STORY}")
    _stop_on_sigterm()
    try:
        with write_progress(console, book.progress.tokens, tokens) as update:
            report = write_book(engine, book, tokens, status=update, warn=lambda m: console.print(f"warning: {m}"),
                                prompt_cache=prompt_cache)  # fmt: skip
    except KeyboardInterrupt:
        console.print(f"stopped at {book.progress.tokens} tokens; `specchat write --out {out} --resume` goes on")
        raise
    finally:
        book.close()
    if as_json:
        print(json.dumps(report_json(report)))
    else:
        for line in report_lines(report, out):
            console.print(line)


def _stop_on_sigterm() -> None:
    """`kill` stops a write as Ctrl-C does: the book's state is saved on the way out."""
    import signal

    def interrupt(_signum, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
