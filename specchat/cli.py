"""The `specchat` command line: parses options, calls the engine, prints what comes back."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

try:  # typer >= 0.24 carries its own copy of click
    from typer._click import exceptions as click_errors
except ImportError:
    from click import exceptions as click_errors

from specchat.checks import check_dtype, check_output_dir, check_output_file, check_quantize
from specchat.bench.prompts import PROMPT_SET_NAMES
from specchat.drafters import (
    DEFAULT_DRAFTER,
    NAMES,
    DrafterChoice,
    check_draft_cache,
    parse_drafter,
    reads_draft_cache,
)
from specchat.engine.attention import CHOICES as ATTENTION_CHOICES
from specchat.engine.attention import check_attention
from specchat.errors import SpecchatError

app = typer.Typer(
    name="specchat",
    help="Fast, exact LLM generation with tree speculative decoding.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

ModelOption = Annotated[
    str | None, typer.Option("--model", "-m", help="Profile alias, Hugging Face repo id, local directory or GGUF file.")
]
DrafterOption = Annotated[
    str,
    typer.Option(
        "--drafter", "-d", help=f"Drafter: {' | '.join(NAMES)} (default {DEFAULT_DRAFTER}); NAME:DIR for a local checkpoint; A+B merges two."
    ),
]
BudgetOption = Annotated[
    int | None,
    typer.Option("--draft-budget", help="Most draft-tree nodes per step (default: chosen for this machine)."),
]
DraftCacheOption = Annotated[
    str | None,
    typer.Option("--draft-cache", help="What a model or longspec draft reads of a long context: full | streaming | "
                 "retrieval (the chunks the target attends to). Default: retrieval for model, full for longspec."),
]  # fmt: skip
DtypeOption = Annotated[
    str,
    typer.Option(
        help="auto | float32 | bfloat16 | float16. auto: bf16 on GPU; on CPU the embedded model's own 4-bit GGUF "
        "weights, activations in the faster exact dtype (float32 = dense reference, as transformers)."
    ),
]
QuantizeOption = Annotated[
    str | None, typer.Option("--quantize", help="int4 | int8: group-wise weight-only quantization on load (CPU).")
]
DeviceOption = Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N.")]
AttentionOption = Annotated[
    str,
    typer.Option(help=f"{' | '.join(ATTENTION_CHOICES)} (auto: hybrid where its Triton kernels run, on a CPU "
                 "canonical in bf16/fp16, else sdpa)."),
]
TemperatureOption = Annotated[float | None, typer.Option("--temperature", "-t", help="0 = greedy.")]
TopKOption = Annotated[int | None, typer.Option("--top-k")]
TopPOption = Annotated[float | None, typer.Option("--top-p")]
MinPOption = Annotated[float | None, typer.Option("--min-p")]
PenaltyOption = Annotated[float | None, typer.Option("--repetition-penalty")]
SeedOption = Annotated[int | None, typer.Option("--seed")]
SystemOption = Annotated[str | None, typer.Option("--system", help="System prompt.")]
DeviceMapOption = Annotated[
    str | None, typer.Option("--device-map", help="accelerate device map (e.g. auto) for models larger than one GPU.")
]


@app.command()
def run(
    prompt: Annotated[str, typer.Argument(help="The prompt; '-' reads it from stdin.")],
    model: ModelOption = None,
    drafter: DrafterOption = DEFAULT_DRAFTER,
    draft_budget: BudgetOption = None,
    draft_cache: DraftCacheOption = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", help="Most tokens to generate.")] = 512,
    temperature: TemperatureOption = None,
    top_k: TopKOption = None,
    top_p: TopPOption = None,
    min_p: MinPOption = None,
    repetition_penalty: PenaltyOption = None,
    seed: SeedOption = None,
    stop: Annotated[list[str] | None, typer.Option("--stop", help="Stop string (repeatable).")] = None,
    system: SystemOption = None,
    raw: Annotated[bool, typer.Option("--raw", help="Skip the chat template.")] = False,
    dtype: DtypeOption = "auto",
    quantize: QuantizeOption = None,
    device: DeviceOption = "auto",
    device_map: DeviceMapOption = None,
    attention: AttentionOption = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of streaming.")] = False,
) -> None:
    """Generate a reply to PROMPT and print it (or a JSON report)."""
    prompt = _read_prompt(prompt)
    if max_new_tokens < 1:
        raise SpecchatError("--max-new-tokens must be at least 1")
    if any(not each for each in stop or ()):
        raise SpecchatError("--stop takes a non-empty string")
    [choice] = _check_drafters([drafter], draft_budget)
    if draft_cache is not None:
        check_draft_cache(draft_cache, choice)
    overrides = _checked_overrides(
        dtype, attention, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
        penalty=repetition_penalty, seed=seed,
    )  # fmt: skip
    check_quantize(quantize, device)
    _quiet_transformers()
    from specchat.drafters import build_drafter, resolve_drafter, use_draft_cache
    from specchat.engine.generate import Engine
    from specchat.engine.prompt import encode_prompt
    from specchat.loading import decoding_defaults, load_model, resolve_device, resolve_model

    source = resolve_model(model)  # fail fast, before the slow imports and loads
    choice = resolve_drafter(choice, source.profile, source.name)
    resolve_device(device)
    loaded = load_model(
        model, dtype=dtype, quantize=quantize, device=device, device_map=device_map, attention=attention
    )
    sampling = _sampling_config(decoding_defaults(loaded), overrides)
    prompt_ids = encode_prompt(loaded.tokenizer, prompt, system=system, raw=raw)
    engine = Engine(loaded.model, loaded.tokenizer, max_len=len(prompt_ids) + max_new_tokens)
    engine.set_drafter(build_drafter(choice, engine.target), draft_budget)
    if draft_cache is not None:
        use_draft_cache(engine.drafter, draft_cache)

    tokens, origins, text, stats, finish = [], [], [], None, None
    try:
        for event in engine.generate(
            prompt_ids, sampling=sampling, max_new_tokens=max_new_tokens, stop=tuple(stop or ())
        ):
            tokens += event.tokens
            origins += event.origins
            text.append(event.text)
            stats, finish = event.stats, event.finish_reason
            if not as_json:
                _out(event.text)
    except KeyboardInterrupt:  # report what was produced, then exit 130 (main)
        finish = "interrupted"
    if stats is None:
        raise KeyboardInterrupt
    if as_json:
        report = {
            "text": "".join(text),
            "token_ids": tokens,
            "origins": origins,
            "new_tokens": stats.new_tokens,
            "prompt_tokens": stats.prompt_tokens,
            "finish_reason": finish,
            "prefill_seconds": round(stats.prefill_seconds, 4),
            "decode_seconds": round(stats.decode_seconds, 4),
            "tokens_per_second": round(stats.tokens_per_second, 3) if stats.steps else None,
            "steps": stats.steps,
            "mean_accepted_length": round(stats.mean_accepted_length, 4) if stats.steps else None,
            "acceptance_rate": stats.acceptance_rate,
            "per_depth_acceptance": [round(a, 4) for a in stats.per_depth_acceptance],
            "draft_budget": round(stats.mean_budget, 2) if choice.name != "none" else None,
            "model": loaded.source.name,
            "weights": loaded.weights,
            "dtype": loaded.dtype,
            "drafter": str(choice),
            "attention": loaded.model.config._attn_implementation,
        }
        _out(json.dumps(report, ensure_ascii=False) + "\n")
    else:
        _out("\n")
        budget_note = f" | budget {stats.mean_budget:.1f}" if choice.name != "none" and stats.steps else ""
        decode = (f"decode {stats.tokens_per_second:.1f} tok/s | tau {stats.mean_accepted_length:.2f}"
                  if stats.steps else "no decode step")  # fmt: skip
        typer.echo(
            f"[{stats.new_tokens} tokens ({finish}) | prefill {stats.prompt_tokens} tokens "
            f"{stats.prefill_seconds:.2f} s | {decode}{budget_note} | {loaded.source.name} "
            f"{loaded.weights}/{loaded.dtype}, drafter {choice}]",
            err=True,
        )
    if finish == "interrupted":
        raise KeyboardInterrupt


def _out(text: str) -> None:
    """Write to stdout. A reader that left (`specchat run ... | head`) ends the command quietly with exit 0, as
    command-line tools do (click would exit 1)."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        os._exit(0)  # no flush of the closed stream at exit


