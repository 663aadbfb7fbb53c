"""`specchat serve`: the OpenAI HTTP API (and Ollama's, llama-server's) over the engine."""

from __future__ import annotations

from typing import Annotated

import typer

from specchat.chat_template import read_chat_template
from specchat.checks import check_kv_cache, check_quantize, check_yarn
from specchat.cli.common import (
    AttentionOption,
    BudgetOption,
    ChatTemplateOption,
    DeviceOption,
    DraftCacheOption,
    DrafterOption,
    DtypeOption,
    KvCacheOption,
    ModelOption,
    QuantizeOption,
    ThreadsOption,
    YarnOption,
    app,
    check_drafters,
    checked_overrides,
    default_drafter,
    quiet_transformers,
    use_threads,
)
from specchat.drafters import check_draft_cache
from specchat.errors import SpecchatError


@app.command()
def serve(
    model: ModelOption = None,
    drafter: DrafterOption = None,
    draft_budget: BudgetOption = None,
    draft_cache: DraftCacheOption = None,
    host: Annotated[str, typer.Option(help="Address to listen on (0.0.0.0: every interface).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: a free one, printed).")] = 8000,
    api_key: Annotated[str | None, typer.Option("--api-key", envvar="SPECCHAT_API_KEY",
                                                help="Require `Authorization: Bearer KEY`.")] = None,  # fmt: skip
    context: Annotated[int, typer.Option(
        "--context", help="Most tokens a request may hold, prompt and answer.")] = 8192,
    max_queue: Annotated[int, typer.Option("--max-queue", help="Requests that may wait; more get 429.")] = 32,
    max_body_mb: Annotated[float, typer.Option("--max-body-mb", help="Largest request body; larger get 413.")] = 4.0,
    prompt_cache: Annotated[bool | None, typer.Option(
        "--prompt-cache/--no-prompt-cache", help="Reuse the cached prefix a prompt shares with the last one, so a "
        "conversation's next turn prefills only what is new. Default: on where it is exact (the CPU decoder: "
        "answers stay `specchat run`'s), off elsewhere, where forcing it on may change a greedy token by a "
        "rounding.", show_default=False)] = None,  # fmt: skip
    prompt_cache_mb: Annotated[float, typer.Option(
        "--prompt-cache-mb", help="With the prompt cache: memory for earlier texts' cached prefixes, kept so that "
        "a client coming back after others finds its own (0: the last text's alone).")] = 1024,
    dtype: DtypeOption = "auto",
    kv_cache: KvCacheOption = "auto",
    quantize: QuantizeOption = None,
    yarn: YarnOption = None,
    chat_template: ChatTemplateOption = None,
    device: DeviceOption = "auto",
    threads: ThreadsOption = None,
    attention: AttentionOption = "auto",
) -> None:
    """Serve the OpenAI API (chat completions, completions, models), and Ollama's, with exact speculative decoding."""
    use_threads(threads)
    drafter = drafter or default_drafter(model)
    [choice] = check_drafters([drafter], draft_budget)
    if draft_cache is not None:
        check_draft_cache(draft_cache, choice)
    checked_overrides(dtype, attention)
    template = read_chat_template(chat_template) if chat_template is not None else None
    check_quantize(quantize, device)
    check_yarn(yarn)
    check_kv_cache(kv_cache)
    if not 0 <= port <= 65535:
        raise SpecchatError("--port must be between 0 and 65535")
    if context < 16 or max_queue < 1 or not max_body_mb > 0:
        raise SpecchatError("--context must be at least 16, --max-queue at least 1 and --max-body-mb above 0")
    if not prompt_cache_mb >= 0:
        raise SpecchatError("--prompt-cache-mb must be 0 or more")
    if api_key is not None and not api_key.strip():
        raise SpecchatError("--api-key is empty")
    quiet_transformers()
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
        quantize=quantize, device=device, attention=attention, prompt_cache=prompt_cache, kv_cache=kv_cache,
        prompt_cache_bytes=int(prompt_cache_mb * 2**20), yarn=yarn,
        chat_template=(str(chat_template), template) if template is not None else None,
    ))  # fmt: skip
