"""`specchat run`: one answer to a prompt, streamed or as a JSON report."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import sys
from pathlib import Path
from typing import Annotated

import typer

from specchat.chat_template import read_chat_template, use_chat_template
from specchat.checks import check_kv_cache, check_prompt_cache, check_quantize, check_yarn
from specchat.cli.common import (
    AttentionOption,
    BudgetOption,
    ChatTemplateOption,
    DeviceOption,
    DraftCacheOption,
    DrafterOption,
    DtypeOption,
    FormatOption,
    FrequencyPenaltyOption,
    GrammarFileOption,
    GrammarOption,
    KvCacheOption,
    MinPOption,
    ModelOption,
    PenaltyOption,
    PresencePenaltyOption,
    QuantizeOption,
    SchemaOption,
    SeedOption,
    StopOption,
    SystemOption,
    TemperatureOption,
    ThreadsOption,
    TopKOption,
    TopPOption,
    YarnOption,
    answer_format,
    app,
    check_drafters,
    checked_overrides,
    default_drafter,
    default_system,
    quiet_transformers,
    sampling_config,
    stop_strings,
    use_threads,
)
from specchat.drafters import check_draft_cache
from specchat.errors import SpecchatError
from specchat.fill_in_middle import Infill, infill_ids

MAX_LOGPROBS = 20  # alternatives a token's log-probability lists, as OpenAI's top_logprobs


@app.command()
def run(
    prompt: Annotated[str, typer.Argument(help="The prompt; '-' reads it from stdin.")],
    model: ModelOption = None,
    drafter: DrafterOption = None,
    draft_budget: BudgetOption = None,
    draft_cache: DraftCacheOption = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", help="Most tokens to generate.")] = 512,
    temperature: TemperatureOption = None,
    top_k: TopKOption = None,
    top_p: TopPOption = None,
    min_p: MinPOption = None,
    repetition_penalty: PenaltyOption = None,
    frequency_penalty: FrequencyPenaltyOption = None,
    presence_penalty: PresencePenaltyOption = None,
    seed: SeedOption = None,
    stop: StopOption = None,
    system: SystemOption = None,
    raw: Annotated[bool, typer.Option("--raw", help="Skip the chat template.")] = False,
    suffix: Annotated[str | None, typer.Option(
        "--suffix", help="Fill in the middle: PROMPT is the code before the cursor, this the code after it (a code "
        "model's FIM tokens, no chat template).", show_default=False)] = None,
    chat_template: ChatTemplateOption = None,
    text_format: FormatOption = "text",
    schema: SchemaOption = None,
    grammar: GrammarOption = None,
    grammar_file: GrammarFileOption = None,
    dtype: DtypeOption = "auto",
    kv_cache: KvCacheOption = "auto",
    quantize: QuantizeOption = None,
    yarn: YarnOption = None,
    device: DeviceOption = "auto",
    threads: ThreadsOption = None,
    attention: AttentionOption = "auto",
    ignore_eos: Annotated[bool, typer.Option(
        "--ignore-eos", help="Never end the text: generate all --max-new-tokens (llama.cpp's --ignore-eos).")] = False,
    min_tokens: Annotated[int, typer.Option(
        "--min-tokens", help="Neither the end of text nor a --stop string ends the answer before this many tokens "
        "(vLLM's min_tokens).")] = 0,
    prompt_cache: Annotated[Path | None, typer.Option(
        "--prompt-cache", help="A file for the keys and values of the prompt and answer (llama.cpp's --prompt-cache "
        "with --prompt-cache-all): the prefix a prompt shares with the last text is read from it instead of "
        "prefilled; then it holds this one's (CPU decoder).", show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of streaming.")] = False,
    logprobs: Annotated[
        int | None,
        typer.Option("--logprobs", help="With --json: each token's log-probability and this many alternatives."),
    ] = None,
) -> None:
    """Generate a reply to PROMPT and print it (or a JSON report)."""
    use_threads(threads)
    prompt = _read_prompt(prompt)
    if max_new_tokens < 1:
        raise SpecchatError("--max-new-tokens must be at least 1")
    if suffix is not None and (system is not None or chat_template is not None):
        raise SpecchatError("--suffix fills in code without a chat template: drop --system and --chat-template")
    held = answer_format(text_format, schema, grammar, grammar_file)
    if ignore_eos and not held.free:
        raise SpecchatError(f"--ignore-eos with {held.label()}: a held text must end")
    if not 0 <= min_tokens <= max_new_tokens:
        raise SpecchatError(f"--min-tokens takes 0 to --max-new-tokens ({max_new_tokens}), not {min_tokens}")
    if min_tokens and not held.free:
        raise SpecchatError(f"--min-tokens with {held.label()}: a held text ends where it must")
    template = read_chat_template(chat_template) if chat_template is not None else None
    if prompt_cache is not None:
        check_prompt_cache(prompt_cache)
    if logprobs is not None and (not as_json or not 0 <= logprobs <= MAX_LOGPROBS):
        raise SpecchatError(f"--logprobs takes 0 to {MAX_LOGPROBS} alternatives, with --json")
    drafter = drafter or default_drafter(model)
    if system is None and suffix is None and not raw:
        system = default_system(model)
    stop = stop_strings(stop, model)
    [choice] = check_drafters([drafter], draft_budget)
    if draft_cache is not None:
        check_draft_cache(draft_cache, choice)
    overrides = checked_overrides(
        dtype, attention, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
        penalty=repetition_penalty, frequency_penalty=frequency_penalty, presence_penalty=presence_penalty, seed=seed,
    )  # fmt: skip
    check_quantize(quantize, device)
    check_yarn(yarn)
    check_kv_cache(kv_cache)
    quiet_transformers()
    from specchat.drafters import resolve_drafter
    from specchat.engine.generate import eos_ids
    from specchat.engine.prompt import encode_prompt
    from specchat.engine.target_forward import forward_path
    from specchat.loading import decoding_defaults, load_model, resolve_device, resolve_model
    from specchat.session import Session

    source = resolve_model(model)  # fail fast, before the slow imports and loads
    resolve_drafter(choice, source.profile, source.name)
    resolve_device(device)
    loaded = load_model(model, dtype=dtype, quantize=quantize, device=device, attention=attention, yarn=yarn)
    if template is not None:
        use_chat_template(loaded.tokenizer, template, chat_template)
    sampling = sampling_config(decoding_defaults(loaded), overrides)
    if not sampling.greedy and sampling.seed is None:  # drawn here to be reported: `--seed N` writes the text again
        sampling = dataclasses.replace(sampling, seed=secrets.randbits(62))
    if ignore_eos:
        sampling = dataclasses.replace(sampling, suppress=tuple(sorted(eos_ids(loaded.model, loaded.tokenizer))))
    if suffix is not None:
        prompt_ids = infill_ids(loaded.tokenizer, Infill(prompt, suffix), source.name)
    else:
        prompt_ids = encode_prompt(loaded.tokenizer, prompt, system=system, raw=raw)
    session = Session.over(loaded, max_len=len(prompt_ids) + max_new_tokens, drafter=choice,
                           draft_budget=draft_budget, draft_cache=draft_cache, kv_cache=kv_cache)  # fmt: skip
    engine, choice = session.engine, session.drafter
    if len(prompt_ids) >= engine.capacity:  # the model's window is what is short
        stretch = f"stretched {loaded.yarn:g} times by --yarn" if loaded.yarn else "--yarn F reads F times as many"
        raise SpecchatError(f"the prompt has {len(prompt_ids)} tokens; the context holds {engine.capacity}, the "
                            f"model's window ({stretch})")  # fmt: skip

    if prompt_cache is not None:
        if not engine.exact_reuse:
            raise SpecchatError("--prompt-cache needs the CPU decoder (--attention canonical), where keys and values "
                                "read back are bitwise a new prefill's")  # fmt: skip
        _read_text(engine, prompt_cache, prompt_ids)

    tokens, origins, scored, text, stats, finish = [], [], [], [], None, None
    try:
        for event in engine.generate(
            prompt_ids, sampling=sampling, max_new_tokens=max_new_tokens, stop=stop,
            constraint=held.constraint(engine), logprobs=logprobs, min_tokens=min_tokens,
        ):
            tokens += event.tokens
            origins += event.origins
            scored += event.logprobs or []
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
            "finish_reason": finish,
            **stats.as_json(),
            "model": loaded.source.name,
            "weights": loaded.weights,
            "dtype": loaded.dtype,
            "yarn": loaded.yarn,
            "drafter": str(choice),
            "forward": forward_path(loaded.model),
            "seed": sampling.seed,
        }
        if logprobs is not None:
            report["logprobs"] = _logprob_entries(engine, tokens, scored)
        _out(json.dumps(report, ensure_ascii=False) + "\n")
    else:
        _out("\n")
        budget_note = f" | budget {stats.mean_budget:.1f}" if choice.name != "none" and stats.steps else ""
        reused = f" ({stats.reused_tokens} cached)" if stats.reused_tokens else ""
        seed_note = "" if sampling.greedy else f" | seed {sampling.seed}"
        decode = (f"decode {stats.tokens_per_second:.1f} tok/s | tau {stats.mean_accepted_length:.2f}"
                  if stats.steps else "no decode step")  # fmt: skip
        typer.echo(
            f"[{stats.new_tokens} tokens ({finish}) | prefill {stats.prompt_tokens} tokens{reused} "
            f"{stats.prefill_seconds:.2f} s | {decode}{budget_note} | {loaded.source.name} "
            f"{loaded.weights}/{loaded.dtype}, drafter {choice}{seed_note}]",
            err=True,
        )
    if prompt_cache is not None:
        _keep_text(engine, prompt_cache)
    if finish == "interrupted":
        raise KeyboardInterrupt


def _read_text(engine, path: Path, prompt_ids: list[int]) -> None:
    """Hold what the prompt cache shares with the prompt; a file that cannot be read (cut short by a copy) costs
    this run its reuse, and the answer's text replaces it."""
    from specchat.engine.prompt_cache import read_prompt_cache

    try:
        read_prompt_cache(engine, path, prompt_ids)
    except OSError as error:
        typer.echo(f"warning: --prompt-cache {path} cannot be read ({error}); the prompt is prefilled", err=True)


def _keep_text(engine, path: Path) -> None:
    """Write the prompt cache after the answer: a failure (a full disk) costs the next run its reuse, not this
    run's answer."""
    from specchat.engine.prompt_cache import write_prompt_cache

    try:
        write_prompt_cache(engine, path)
    except OSError as error:
        typer.echo(f"warning: --prompt-cache {path} not written: {error.strerror or error}", err=True)


def _logprob_entries(engine, tokens: list[int], scored: list) -> list[dict]:
    """The report's `logprobs`, one entry a token, shaped as OpenAI's chat `logprobs.content` (without bytes)."""

    def text(token: int) -> str:
        return engine.token_bytes(token).decode("utf-8", errors="replace")

    return [{"token": text(token), "logprob": entry.logprob,
             "top_logprobs": [{"token": text(other), "logprob": value} for other, value in entry.top]}
            for token, entry in zip(tokens, scored)]  # fmt: skip


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