def _read_prompt(prompt: str) -> str:
    """The prompt argument, or stdin for '-': text that is valid UTF-8 and not blank."""
    if prompt == "-":
        if sys.stdin.isatty():
            typer.echo("reading the prompt from stdin (Ctrl-D ends)", err=True)
        try:
            prompt = sys.stdin.buffer.read().decode("utf-8")
        except UnicodeDecodeError:
            raise SpecchatError("the prompt on stdin is not valid UTF-8") from None
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError:  # undecodable argv bytes arrive as lone surrogates
        raise SpecchatError("the prompt is not valid UTF-8") from None
    if not prompt.strip():
        raise SpecchatError("the prompt is empty")
    return prompt


@app.command()
def models() -> None:
    """List model profiles: whether each is on this machine, and the drafters it runs with."""
    from specchat.drafters import KINDS, usable_drafters
    from specchat.loading import is_available, offline, resolve_model
    from specchat.profiles import DEFAULT_PROFILE, load_profiles

    missing = "not cached (offline)" if offline() else "downloads on first use"
    trained = [name for name, kind in KINDS.items() if kind.trained]
    typer.echo("--model ALIAS (any Hugging Face repo id or local model directory works too):\n")
    for name, profile in load_profiles().items():
        alias = f"{name} (default)" if name == DEFAULT_PROFILE else name
        here = "here" if is_available(resolve_model(name)) else missing
        typer.echo(f"  {alias:<24} {profile.target}\n      {here}; drafters: {', '.join(usable_drafters(profile))}")
        for kind, repo in profile.drafters.items():
            state = "cannot load yet" if kind not in KINDS else "here" if _cached(repo) else missing
            other = profile.trained_on.get(kind)
            note = f"; trained on {other}, runs exactly here, may be accepted less" if other else ""
            typer.echo(f"      {kind}: {repo} ({state}{note})")
        others = [kind for kind in trained if kind not in profile.drafters]
        if others:
            typer.echo(f"      {', '.join(others)}: none published; --drafter NAME:DIR runs a local checkpoint")


@app.command()
def chat(
    model: ModelOption = None,
    drafter: DrafterOption = DEFAULT_DRAFTER,
    draft_budget: BudgetOption = None,
    draft_cache: DraftCacheOption = None,
    system: SystemOption = None,
    temperature: TemperatureOption = None,
    top_k: TopKOption = None,
    top_p: TopPOption = None,
    min_p: MinPOption = None,
    repetition_penalty: PenaltyOption = None,
    seed: SeedOption = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", help="Most tokens per answer.")] = 1024,
    context: Annotated[
        int | None, typer.Option("--context", help="Most tokens the conversation may hold (default 8192).")
    ] = None,
    dtype: DtypeOption = "auto",
    quantize: QuantizeOption = None,
    device: DeviceOption = "auto",
    attention: AttentionOption = "auto",
) -> None:
    """Chat in the terminal: accepted draft tokens are coloured as they stream, with live acceptance figures."""
    [choice] = _check_drafters([drafter], draft_budget)
    if draft_cache is not None:
        check_draft_cache(draft_cache, choice)
    overrides = _checked_overrides(
        dtype, attention, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
        penalty=repetition_penalty, seed=seed,
    )  # fmt: skip
    from specchat.loading import decoding_defaults, load_model, resolve_device, resolve_model
    from specchat.tui.session import ChatSettings, check_settings

    settings = ChatSettings(
        drafter=drafter, draft_budget=draft_budget, draft_cache=draft_cache, system=system,
        max_new_tokens=max_new_tokens, context=context,
    )  # fmt: skip
    check_settings(settings)
    check_quantize(quantize, device)
    resolve_model(model)  # fail fast, before the app starts
    resolve_device(device)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise SpecchatError("chat needs a terminal; for scripts use `specchat run`")
    _quiet_transformers()
    from specchat.tui.app import ChatApp

    def loader(progress):
        loaded = load_model(
            model, dtype=dtype, quantize=quantize, device=device, attention=attention, progress=progress
        )
        return loaded, _sampling_config(decoding_defaults(loaded), overrides)

    chat_app = ChatApp(loader, settings)
    chat_app.run()
    if chat_app.error is not None:
        typer.echo(f"error: {chat_app.error}", err=True)
    _leave(1 if chat_app.error is not None else 0)


