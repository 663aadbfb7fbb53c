"""`specchat chat`: the terminal chat app."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from specchat.chat_template import read_chat_template, use_chat_template
from specchat.checks import check_prompt_cache, check_quantize, check_yarn
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


@app.command()
def chat(
    model: ModelOption = None,
    drafter: DrafterOption = None,
    draft_budget: BudgetOption = None,
    draft_cache: DraftCacheOption = None,
    system: SystemOption = None,
    chat_template: ChatTemplateOption = None,
    temperature: TemperatureOption = None,
    top_k: TopKOption = None,
    top_p: TopPOption = None,
    min_p: MinPOption = None,
    repetition_penalty: PenaltyOption = None,
    frequency_penalty: FrequencyPenaltyOption = None,
    presence_penalty: PresencePenaltyOption = None,
    seed: SeedOption = None,
    stop: StopOption = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", help="Most tokens per answer.")] = 1024,
    context: Annotated[
        int | None, typer.Option("--context", help="Most tokens the conversation may hold (default 8192).")
    ] = None,
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
    prompt_cache: Annotated[Path | None, typer.Option(
        "--prompt-cache", help="A file the conversation's keys and values are kept in after each answer: a later chat "
        "(a document pasted first again, a /load of this one) reads the prefix it shares instead of prefilling it (CPU "
        "decoder).", show_default=False)] = None,
) -> int:
    """Chat in the terminal: accepted draft tokens are coloured as they stream, with live acceptance figures."""
    use_threads(threads)
    drafter = drafter or default_drafter(model)
    [choice] = check_drafters([drafter], draft_budget)
    if draft_cache is not None:
        check_draft_cache(draft_cache, choice)
    template = read_chat_template(chat_template) if chat_template is not None else None
    overrides = checked_overrides(
        dtype, attention, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
        penalty=repetition_penalty, frequency_penalty=frequency_penalty, presence_penalty=presence_penalty, seed=seed,
    )  # fmt: skip
    from specchat.loading import decoding_defaults, load_model, resolve_device, resolve_model
    from specchat.tui.session import ChatSettings, check_settings

    settings = ChatSettings(
        drafter=drafter, draft_budget=draft_budget, draft_cache=draft_cache,
        system=system if system is not None else default_system(model), stop=stop_strings(stop, model),
        max_new_tokens=max_new_tokens, context=context, kv_cache=kv_cache,
        format=answer_format(text_format, schema, grammar, grammar_file),
    )  # fmt: skip
    check_settings(settings)
    check_quantize(quantize, device)
    check_yarn(yarn)
    if prompt_cache is not None:
        check_prompt_cache(prompt_cache)
    resolve_model(model)  # fail fast, before the app starts
    resolve_device(device)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise SpecchatError("chat needs a terminal; for scripts use `specchat run`")
    quiet_transformers()
    from specchat.engine.target_forward import canonical
    from specchat.tui.app import ChatApp

    def loader(progress):
        loaded = load_model(
            model, dtype=dtype, quantize=quantize, device=device, attention=attention, yarn=yarn, progress=progress
        )
        if template is not None:
            use_chat_template(loaded.tokenizer, template, chat_template)
        if prompt_cache is not None and not canonical(loaded.model):
            raise SpecchatError("--prompt-cache needs the CPU decoder (--attention canonical), where keys and values "
                                "read back are bitwise a new prefill's")  # fmt: skip
        return loaded, sampling_config(decoding_defaults(loaded), overrides)

    chat_app = ChatApp(loader, settings, prompt_cache)
    chat_app.run()
    if chat_app.error is not None:
        typer.echo(f"error: {chat_app.error}", err=True)
    return 1 if chat_app.error is not None else 0
