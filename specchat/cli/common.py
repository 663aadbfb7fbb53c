"""The `specchat` typer app, the options several commands share, and the checks they run before anything
slow (none imports torch)."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
from pathlib import Path
from typing import Annotated

import typer

from specchat.answer_format import AnswerFormat, read_grammar, read_schema
from specchat.checks import check_dtype
from specchat.drafters import DEFAULT_DRAFTER, NAMES, DrafterChoice, parse_drafter
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


def _print_version(asked: bool) -> None:
    """`specchat --version`: ours and torch's, read from the installed packages' metadata (no import of torch)."""
    if asked:
        from importlib.metadata import version

        typer.echo(f"specchat {version('specchat')} (torch {version('torch')}, Python {platform.python_version()})")
        raise typer.Exit()


@app.callback()
def _options(
    _version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                           help="Print the version and exit.")] = False,  # fmt: skip
) -> None:
    """Fast, exact LLM generation with tree speculative decoding."""

ModelOption = Annotated[
    str | None,
    typer.Option("--model", "-m", help="Profile alias, Hugging Face repo id, local directory, GGUF file (by any "
                 "name), or a model ollama has pulled (llama3.2:3b)."),
]  # fmt: skip
DrafterOption = Annotated[
    str | None,
    typer.Option(
        "--drafter", "-d", help=f"Drafter: {' | '.join(NAMES)} (default: the model's fastest, as measured, "
        f"{DEFAULT_DRAFTER} without a profile); NAME:DIR for a local checkpoint; A+B merges two."
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
KvCacheOption = Annotated[
    str,
    typer.Option("--kv-cache", help="auto | bf16 | int8. auto: bf16 beside fp32 activations on quantized weights "
                 "(a GGUF file's, as llama.cpp's f16 cache), else the activations' dtype; int8: each key and value "
                 "quantized when written, half bf16's bytes (bf16 and int8: the CPU decoder)."),
]  # fmt: skip
QuantizeOption = Annotated[
    str | None,
    typer.Option("--quantize", callback=lambda value: value and value.lower(),
                 help="q4_k_m | q8_0 | int4 | int8: a checkpoint's (or an F32 / F16 / BF16 GGUF file's) weights "
                 "quantized as it loads (CPU). q4_k_m / q8_0: GGUF blocks as llama-quantize writes them, run on the "
                 "GGUF kernels; int4 / int8: torch's kernels."),
]
YarnOption = Annotated[
    float | None,
    typer.Option("--yarn", help="Stretch the model's window this many times with YaRN RoPE scaling, for texts longer "
                 "than it was trained on (Qwen2.5: 4 reads 131072 tokens); llama.cpp's --rope-scaling yarn."),
]  # fmt: skip
DeviceOption = Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N.")]
ThreadsOption = Annotated[
    int | None,
    typer.Option("--threads", help="CPU threads the model runs on (llama.cpp's -t; default: one per physical "
                 "core, on Intel's hybrid CPUs one per performance core).", show_default=False),
]  # fmt: skip
AttentionOption = Annotated[
    str,
    typer.Option(help=f"{' | '.join(ATTENTION_CHOICES)}: canonical is the compiled CPU decoder's (Llama-family "
                 "models and Gemma 3 and 2 on a CPU), hybrid the torch decoder's (Triton kernels on a GPU); auto: "
                 "canonical on a CPU where it runs (fp32 on x86 too; Gemma: always), else hybrid."),
]
TemperatureOption = Annotated[float | None, typer.Option("--temperature", "-t", help="0 = greedy.")]
TopKOption = Annotated[int | None, typer.Option("--top-k", help="Sample among the k likeliest tokens (0: all).")]
TopPOption = Annotated[float | None, typer.Option("--top-p", help="Sample among the likeliest tokens summing to p.")]
MinPOption = Annotated[float | None, typer.Option("--min-p", help="Drop tokens below p times the likeliest's chance.")]
PenaltyOption = Annotated[float | None, typer.Option(
    "--repetition-penalty", help="Divide the logits of tokens already in the text by this (> 1 penalises).")]
FrequencyPenaltyOption = Annotated[float | None, typer.Option(
    "--frequency-penalty", help="Subtract this from a token's logit per time it is in the text (-2 to 2).")]
PresencePenaltyOption = Annotated[float | None, typer.Option(
    "--presence-penalty", help="Subtract this from the logit of a token already in the text (-2 to 2).")]
SeedOption = Annotated[int | None, typer.Option("--seed", help="Seed of the sampling (the same seed, the same text).")]
StopOption = Annotated[list[str] | None, typer.Option(
    "--stop", help="Stop string (repeatable; default: an ollama model's own).", show_default=False)]
SystemOption = Annotated[str | None, typer.Option(
    "--system", help="System prompt (default: none, or the SYSTEM of a model ollama holds).", show_default=False)]
ChatTemplateOption = Annotated[Path | None, typer.Option(
    "--chat-template", help="A Jinja chat template file to use instead of the model's own (llama.cpp's "
    "--chat-template-file).", show_default=False)]
FormatOption = Annotated[
    str, typer.Option("--format", help="text | json: json holds every answer to one JSON object (JSON mode).")
]
SchemaOption = Annotated[
    Path | None, typer.Option("--schema", help="A JSON Schema file every answer must follow (JSON mode).")
]
GrammarOption = Annotated[str | None, typer.Option(
    "--grammar", help="A GBNF grammar (llama.cpp's format) every answer must follow.", show_default=False)]
GrammarFileOption = Annotated[Path | None, typer.Option(
    "--grammar-file", help="A file holding a GBNF grammar every answer must follow.", show_default=False)]


def csv_list(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def ints(value: str, flag: str) -> list[int]:
    try:
        return [int(item) for item in csv_list(value)]
    except ValueError:
        raise SpecchatError(f"{flag} takes comma-separated integers, not '{value}'") from None


def default_system(model: str | None) -> str | None:
    """The system prompt a model ollama holds gives every conversation (its Modelfile's SYSTEM), else None."""
    from specchat.ollama_models import ollama_system

    return ollama_system(model) if model else None


def stop_strings(stop: list[str] | None, model: str | None) -> tuple[str, ...]:
    """--stop's strings, else those a model ollama holds ends its answers at (its Modelfile's `PARAMETER stop`)."""
    if any(not each for each in stop or ()):
        raise SpecchatError("--stop takes a non-empty string")
    if stop:
        return tuple(stop)
    from specchat.ollama_models import ollama_stop

    return ollama_stop(model) if model else ()


def default_drafter(model: str | None) -> str:
    """The drafter a model's profile names as measured fastest on it (`drafter` in its toml), else n-gram
    (read without torch: options are checked before it loads)."""
    from specchat.profiles import profile_of

    profile = profile_of(model)
    return profile.drafter if profile else DEFAULT_DRAFTER


def check_drafters(names: list[str], draft_budget: int | None) -> list[DrafterChoice]:
    from specchat.engine.budget import MAX_BUDGET

    choices = [parse_drafter(name) for name in names]
    if draft_budget is not None and not 1 <= draft_budget <= MAX_BUDGET:
        raise SpecchatError(f"--draft-budget must be between 1 and {MAX_BUDGET}")
    if draft_budget is not None and {choice.name for choice in choices} == {"none"}:
        raise SpecchatError("--draft-budget needs a drafter (--drafter none decodes autoregressively)")
    return choices


def use_threads(threads: int | None) -> None:
    """Run the model's CPU work on `threads` threads (by default one per physical core, performance cores only on a
    hybrid CPU: `cpu_cores`): torch's intra-op pool, which the CPU decoder's kernels share."""
    if threads is not None and threads < 1:
        raise SpecchatError(f"--threads must be at least 1, not {threads}")
    from specchat.cpu_cores import performance_cores

    threads = threads or performance_cores()
    if threads is None:
        return
    import torch

    torch.set_num_threads(threads)


def load(model: str | None, dtype: str, device: str, attention: str = "auto", quantize: str | None = None,
         yarn: float | None = None):  # fmt: skip
    quiet_transformers()
    from specchat.loading import load_model

    return load_model(model, dtype=dtype, quantize=quantize, device=device, attention=attention, yarn=yarn)


def report(rows: list[dict], as_json: bool, *, title: str, table: list[dict] | None = None) -> None:
    """`rows` as JSON, or as a table (`table`: the same rows as they read best, when given)."""
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    from rich import box
    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Table

    shown = table or rows
    grid = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for header in shown[0]:
        grid.add_column(header, overflow="fold")  # a narrow terminal wraps a name rather than cutting it
    for row in shown:
        grid.add_row(*("-" if v is None else str(v) for v in row.values()))
    console = Console()
    if not console.is_terminal:  # a file or a pipe: the table at its own width, whatever the 80 columns assumed
        natural = Measurement.get(console, console.options.update_width(10_000), grid).maximum
        console = Console(width=max(console.width, natural))
    console.print(grid)


def checked_overrides(dtype: str, attention: str, **sampling) -> dict:
    """Reject bad load and sampling options before anything slow runs; returns the sampling overrides."""
    check_attention(attention)
    check_dtype(dtype)
    sampling_config({}, sampling)
    return sampling


FLAGS = {"top_k": "--top-k", "top_p": "--top-p", "min_p": "--min-p", "penalty": "--repetition-penalty",
         "frequency_penalty": "--frequency-penalty", "presence_penalty": "--presence-penalty",
         "temperature": "--temperature", "seed": "--seed"}  # fmt: skip


def sampling_config(defaults: dict, overrides: dict, flags: dict[str, str] = FLAGS):
    from specchat.engine.sampling_config import SamplingConfig

    values = {**defaults, **{k: v for k, v in overrides.items() if v is not None}}
    names = {f.name for f in dataclasses.fields(SamplingConfig)}
    try:
        return SamplingConfig(**{k: v for k, v in values.items() if k in names})
    except ValueError as error:  # "top_p must be ..." -> "--top-p must be ..."
        field, _, rest = str(error).partition(" ")
        raise SpecchatError(f"{flags.get(field, field)} {rest}") from None


def quiet_transformers() -> None:
    """transformers' warnings and progress bars off, without importing it (a GGUF model's launch never does): through
    the environment it reads when imported, or its own switches once it is."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if "transformers" not in sys.modules:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        return
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()


def answer_format(text_format: str, schema: Path | None, grammar: str | None = None,
                  grammar_file: Path | None = None) -> AnswerFormat:  # fmt: skip
    """`--format`, `--schema`, `--grammar` and `--grammar-file` checked: what every answer is held to."""
    if text_format not in ("text", "json"):
        raise SpecchatError(f"--format must be text or json, not {text_format!r}")
    if grammar is not None or grammar_file is not None:
        if text_format == "json" or schema is not None or grammar is not None and grammar_file is not None:
            raise SpecchatError("give one of --format json, --schema, --grammar and --grammar-file")
        return AnswerFormat(grammar=read_grammar(grammar, grammar_file))
    return AnswerFormat(json=text_format == "json" or schema is not None,
                        schema=read_schema(schema) if schema is not None else None)  # fmt: skip