def _leave(status: int) -> None:
    """Exit now, without the interpreter's finalization: triton, which transformers imports even on a CPU,
    reports ~30 lines of nanobind "leaks" there, onto the terminal the chat just gave back."""
    import atexit

    atexit._run_exitfuncs()  # the terminal's settings are given back here (tui/typeahead.py)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


@app.command("write")
def write(
    out: Annotated[Path, typer.Option("--out", "-o", help="The book's text file (ids and state are kept beside it).")],
    tokens: Annotated[int | None, typer.Option("--tokens", help="Tokens to write (default 100000; --resume: the book's).")] = None,
    prompt: Annotated[str | None, typer.Option("--prompt", help="What to write (default: a long novel).")] = None,
    prompt_file: Annotated[Path | None, typer.Option("--prompt-file", help="Read the prompt from this file.")] = None,
    raw: Annotated[bool, typer.Option("--raw", help="Continue the prompt as text, without the chat template.")] = False,
    model: ModelOption = None,
    drafter: Annotated[str | None, typer.Option("--drafter", "-d", help=f"{' | '.join(NAMES)}; A+B merges two (default: the model's best).")] = None,
    draft_budget: BudgetOption = None,
    draft_kv_budget: Annotated[int | None, typer.Option("--draft-kv-budget", help="tokenswift: KV slots its draft forward reads (default 4096; 0 = the whole cache).")] = None,
    penalty: Annotated[float | None, typer.Option("--penalty", help="Contextual penalty theta (default 1.2; 1 = off).")] = None,
    penalty_window: Annotated[int | None, typer.Option("--penalty-window", help="Tokens the penalty looks back (default 1024).")] = None,
    temperature: TemperatureOption = None,
    top_k: TopKOption = None,
    top_p: TopPOption = None,
    min_p: Annotated[float | None, typer.Option("--min-p", help="Default 0.1, keeping at least 20 tokens.")] = None,
    seed: SeedOption = None,
    stop_at_eos: Annotated[bool | None, typer.Option("--stop-at-eos/--ignore-eos", help="End the book where the model ends its text (default: write on to --tokens).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Go on with the book in --out, exactly where it stopped.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing --out.")] = False,
    dtype: DtypeOption = "auto",
    device: DeviceOption = "auto",
    attention: AttentionOption = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
) -> None:
    """Write a long text to a file as it is generated (TokenSwift's settings); Ctrl-C stops, --resume goes on."""
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
            raise SpecchatError(f"cannot read the prompt file {prompt_file}: {getattr(error, 'strerror', None) or error}") from None
    if prompt is not None and not prompt.strip():
        raise SpecchatError("the prompt is empty")
    if drafter is not None:
        _check_drafters([drafter], draft_budget)
    if draft_kv_budget is not None and draft_kv_budget != 0 and draft_kv_budget <= 16:
        raise SpecchatError("--draft-kv-budget must be 0 (the whole cache) or more than the 16 sink tokens")
    given = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p, "penalty": penalty,
             "penalty_window": penalty_window, "seed": seed}  # fmt: skip
    defaults = {"temperature": book_defaults.TEMPERATURE, "top_k": 0, "top_p": 1.0, "min_p": book_defaults.MIN_P,
                "min_p_keep": book_defaults.MIN_P_KEEP, "penalty": book_defaults.PENALTY,
                "penalty_window": book_defaults.PENALTY_WINDOW}  # fmt: skip
    flags = {**FLAGS, "penalty": "--penalty", "penalty_window": "--penalty-window"}
    sampling = dataclasses.asdict(_sampling_config(defaults, given, flags))
    _checked_overrides(dtype, attention)

    from specchat.writer.book import Book

    book = Book.open(out) if resume else None  # a bad state file fails before the model loads
    if book is not None:
        model = model or book.settings.model
        tokens = tokens or max(book.progress.target, book.progress.tokens)
        if book.progress.finished == "eos":
            raise SpecchatError(f"{out} ended where the model ended its text ({book.progress.tokens} tokens)")
        if tokens <= book.progress.tokens:
            raise SpecchatError(f"{out} holds {book.progress.tokens} tokens already; ask for more with --tokens")
    tokens = tokens or 100_000
    _quiet_transformers()
    from rich.console import Console

    from specchat.drafters import build_drafter, resolve_drafter
    from specchat.loading import load_model, resolve_device, resolve_model
    from specchat.writer.display import report_json, report_lines, write_progress
    from specchat.writer.start import new_book, resumed_book, writer_drafter
    from specchat.writer.write import write_book

    source = resolve_model(model)
    choice = resolve_drafter(parse_drafter(drafter or writer_drafter(source.profile)), source.profile, source.name)
    if draft_kv_budget is not None and choice.name != "tokenswift":
        raise SpecchatError(f"--draft-kv-budget is for the tokenswift drafter, not {choice}")
    resolve_device(device)
    loaded = load_model(model, dtype=dtype, device=device, attention=attention)
    if book is None:
        book, engine = new_book(loaded, out, tokens, prompt or book_defaults.STORY, raw=raw, sampling=sampling,
                                stop_at_eos=bool(stop_at_eos), force=force)  # fmt: skip
    else:
        engine = resumed_book(loaded, book, tokens, prompt=prompt, raw=raw, given=given, stop_at_eos=stop_at_eos)
    book.progress.target, book.progress.finished = tokens, None
    book.save()
    drafter_object = build_drafter(choice, engine.target)
    if draft_kv_budget is not None:
        drafter_object.use_kv_budget(draft_kv_budget)
    engine.set_drafter(drafter_object, draft_budget)
    console = Console(stderr=True)
    if book.progress.tokens == 0:
        console.print(f"[dim]prompt ({book.settings.prompt_tokens} tokens):[/dim] {prompt or book_defaults.STORY}")
    _stop_on_sigterm()
    try:
        with write_progress(console, book.progress.tokens, tokens) as update:
            report = write_book(engine, book, tokens, status=update, warn=lambda m: console.print(f"warning: {m}"))
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


@app.command()
def serve(
    model: ModelOption = None,
    drafter: DrafterOption = DEFAULT_DRAFTER,
    draft_budget: BudgetOption = None,
    draft_cache: DraftCacheOption = None,
    host: Annotated[str, typer.Option(help="Address to listen on (0.0.0.0: every interface).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: a free one, printed).")] = 8000,
    api_key: Annotated[str | None, typer.Option("--api-key", envvar="SPECCHAT_API_KEY",
                                                help="Require `Authorization: Bearer KEY`.")] = None,  # fmt: skip
    context: Annotated[int, typer.Option("--context", help="Most tokens a request may hold, prompt and answer.")] = 8192,
    max_queue: Annotated[int, typer.Option("--max-queue", help="Requests that may wait; more get 429.")] = 32,
    max_body_mb: Annotated[float, typer.Option("--max-body-mb", help="Largest request body; larger get 413.")] = 4.0,
    dtype: DtypeOption = "auto",
    quantize: QuantizeOption = None,
    device: DeviceOption = "auto",
    attention: AttentionOption = "auto",
) -> None:
    """Serve the OpenAI API (chat completions, completions, models) with exact speculative decoding."""
    [choice] = _check_drafters([drafter], draft_budget)
    if draft_cache is not None:
        check_draft_cache(draft_cache, choice)
    _checked_overrides(dtype, attention)
    check_quantize(quantize, device)
    if not 0 <= port <= 65535:
        raise SpecchatError("--port must be between 0 and 65535")
    if context < 16 or max_queue < 1 or not max_body_mb > 0:
        raise SpecchatError("--context must be at least 16, --max-queue at least 1 and --max-body-mb above 0")
    if api_key is not None and not api_key.strip():
        raise SpecchatError("--api-key is empty")
    _quiet_transformers()
    from specchat.drafters import resolve_drafter
    from specchat.loading import resolve_device, resolve_model
    from specchat.server.server import ServeSettings
    from specchat.server.server import serve as run_server

    source = resolve_model(model)  # fail fast, before the server starts
    resolve_drafter(choice, source.profile, source.name)
    resolve_device(device)
    run_server(ServeSettings(
        model=model, drafter=drafter, draft_budget=draft_budget, draft_cache=draft_cache, host=host, port=port,
        api_key=api_key, context=context, max_queue=max_queue, max_body_bytes=int(max_body_mb * 2**20), dtype=dtype,
        quantize=quantize, device=device, attention=attention,
    ))  # fmt: skip


train_app = typer.Typer(help="Train drafters for a target: data (the target's own answers), then the drafter.")
app.add_typer(train_app, name="train")


@train_app.command("data")
def train_data(
    out: Annotated[Path, typer.Option("--out", help="Directory of jsonl shards (created; a rerun resumes).")],
    model: ModelOption = None,
    tokens: Annotated[int, typer.Option("--tokens", help="Answer tokens to reach in --out.")] = 300_000,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", help="Longest answer.")] = 320,
    heldout: Annotated[float, typer.Option("--heldout", help="Fraction of prompts held out.")] = 0.02,
    sampled: Annotated[float, typer.Option("--sampled", help="Fraction answered with the profile's sampling "
                                                          "settings; the rest greedy.")] = 0.5,  # fmt: skip
    seed: SeedOption = None,
    dtype: DtypeOption = "auto",
    device: DeviceOption = "auto",
) -> None:
    """Self-distillation data: prompts from the Python standard library, the system's package documentation
    and open-chat prompts, answered by the target itself (the bench's prompts left out)."""
    if tokens < 1 or max_new_tokens < 1:
        raise SpecchatError("--tokens and --max-new-tokens must be at least 1")
    if not (0 <= heldout < 1 and 0 <= sampled <= 1):
        raise SpecchatError("--heldout must be in [0, 1) and --sampled in [0, 1]")
    check_dtype(dtype)
    check_output_dir(out)
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from specchat.training.data import DataRecipe, build_data
    from specchat.training.prompts import all_prompts

    loaded = _load(model, dtype, device)
    recipe = DataRecipe(loaded.source.name, loaded.weights, loaded.dtype, seed or 0, max_new_tokens, heldout, sampled)
    prompts = all_prompts(recipe.seed)
    columns = (TextColumn("[bold]data"), BarColumn(), TextColumn("{task.completed:,.0f}/{task.total:,.0f} tokens"),
               TextColumn("{task.fields[records]} prompts · {task.fields[rate]:.0f} tok/s"), TimeRemainingColumn())  # fmt: skip
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task("data", total=tokens, records=0, rate=0.0)

        def show(now):
            bar.update(task, completed=min(now.answer_tokens, tokens), records=now.records, rate=now.tokens_per_second)

        done = build_data(loaded, out, prompts, recipe, tokens=tokens, progress=show)
    print(f"{out}: {done.records} prompts, {done.answer_tokens} answer tokens ({len(prompts)} prompts available)")


DataOption = Annotated[Path, typer.Option("--data", help="Directory of `specchat train data`.")]
DraftOutOption = Annotated[Path, typer.Option("--out", help="Checkpoint directory (created; --resume goes on).")]
TargetOption = Annotated[str | None, typer.Option("--target", "--model", "-m", help="The target model.")]
VocabOption = Annotated[
    int, typer.Option("--vocab", help="Vocabulary the loss is taken over, most frequent answer tokens first (0: all).")
]
EpochsOption = Annotated[float, typer.Option("--epochs", help="Passes over the training samples.")]
BatchOption = Annotated[int, typer.Option("--batch", help="Samples per optimizer step (accumulated).")]
LrOption = Annotated[float, typer.Option("--lr", help="Peak learning rate (cosine, 10% warm-up).")]
CheckpointOption = Annotated[float, typer.Option("--checkpoint-minutes", help="Minutes between checkpoints.")]
ResumeOption = Annotated[bool, typer.Option("--resume", help="Go on with the run in --out.")]
PrecisionOption = Annotated[str, typer.Option("--precision", help="bf16 (autocast), fp32, or auto: bf16 on a GPU or a CPU with bf16 instructions.")]


@train_app.command("longspec")
def train_longspec(
    data: DataOption,
    out: DraftOutOption,
    target: TargetOption = None,
    epochs: EpochsOption = 3.0,
    batch: BatchOption = 16,
    lr: LrOption = 5e-4,
    vocab: Annotated[int, typer.Option("--vocab", help="Vocabulary trained over, most frequent first (0: all); "
                                                       "the shipped one is chosen by measured speed.")] = 0,  # fmt: skip
    checkpoint_minutes: CheckpointOption = 5.0,
    resume: ResumeOption = False,
    eval_prompts: Annotated[int, typer.Option("--eval-prompts", help="Held-out prompts decoded at the end.")] = 16,
    precision: PrecisionOption = "auto",
    seed: SeedOption = None,
    dtype: DtypeOption = "auto",
    device: DeviceOption = "auto",
) -> None:
    """A LongSpec draft layer for the target: anchor-offset positions, lag training, loss through the target's
    frozen LM head; then the draft vocabulary whose decoding is fastest here."""
    if eval_prompts < 1:
        raise SpecchatError("--eval-prompts must be at least 1")
    from specchat.training.train_longspec import train_longspec as run_training

    summary = _train_drafter(run_training, data, out, target, epochs, batch, lr, vocab, checkpoint_minutes, resume,
                             precision, seed, dtype, device, eval_prompts=eval_prompts)  # fmt: skip
    for row in summary["vocab_measurements"]:
        print(f"  vocab {row['vocab']}: tau {row['tau']:.2f}, {row['tokens_per_second']:.1f} tok/s, {row['speedup']:.2f}x AR")
    print(f"{out}: LongSpec drafter, draft vocabulary {summary['draft_vocab']}; use --drafter longspec:{out}")


@train_app.command("glide")
def train_glide(
    data: DataOption,
    out: DraftOutOption,
    target: TargetOption = None,
    epochs: EpochsOption = 3.0,
    batch: BatchOption = 16,
    lr: LrOption = 5e-4,
    vocab: VocabOption = 0,
    checkpoint_minutes: CheckpointOption = 5.0,
    resume: ResumeOption = False,
    precision: PrecisionOption = "auto",
    seed: SeedOption = None,
    dtype: DtypeOption = "auto",
    device: DeviceOption = "auto",
) -> None:
    """A one-layer GLIDE draft for the target: its embedding and LM head the target's, cross-attention to the
    target's last layer under GLIDE's block-wise lag (blocks of 5)."""
    from specchat.training.train_glide import train_glide as run_training

    summary = _train_drafter(run_training, data, out, target, epochs, batch, lr, vocab, checkpoint_minutes, resume,
                             precision, seed, dtype, device)  # fmt: skip
    last = summary["log"][-1] if summary["log"] else {}
    print(f"{out}: GLIDE drafter, held-out chain tau {last.get('heldout_chain_tau', float('nan')):.2f}; "
          f"use --drafter glide:{out}")  # fmt: skip


@train_app.command("tokenswift")
def train_tokenswift(
    data: DataOption,
    out: DraftOutOption,
    target: TargetOption = None,
    epochs: EpochsOption = 3.0,
    batch: BatchOption = 16,
    lr: Annotated[float, typer.Option("--lr", help="Peak learning rate (cosine after --warmup-steps).")] = 5e-3,
    warmup_steps: Annotated[int, typer.Option("--warmup-steps", help="Linear warm-up steps.")] = 50,
    vocab: VocabOption = 0,
    checkpoint_minutes: CheckpointOption = 5.0,
    resume: ResumeOption = False,
    precision: PrecisionOption = "auto",
    seed: SeedOption = None,
    dtype: DtypeOption = "auto",
    device: DeviceOption = "auto",
) -> None:
    """TokenSwift's three multi-token heads for the target: chained residual blocks on its last hidden state,
    guessing tokens t+2..t+4 through its frozen LM head (TokenSwift's recipe: LR 5e-3, 50 warm-up steps)."""
    if warmup_steps < 0:
        raise SpecchatError("--warmup-steps must be at least 0")
    from specchat.training.train_tokenswift import BETAS
    from specchat.training.train_tokenswift import train_tokenswift as run_training

    summary = _train_drafter(run_training, data, out, target, epochs, batch, lr, vocab, checkpoint_minutes, resume,
                             precision, seed, dtype, device,
                             recipe_options={"betas": BETAS, "warmup_steps": warmup_steps})  # fmt: skip
    last = summary["log"][-1] if summary["log"] else {}
    accuracy = ", ".join(f"{last.get(f'heldout_head{i + 1}_top1', float('nan')):.2f}" for i in range(summary["gamma"]))
    print(f"{out}: TokenSwift heads, held-out top-1 {accuracy} (heads 1..{summary['gamma']}), "
          f"chain tau {last.get('heldout_chain_tau', float('nan')):.2f}")  # fmt: skip


@train_app.command("model-drafter")
def train_model_drafter(
    data: DataOption,
    out: DraftOutOption,
    target: TargetOption = None,
    layers: Annotated[int, typer.Option("--layers", help="The target's first layers the student starts as.")] = 2,
    epochs: EpochsOption = 3.0,
    batch: BatchOption = 16,
    lr: LrOption = 5e-4,
    vocab: VocabOption = 0,
    checkpoint_minutes: CheckpointOption = 5.0,
    resume: ResumeOption = False,
    precision: PrecisionOption = "auto",
    seed: SeedOption = None,
    dtype: Annotated[str, typer.Option(help="float32 | bfloat16: the target's dense weights the student starts "
                                            "as (not the embedded GGUF's 4-bit ones).")] = "float32",  # fmt: skip
    device: DeviceOption = "auto",
) -> None:
    """A standalone draft model for the target: its first --layers layers and final norm, distilled towards
    its greedy tokens over its own embedding and LM head (shared, frozen and not stored)."""
    from specchat.training.train_model_drafter import train_model_drafter as run_training

    summary = _train_drafter(run_training, data, out, target, epochs, batch, lr, vocab, checkpoint_minutes, resume,
                             precision, seed, dtype, device, layers=layers)  # fmt: skip
    last = summary["log"][-1] if summary["log"] else {}
    print(f"{out}: {summary['layers']}-layer draft model ({summary['checkpoint_bytes'] / 1e6:.1f} MB), held-out chain "
          f"tau {last.get('heldout_chain_tau', float('nan')):.2f}; use --drafter model:{out}")  # fmt: skip


def _train_drafter(run_training, data, out, target, epochs, batch, lr, vocab, checkpoint_minutes, resume, precision,
                   seed, dtype, device, recipe_options: dict | None = None, **options) -> dict:  # fmt: skip
    """Check the shared options, load the target and run `run_training` under a progress display;
    `recipe_options` set recipe fields the shared options do not."""
    if not all(0 < value < math.inf for value in (epochs, lr, checkpoint_minutes)) or batch < 1 or vocab < 0:
        raise SpecchatError("--epochs, --lr, --checkpoint-minutes must be positive numbers, --batch at least 1, "
                            "--vocab >= 0")  # fmt: skip
    if precision not in ("auto", "bf16", "fp32"):
        raise SpecchatError(f"--precision must be auto, bf16 or fp32, not {precision}")
    check_dtype(dtype)
    check_output_dir(out)
    if not (data / "recipe.json").is_file():
        raise SpecchatError(f"{data} holds no training data; make it with `specchat train data --out {data}`")
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from specchat.training.trainer import TrainRecipe, bf16_autocast_pays

    loaded = _load(target, dtype, device)
    if precision == "auto":
        precision = "bf16" if bf16_autocast_pays(loaded.model.device) else "fp32"
    recipe = TrainRecipe(epochs=epochs, batch=batch, lr=lr, seed=seed or 0, autocast=precision == "bf16",
                         **(recipe_options or {}))  # fmt: skip
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"), TimeRemainingColumn())
    with Progress(*columns, transient=False) as bar:

        def stage(name: str, total: int):
            task = bar.add_task(name, total=total or None, info="")
            return lambda count: bar.update(task, advance=count, info=f"{bar.tasks[task].completed:,.0f}/{total:,} tokens")

        train_task = None

        def show(now):
            nonlocal train_task
            if train_task is None:
                train_task = bar.add_task("training", total=now.steps, info="")
            last = now.log[-1] if now.log else {}
            heldout = f" · held-out tau {last['heldout_chain_tau']:.2f}" if last else ""
            bar.update(train_task, completed=now.step,
                       info=f"step {now.step}/{now.steps} · loss {now.loss:.3f} · {now.tokens_per_second:.0f} tok/s{heldout}")  # fmt: skip

        return run_training(loaded, data, out, recipe, vocab=vocab, resume=resume, checkpoint_minutes=checkpoint_minutes,
                            stage=stage, progress=show, **options)  # fmt: skip


bench_app = typer.Typer(help="Benchmarks: speculative vs autoregressive vs transformers, same run.")
app.add_typer(bench_app, name="bench")


def _csv(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


@bench_app.callback(invoke_without_command=True)
def bench(
    ctx: typer.Context,
    model: ModelOption = None,
    drafter: Annotated[
        str, typer.Option("--drafter", help="Comma-separated drafters to compare with AR (always measured).")
    ] = DEFAULT_DRAFTER,
    draft_budget: BudgetOption = None,
    draft_cache: Annotated[
        str | None,
        typer.Option("--draft-cache", help="Comma-separated: the model and longspec drafters are measured under each "
                     "(rows named like model@streaming)."),
    ] = None,  # fmt: skip
    prompt_set: Annotated[
        str, typer.Option("--prompt-set", help=f"Comma-separated: {', '.join(PROMPT_SET_NAMES)}.")
    ] = "chat,code,summarize",
    prompts: Annotated[Path | None, typer.Option("--prompts", help='JSONL file of {"prompt": ...} lines.')] = None,
    baseline: Annotated[
        str | None,
        typer.Option(
            "--baseline",
            help="Comma-separated: hf (transformers generate rows), llamacpp (llama.cpp on the same GGUF, "
            "when llama-cpp-python is installed).",
        ),
    ] = None,
    dtype: Annotated[
        str, typer.Option(help="Comma-separated dtypes, each measured in turn (auto: the CPU's quantized default).")
    ] = "auto,float32",
    quantize: QuantizeOption = None,
    device: DeviceOption = "auto",
    attention: AttentionOption = "auto",
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n")] = 128,
    repeats: Annotated[int, typer.Option(help="Interleaved repetitions after the warm-up.")] = 2,
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False,
    plot: Annotated[Path | None, typer.Option("--plot", help="Also draw tokens/s and tau to this PNG.")] = None,
) -> None:
    """Greedy decoding speed of each drafter against autoregressive decoding (and transformers)."""
    if ctx.invoked_subcommand is not None:
        return
    from specchat.bench.prompts import load_prompt_sets

    methods = _csv(drafter)
    choices = _check_drafters(methods, draft_budget)
    if draft_cache is not None:
        methods = _with_draft_caches(methods, choices, _csv(draft_cache))
    check_attention(attention)
    if plot is not None:
        if not plot.parent.is_dir() or not os.access(plot.parent, os.W_OK):
            raise SpecchatError(f"--plot: cannot write into {plot.parent}")
        from specchat.bench.plot import plot_rows  # fails now, not after the run, when matplotlib is missing
    baselines = _csv(baseline or "")
    for name in baselines:
        if name not in ("hf", "llamacpp"):
            raise SpecchatError(f"unknown baseline '{name}'; use hf, llamacpp")
    check_quantize(quantize, device)
    if max_new_tokens < 1 or repeats < 1:
        raise SpecchatError("--max-new-tokens and --repeats must be at least 1")
    sets = load_prompt_sets(_csv(prompt_set), prompts)
    from specchat.bench.compare import compare
    from specchat.bench.runs import HF_METHODS

    if "hf" in baselines:
        methods += HF_METHODS
    llamacpp = None
    if "llamacpp" in baselines:
        from specchat.bench.llamacpp import LlamaCpp

        llamacpp = LlamaCpp.for_model(model)
    rows = []
    from specchat.bench.progress import bench_progress

    dtypes = _csv(dtype)
    runs = 1 + repeats * sum(map(len, sets.values()))  # per method and dtype: the warm-up, then every prompt
    total = len(dtypes) * (1 + len(set(methods) | {"none"}) * runs) + (runs if llamacpp else 0)  # loads included
    with bench_progress(total) as step:
        for each_dtype in dtypes:
            step(f"loading {model or 'the default model'} ({each_dtype})")
            loaded = _load(model, each_dtype, device, attention, quantize)
            rows += compare(
                loaded, sets, methods, max_new_tokens=max_new_tokens, repeats=repeats, draft_budget=draft_budget,
                llamacpp=llamacpp, step=lambda what, d=each_dtype: step(f"{d} · {what}"),
            )  # fmt: skip
            llamacpp = None  # measured once, beside the first dtype
    title = f"{loaded.source.name}, greedy, decode tokens/s"
    _report([row.as_dict() for row in rows], as_json, title=title, table=[row.as_table_row() for row in rows])
    if plot is not None:
        plot_rows([row.as_dict() for row in rows], plot, title=title)


@bench_app.command("context")
def bench_context(
    model: ModelOption = None,
    contexts: Annotated[str, typer.Option("--context", help="Comma-separated context lengths.")] = "256,4096",
    steps: Annotated[int, typer.Option(help="Decode steps timed per context.")] = 32,
    repeats: Annotated[int, typer.Option()] = 3,
    dtype: DtypeOption = "auto",
    device: DeviceOption = "auto",
    attention: AttentionOption = "auto",
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Autoregressive time per token as the context grows (only attention cost should grow)."""
    from specchat.bench.context import decode_cost

    try:
        lengths = [int(c) for c in _csv(contexts)]
    except ValueError:
        raise SpecchatError(f"--context takes comma-separated integers, not '{contexts}'") from None
    check_attention(attention)
    check_dtype(dtype)
    loaded = _load(model, dtype, device, attention)
    window = loaded.model.config.max_position_embeddings
    if not lengths or min(lengths) < 1 or max(lengths) + steps + 1 > window:
        raise SpecchatError(f"each context must be between 1 and {window - steps - 1} tokens")
    from specchat.bench.progress import bench_progress

    with bench_progress(len(lengths) * (repeats + 1)) as step:
        rows = decode_cost(loaded, lengths, steps=steps, repeats=repeats, step=step)
    weights = f"{loaded.weights}/{loaded.dtype}" if loaded.weights else loaded.dtype
    _report(rows, as_json, title=f"{loaded.source.name} {weights}\nms per AR token")


@bench_app.command("attention")
def bench_attention(
    contexts: Annotated[
        str, typer.Option("--context", help="Comma-separated committed lengths before the tree.")
    ] = "4096,16384,32768,131072",
    tree: Annotated[int, typer.Option(help="Draft-tree nodes; the call has tree + 1 query rows.")] = 64,
    heads: Annotated[int, typer.Option(help="Query heads.")] = 32,
    kv_heads: Annotated[int, typer.Option("--kv-heads", help="KV heads (GQA).")] = 8,
    head_dim: Annotated[int, typer.Option("--head-dim")] = 128,
    dtype: Annotated[str, typer.Option(help="float32 | bfloat16 | float16.")] = "bfloat16",
    device: DeviceOption = "auto",
    repeats: Annotated[int, typer.Option(help="Timed calls per method (median).")] = 20,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """One attention call of a tree verification: hybrid vs SDPA with a dense mask, eager and FlexAttention,
    plus the prefix part's bandwidth. The defaults are GPU sizes: on a CPU pass e.g. --context 1024,4096."""
    from specchat.bench.attention import attention_bench

    from specchat.bench.progress import bench_progress

    lengths = _ints(contexts, "--context")
    with bench_progress(len(lengths)) as step:
        rows = attention_bench(
            contexts=lengths, tree=tree, heads=heads, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype,
            device=device, repeats=repeats, step=step,
        )  # fmt: skip
    title = (
        f"attention per call, {dtype}: root + {tree} tree nodes, {heads} query / {kv_heads} KV heads x {head_dim}"
        " (vs_sdpa = SDPA-with-mask time / this time)"
    )
    _report([dataclasses.asdict(row) for row in rows], as_json, title=title)


@bench_app.command("verify-cost")
def bench_verify_cost(
    model: ModelOption = None,
    contexts: Annotated[str, typer.Option("--context", help="Comma-separated context lengths.")] = "4096,32768",
    trees: Annotated[str, typer.Option("--tree", help="Comma-separated draft-tree sizes (0: a decode step).")] = "64",
    layers: Annotated[int, typer.Option(help="Without --model: decoder layers to build (fewer for CPU runs).")] = 32,
    dtype: Annotated[str, typer.Option(help="auto | float32 | bfloat16 | float16.")] = "auto",
    device: DeviceOption = "auto",
    attention: AttentionOption = "auto",
    repeats: Annotated[int, typer.Option(help="Timed forwards of each kind (median).")] = 5,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Decode vs tree-verification forwards at each context: of --model through the engine's own forward, else
    of a random-weight model with Llama-3.1-8B's shapes (on a CPU pass e.g. --layers 2 --context 1024,4096)."""
    from specchat.bench.verify_cost import model_verify_cost, verify_cost

    lengths, sizes = _ints(contexts, "--context"), _ints(trees, "--tree")
    check_attention(attention)
    _quiet_transformers()
    if model is not None:
        from specchat.engine.generate import Engine

        loaded = _load(model, dtype, device, attention)
        engine = Engine(loaded.model, loaded.tokenizer, max_len=max(lengths) + max(sizes) + 1)
        rows = model_verify_cost(engine, contexts=lengths, trees=sizes, repeats=repeats)
        title = f"{loaded.source.name} ({loaded.weights}, {loaded.dtype}): ms per forward over the root + nodes"
        _report([dataclasses.asdict(row) for row in rows], as_json, title=title)
        return
    from specchat.bench.progress import bench_progress

    dtype = "bfloat16" if dtype == "auto" else dtype
    with bench_progress(len(lengths) * len(sizes)) as step:
        rows = [row for tree in sizes for row in verify_cost(contexts=lengths, tree=tree, layers=layers, dtype=dtype,
                                                             device=device, attention=attention, repeats=repeats,
                                                             step=step)]  # fmt: skip
    shape = "Llama-3.1-8B shapes" if layers == 32 else f"Llama-3.1-8B shapes but {layers} of 32 layers"
    title = f"{shape}, random weights, {dtype}: ms per forward (decode: 1 token; verify: root + tree nodes)"
    _report([dataclasses.asdict(row) for row in rows], as_json, title=title)


@bench_app.command("draft")
def bench_draft(
    model: ModelOption = None,
    shapes: Annotated[
        str | None, typer.Option(help="llama3.1-8b: a random-weight target of those shapes instead of --model.")
    ] = None,
    layers: Annotated[int, typer.Option(help="With --shapes: decoder layers to build (fewer for CPU runs).")] = 32,
    contexts: Annotated[str, typer.Option("--context", help="Comma-separated context lengths.")] = "1024,6144",
    vocabs: Annotated[
        str, typer.Option("--vocab", help="Comma-separated draft vocabulary sizes (0 = the target's whole one).")
    ] = "0,16384,8192",
    budgets: Annotated[str, typer.Option("--budget", help="Comma-separated tree budgets.")] = "7,15,63",
    dtype: DtypeOption = "auto",
    device: DeviceOption = "auto",
    attention: AttentionOption = "auto",
    repeats: Annotated[int, typer.Option(help="Timed calls of each kind (median).")] = 5,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """A random-weight LongSpec draft's cost per proposal (beam) against the target's decode and verify
    forwards, and its memory, by context and draft vocabulary. GPU: --shapes llama3.1-8b --dtype bfloat16."""
    lengths, sizes, trees = _ints(contexts, "--context"), _ints(vocabs, "--vocab"), _ints(budgets, "--budget")
    check_attention(attention)
    if shapes not in (None, "llama3.1-8b"):
        raise SpecchatError(f"unknown --shapes '{shapes}'; use llama3.1-8b")
    _quiet_transformers()
    from specchat.bench.draft_cost import draft_cost

    if shapes:
        from specchat.bench.synthetic import torch_device, torch_dtype
        from specchat.bench.verify_cost import llama31_8b_config, random_model, with_layers

        float_type = torch_dtype("bfloat16" if dtype == "auto" else dtype)
        target = random_model(with_layers(llama31_8b_config(), layers), float_type, torch_device(device), attention)
        name = f"random Llama-3.1-8B shapes, {layers} layers, {float_type}".replace("torch.", "")
    else:
        loaded = _load(model, dtype, device, attention)
        target, name = loaded.model, f"{loaded.source.name} {loaded.weights}/{loaded.dtype}"
    from specchat.bench.progress import bench_progress

    with bench_progress(len(lengths) * len(sizes) * len(trees)) as step:
        rows = draft_cost(target, contexts=lengths, vocabs=sizes, budgets=trees, repeats=repeats, step=step)
    _report([dataclasses.asdict(row) for row in rows], as_json, title=f"random LongSpec draft on {name}: ms per call")


def _ints(value: str, flag: str) -> list[int]:
    try:
        return [int(item) for item in _csv(value)]
    except ValueError:
        raise SpecchatError(f"{flag} takes comma-separated integers, not '{value}'") from None


def _check_drafters(names: list[str], draft_budget: int | None) -> list[DrafterChoice]:
    from specchat.engine.budget import MAX_BUDGET

    choices = [parse_drafter(name) for name in names]
    if draft_budget is not None and not 1 <= draft_budget <= MAX_BUDGET:
        raise SpecchatError(f"--draft-budget must be between 1 and {MAX_BUDGET}")
    if draft_budget is not None and {choice.name for choice in choices} == {"none"}:
        raise SpecchatError("--draft-budget needs a drafter (--drafter none decodes autoregressively)")
    return choices


def _with_draft_caches(methods: list[str], choices: list[DrafterChoice], caches: list[str]) -> list[str]:
    """Each drafter that reads a draft cache, once per cache ("model@streaming"), after the others."""
    readers = [method for method, choice in zip(methods, choices) if reads_draft_cache(choice)]
    for cache in caches:
        check_draft_cache(cache, parse_drafter(readers[0]) if readers else choices[0])
    return [m for m in methods if m not in readers] + [f"{m}@{cache}" for m in readers for cache in caches]


def _cached(repo: str) -> bool:
    """Whether a profile's checkpoint is here: shipped with specchat, or in the Hugging Face cache."""
    from huggingface_hub import try_to_load_from_cache

    from specchat.drafters import bundled_checkpoint

    if repo.endswith(".gguf"):
        from specchat.loading import find_gguf

        return find_gguf(repo, download=False) is not None
    bundled = bundled_checkpoint(repo)
    if bundled is not None:
        return (bundled / "config.json").is_file()
    return isinstance(try_to_load_from_cache(repo, "config.json"), str)


def _load(model: str | None, dtype: str, device: str, attention: str = "auto", quantize: str | None = None):
    _quiet_transformers()
    from specchat.loading import load_model

    return load_model(model, dtype=dtype, quantize=quantize, device=device, attention=attention)


def _report(rows: list[dict], as_json: bool, *, title: str, table: list[dict] | None = None) -> None:
    """`rows` as JSON, or as a table (`table`: the same rows as they read best, when given)."""
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    from rich import box
    from rich.console import Console
    from rich.table import Table

    shown = table or rows
    grid = Table(*shown[0].keys(), title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for row in shown:
        grid.add_row(*("-" if v is None else str(v) for v in row.values()))
    Console().print(grid)


def _checked_overrides(dtype: str, attention: str, **sampling) -> dict:
    """Reject bad load and sampling options before anything slow runs; returns the sampling overrides."""
    check_attention(attention)
    check_dtype(dtype)
    _sampling_config({}, sampling)
    return sampling


FLAGS = {"top_k": "--top-k", "top_p": "--top-p", "min_p": "--min-p", "penalty": "--repetition-penalty",
         "temperature": "--temperature", "seed": "--seed"}  # fmt: skip


def _sampling_config(defaults: dict, overrides: dict, flags: dict[str, str] = FLAGS):
    from specchat.engine.sampling_config import SamplingConfig

    values = {**defaults, **{k: v for k, v in overrides.items() if v is not None}}
    names = {f.name for f in dataclasses.fields(SamplingConfig)}
    try:
        return SamplingConfig(**{k: v for k, v in values.items() if k in names})
    except ValueError as error:  # "top_p must be ..." -> "--top-p must be ..."
        field, _, rest = str(error).partition(" ")
        raise SpecchatError(f"{flags.get(field, field)} {rest}") from None


def _quiet_transformers() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()


def main() -> None:
    """Entry point: user errors become one line on stderr and a non-zero exit, never a traceback."""
    if sys.argv[1:2] == ["chat"]:
        from specchat.tui.typeahead import hold_typed_keys

        hold_typed_keys()
    try:
        status = app(standalone_mode=False)  # typer turns Ctrl-C into a returned 130
        if status == 130:
            raise KeyboardInterrupt
        if isinstance(status, int) and status:
            sys.exit(status)
    except SpecchatError as error:
        typer.echo(f"error: {error}", err=True)
        sys.exit(1)
    except click_errors.NoArgsIsHelpError:
        pass  # the help is already printed
    except click_errors.UsageError as error:  # a bad flag or value: one line too, exit status 2 as click's
        typer.echo(f"error: {error.format_message()} (see --help)", err=True)
        sys.exit(2)
    except (KeyboardInterrupt, typer.Abort):
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except OSError as error:  # the output cannot be written: a full disk, a closed pipe elsewhere than `run`
        with contextlib.suppress(OSError):
            sys.stderr.write(f"error: cannot write the output: {error.strerror or error}\n")
        os._exit(1)  # no flush of the broken stream at exit
