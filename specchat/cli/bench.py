"""`specchat bench ...`: decoding speed against autoregressive decoding and other tools, and cost curves."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Annotated

import typer

from specchat.bench.prompts import PROMPT_SET_NAMES
from specchat.checks import check_dtype, check_kv_cache, check_quantize, check_yarn
from specchat.cli.common import (
    AttentionOption,
    BudgetOption,
    DeviceOption,
    DtypeOption,
    FormatOption,
    GrammarFileOption,
    GrammarOption,
    KvCacheOption,
    ModelOption,
    QuantizeOption,
    SchemaOption,
    ThreadsOption,
    YarnOption,
    answer_format,
    app,
    check_drafters,
    csv_list,
    default_drafter,
    ints,
    load,
    quiet_transformers,
    report,
    sampling_config,
    use_threads,
)
from specchat.drafters import DrafterChoice, check_draft_cache, parse_drafter, takes_option
from specchat.engine.attention import check_attention
from specchat.errors import SpecchatError

bench_app = typer.Typer(help="Benchmarks: speculative vs autoregressive vs transformers, same run.")
app.add_typer(bench_app, name="bench")


@bench_app.callback(invoke_without_command=True)
def bench(
    ctx: typer.Context,
    model: ModelOption = None,
    drafter: Annotated[
        str | None,
        typer.Option("--drafter", help="Comma-separated drafters to compare with AR (always measured); default: "
                     "the model's fastest, as measured."),
    ] = None,
    draft_budget: BudgetOption = None,
    draft_cache: Annotated[
        str | None,
        typer.Option("--draft-cache", help="Comma-separated: the model and longspec drafters are measured under each "
                     "(rows named like model@streaming)."),
    ] = None,  # fmt: skip
    prompt_set: Annotated[
        str | None,
        typer.Option("--prompt-set", help=f"Comma-separated: {', '.join(PROMPT_SET_NAMES)} (default: chat,code,"
                     "summarize, none with --prompts)."),
    ] = None,
    prompts: Annotated[Path | None, typer.Option("--prompts", help='JSONL file of {"prompt": ...} lines.')] = None,
    baseline: Annotated[
        str | None,
        typer.Option(
            "--baseline",
            help="Comma-separated: hf (transformers' generate; a GGUF file dequantized, as transformers loads one), "
            "llamacpp (llama.cpp on the same GGUF, when llama-cpp-python is installed), llamacpp-lookup (the same "
            "with llama-cpp-python's prompt lookup decoding).",
        ),
    ] = None,
    dtype: Annotated[
        str, typer.Option(help="Comma-separated dtypes, each measured in turn (auto: the CPU's quantized default).")
    ] = "auto,float32",
    kv_cache: Annotated[
        str, typer.Option("--kv-cache", help="Comma-separated KV caches, each measured in turn: auto | "
                          "bf16 | int8 (as run's --kv-cache).")
    ] = "auto",
    quantize: QuantizeOption = None,
    device: DeviceOption = "auto",
    threads: ThreadsOption = None,
    attention: AttentionOption = "auto",
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", help="Most tokens per answer.")] = 128,
    temperature: Annotated[
        float, typer.Option("--temperature", "-t", help="0 = greedy; above 0, sampled with the model's other "
                            "defaults (top-k, top-p, penalty), our methods drawing the same keyed noise (seed 0), "
                            "so each writes autoregressive decoding's text. Baselines stay greedy.")
    ] = 0.0,
    repeats: Annotated[int, typer.Option(help="Interleaved repetitions after the warm-up.")] = 2,
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False,
    plot: Annotated[Path | None, typer.Option("--plot", help="Also draw tokens/s and tau to this PNG.")] = None,
    text_format: FormatOption = "text",
    schema: SchemaOption = None,
    grammar: GrammarOption = None,
    grammar_file: GrammarFileOption = None,
) -> None:
    """Decoding speed of each drafter against autoregressive decoding (and transformers, llama.cpp)."""
    if ctx.invoked_subcommand is not None:
        return
    use_threads(threads)
    from specchat.bench.prompts import load_prompt_sets

    methods = csv_list(drafter or default_drafter(model))
    choices = check_drafters(methods, draft_budget)
    if draft_cache is not None:
        methods = _with_draft_caches(methods, choices, csv_list(draft_cache))
    check_attention(attention)
    if plot is not None:
        if not plot.parent.is_dir() or not os.access(plot.parent, os.W_OK):
            raise SpecchatError(f"--plot: cannot write into {plot.parent}")
        from specchat.bench.plot import plot_rows  # fails now, not after the run, when matplotlib is missing
    from specchat.bench.llamacpp import METHODS, LlamaCpp

    baselines = csv_list(baseline or "")
    known = ("hf", *METHODS)
    for name in baselines:
        if name not in known:
            raise SpecchatError(f"unknown baseline '{name}'; use {', '.join(known)}")
    held = answer_format(text_format, schema, grammar, grammar_file)
    if not held.free and "hf" in baselines:
        raise SpecchatError(f"{held.label()} has no transformers baseline: use --baseline llamacpp (its grammars)")
    check_quantize(quantize, device)
    kv_caches = csv_list(kv_cache)
    for each in kv_caches:
        check_kv_cache(each)
    if max_new_tokens < 1 or repeats < 1:
        raise SpecchatError("--max-new-tokens and --repeats must be at least 1")
    sampling_config({}, {"temperature": temperature})
    if prompt_set is None:
        prompt_set = "" if prompts is not None else "chat,code,summarize"
    sets = load_prompt_sets(csv_list(prompt_set), prompts)
    from specchat.bench.compare import compare
    from specchat.bench.runs import HF_METHODS
    from specchat.engine.target_forward import forward_path

    if "hf" in baselines:
        methods += HF_METHODS
    llamacpp = [LlamaCpp.for_model(model, name) for name in baselines if name in METHODS]
    rows = []
    from specchat.bench.progress import bench_progress

    dtypes = csv_list(dtype)
    runs = 1 + repeats * sum(map(len, sets.values()))  # per method and dtype: the warm-up, then every prompt
    measured = len(dtypes) * len(kv_caches)
    total = measured * len(set(methods) | {"none"}) * runs + len(dtypes) + runs * len(llamacpp)  # loads included
    with bench_progress(total) as step:
        for each_dtype in dtypes:
            step(f"loading {model or 'the default model'} ({each_dtype})")
            loaded = load(model, each_dtype, device, attention, quantize)
            sampling = bench_sampling(loaded, temperature)
            for kv in kv_caches:
                rows += compare(
                    loaded, sets, methods, max_new_tokens=max_new_tokens, repeats=repeats, draft_budget=draft_budget,
                    llamacpp=llamacpp, kv_cache=kv, sampling=sampling, held=held,
                    step=lambda what, d=f"{each_dtype}, kv {kv}": step(f"{d} · {what}"),
                )  # fmt: skip
                llamacpp = []  # measured once, beside the first dtype and cache
    mode = f", {held.label()}" if not held.free else ""
    title = f"{loaded.source.name} ({forward_path(loaded.model)}), {_described(sampling)}{mode}, decode tokens/s"
    report([row.as_dict() for row in rows], as_json, title=title, table=[row.as_table_row() for row in rows])
    if plot is not None:
        plot_rows([row.as_dict() for row in rows], plot, title=title)


def bench_sampling(loaded, temperature: float):
    """Greedy, or the model's sampling defaults at `temperature` with a fixed seed."""
    from specchat.engine.sampling_config import SamplingConfig
    from specchat.loading import decoding_defaults

    if temperature == 0:
        return SamplingConfig()
    return sampling_config(decoding_defaults(loaded), {"temperature": temperature, "seed": 0})


def _described(sampling) -> str:
    """The table's title: greedy, or the temperature and each filter that is on (not at its default, off)."""
    if sampling.greedy:
        return "greedy"
    off = type(sampling)()
    filters = ("top_k", "top_p", "min_p", "penalty")
    shown = [f"{field.replace('_', '-')} {getattr(sampling, field):g}" for field in filters
             if getattr(sampling, field) != getattr(off, field)]
    return ", ".join([f"sampled at temperature {sampling.temperature:g}", *shown])


@bench_app.command("context")
def bench_context(
    model: ModelOption = None,
    contexts: Annotated[str, typer.Option("--context", help="Comma-separated context lengths.")] = "256,4096",
    steps: Annotated[int, typer.Option(help="Decode steps timed per context.")] = 32,
    repeats: Annotated[int, typer.Option(help="Timed runs at each length (median).")] = 3,
    dtype: DtypeOption = "auto",
    yarn: YarnOption = None,
    device: DeviceOption = "auto",
    threads: ThreadsOption = None,
    attention: AttentionOption = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False,
) -> None:
    """Autoregressive time per token as the context grows (only attention cost should grow)."""
    use_threads(threads)
    from specchat.bench.context import decode_cost

    try:
        lengths = [int(c) for c in csv_list(contexts)]
    except ValueError:
        raise SpecchatError(f"--context takes comma-separated integers, not '{contexts}'") from None
    check_attention(attention)
    check_dtype(dtype)
    check_yarn(yarn)
    loaded = load(model, dtype, device, attention, yarn=yarn)
    window = loaded.model.config.max_position_embeddings
    if not lengths or min(lengths) < 1 or max(lengths) + steps + 1 > window:
        raise SpecchatError(f"each context must be between 1 and {window - steps - 1} tokens")
    from specchat.bench.progress import bench_progress

    with bench_progress(len(lengths) * (repeats + 1)) as step:
        rows = decode_cost(loaded, lengths, steps=steps, repeats=repeats, step=step)
    weights = f"{loaded.weights}/{loaded.dtype}" if loaded.weights else loaded.dtype
    report(rows, as_json, title=f"{loaded.source.name} {weights}\nms per AR token")


@bench_app.command("attention")
def bench_attention(
    contexts: Annotated[
        str, typer.Option("--context", help="Comma-separated committed lengths before the tree.")
    ] = "4096,16384,32768,131072",
    tree: Annotated[int, typer.Option(help="Draft-tree nodes; the call has tree + 1 query rows.")] = 64,
    heads: Annotated[int, typer.Option(help="Query heads.")] = 32,
    kv_heads: Annotated[int, typer.Option("--kv-heads", help="KV heads (GQA).")] = 8,
    head_dim: Annotated[int, typer.Option("--head-dim", help="Dims of an attention head.")] = 128,
    dtype: Annotated[str, typer.Option(help="float32 | bfloat16 | float16.")] = "bfloat16",
    device: DeviceOption = "auto",
    threads: ThreadsOption = None,
    repeats: Annotated[int, typer.Option(help="Timed calls per method (median).")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False,
) -> None:
    """One attention call of a tree verification: hybrid vs SDPA with a dense mask, eager and FlexAttention,
    plus the prefix part's bandwidth. The defaults are GPU sizes: on a CPU pass e.g. --context 1024,4096."""
    use_threads(threads)
    from specchat.bench.attention import attention_bench
    from specchat.bench.progress import bench_progress

    lengths = ints(contexts, "--context")
    with bench_progress(len(lengths)) as step:
        rows = attention_bench(
            contexts=lengths, tree=tree, heads=heads, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype,
            device=device, repeats=repeats, step=step,
        )  # fmt: skip
    title = (
        f"attention per call, {dtype}: root + {tree} tree nodes, {heads} query / {kv_heads} KV heads x {head_dim}"
        " (vs_sdpa = SDPA-with-mask time / this time)"
    )
    report([dataclasses.asdict(row) for row in rows], as_json, title=title)


@bench_app.command("verify-cost")
def bench_verify_cost(
    model: ModelOption = None,
    contexts: Annotated[str, typer.Option("--context", help="Comma-separated context lengths.")] = "4096,32768",
    trees: Annotated[str, typer.Option("--tree", help="Comma-separated draft-tree sizes (with --model, 0: a decode "
                                       "step; without, each is timed beside one).")] = "64",
    layers: Annotated[int, typer.Option(help="Without --model: decoder layers to build (fewer for CPU runs).")] = 32,
    dtype: Annotated[str, typer.Option(help="auto | float32 | bfloat16 | float16.")] = "auto",
    device: DeviceOption = "auto",
    threads: ThreadsOption = None,
    attention: AttentionOption = "auto",
    repeats: Annotated[int, typer.Option(help="Timed forwards of each kind (median).")] = 5,
    kv_cache: Annotated[
        str, typer.Option("--kv-cache", help="With --model, comma-separated KV caches, each timed in turn: "
                          "auto | bf16 | int8.")
    ] = "auto",
    yarn: YarnOption = None,
    quantize: QuantizeOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False,
) -> None:
    """Decode vs tree-verification forwards at each context: of --model through the engine's own forward, else
    of a random-weight model with Llama-3.1-8B's shapes (on a CPU pass e.g. --layers 2 --context 1024,4096)."""
    use_threads(threads)
    from specchat.bench.verify_cost import model_verify_cost, verify_cost

    lengths, sizes = ints(contexts, "--context"), ints(trees, "--tree")
    check_attention(attention)
    kv_caches = csv_list(kv_cache)
    for each in kv_caches:
        check_kv_cache(each)
    if model is None and kv_caches != ["auto"]:
        raise SpecchatError("--kv-cache needs --model (the random-weight model's cache holds its dtype)")
    check_yarn(yarn)
    check_quantize(quantize, device)
    if model is None and (yarn is not None or quantize is not None):
        raise SpecchatError("--yarn and --quantize need --model (the random-weight model is Llama 3.1's, dense)")
    quiet_transformers()
    if model is not None:
        from specchat.engine.generate import Engine
        from specchat.engine.target_forward import forward_path

        loaded = load(model, dtype, device, attention, quantize, yarn=yarn)
        rows = []
        for kv in kv_caches:
            engine = Engine(loaded.model, loaded.tokenizer, max_len=max(lengths) + max(sizes) + 1, kv_cache=kv)
            rows += model_verify_cost(engine, contexts=lengths, trees=sizes, repeats=repeats)
            del engine  # its cache, before the next one's
        title = (f"{loaded.source.name} ({loaded.weights}, {loaded.dtype}, {forward_path(loaded.model)}): ms per "
                 "forward over the root + nodes; a decode step's GB/s of weights and cache, and of a copy's rate")
        report([dataclasses.asdict(row) for row in rows], as_json, title=title)
        return
    from specchat.bench.progress import bench_progress

    dtype = "bfloat16" if dtype == "auto" else dtype
    with bench_progress(len(lengths) * len(sizes)) as step:
        rows = [row for tree in sizes for row in verify_cost(contexts=lengths, tree=tree, layers=layers, dtype=dtype,
                                                             device=device, attention=attention, repeats=repeats,
                                                             step=step)]  # fmt: skip
    shape = "Llama-3.1-8B shapes" if layers == 32 else f"Llama-3.1-8B shapes but {layers} of 32 layers"
    title = f"{shape}, random weights, {dtype}: ms per forward (decode: 1 token; verify: root + tree nodes)"
    report([dataclasses.asdict(row) for row in rows], as_json, title=title)


@bench_app.command("gpu-forward")
def bench_gpu_forward(
    contexts: Annotated[str, typer.Option("--context", help="Comma-separated context lengths.")] = "4096,32768",
    trees: Annotated[
        str, typer.Option("--tree", help="Comma-separated draft-tree sizes (a decode step is always timed).")
    ] = "1,15,63,64",
    layers: Annotated[int, typer.Option(help="Decoder layers to build.")] = 32,
    repeats: Annotated[int, typer.Option(help="Timed forwards of each kind (median).")] = 20,
    called: Annotated[bool, typer.Option(help="Also time each forward as called from Python.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False,
) -> None:
    """The torch decoder's forward on CUDA (Llama-3.1-8B shapes, random bf16 weights): decode and tree
    verification as CUDA graphs and as called, the matmuls' weight-reading floor and a measured copy bandwidth."""
    from specchat.bench.gpu_forward import gpu_forward
    from specchat.bench.progress import bench_progress

    lengths, sizes = ints(contexts, "--context"), ints(trees, "--tree")
    quiet_transformers()
    with bench_progress(len(lengths)) as step:
        rows = gpu_forward(contexts=lengths, trees=sizes, layers=layers, repeats=repeats, called=called, step=step)
    shape = "Llama-3.1-8B shapes" if layers == 32 else f"Llama-3.1-8B shapes but {layers} of 32 layers"
    title = f"{shape}, random bf16 weights: ms per forward (graph: CUDA graph of its row bucket; called: eager)"
    report([dataclasses.asdict(row) for row in rows], as_json, title=title)


@bench_app.command("oracle")
def bench_oracle(
    model: ModelOption = None,
    context: Annotated[int, typer.Option(help="Prompt tokens (random ids) before decoding starts.")] = 1024,
    tokens: Annotated[int, typer.Option(help="Tokens to decode in each run.")] = 128,
    acceptances: Annotated[
        str, typer.Option("--acceptance", help="Comma-separated chances that each drafted node is the target's own.")
    ] = "0,0.5,0.8,1",
    budget: Annotated[
        str, typer.Option(help="Nodes of every drafted chain, or auto: the engine's adaptive budget.")
    ] = "3",
    repeats: Annotated[int, typer.Option(help="Interleaved rounds of every run after the warm-up (times summed).")] = 2,
    layers: Annotated[int, typer.Option(help="Without --model: decoder layers to build (fewer for CPU runs).")] = 32,
    dtype: Annotated[str, typer.Option(help="auto | float32 | bfloat16 | float16.")] = "auto",
    device: DeviceOption = "auto",
    threads: ThreadsOption = None,
    attention: AttentionOption = "auto",
    quantize: QuantizeOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False,
) -> None:
    """End-to-end speed at known acceptances: an oracle drafter replays plain decoding's output, each node right
    with the given chance, on --model or a random-weight model with Llama-3.1-8B's shapes (tau set by the
    benchmark, not by a trained draft; every run's output checked against plain decoding's)."""
    use_threads(threads)
    import torch

    from specchat.bench.oracle import check_oracle_run, oracle_runs, word_tokenizer
    from specchat.bench.progress import bench_progress
    from specchat.bench.synthetic import check_range, torch_device, torch_dtype
    from specchat.bench.verify_cost import llama31_8b_config, random_model, with_layers
    from specchat.engine.generate import Engine
    from specchat.engine.target_forward import forward_path

    try:
        rates = [float(item) for item in csv_list(acceptances)]
    except ValueError:
        raise SpecchatError(f"--acceptance takes comma-separated numbers, not '{acceptances}'") from None
    if budget != "auto" and not budget.isdigit():
        raise SpecchatError(f"--budget takes a number of nodes or auto, not '{budget}'")
    nodes = None if budget == "auto" else int(budget)
    check_oracle_run(rates, nodes, tokens, repeats)
    check_attention(attention)
    check_range("--context", context, 1)
    check_quantize(quantize, device)
    if model is None and quantize is not None:
        raise SpecchatError("--quantize needs --model (the random-weight model is dense)")
    quiet_transformers()
    if model is not None:
        loaded = load(model, dtype, device, attention, quantize)
        target, tokenizer, name = (loaded.model, loaded.tokenizer,
                                   f"{loaded.source.name} ({loaded.weights}, {loaded.dtype}")
    else:
        config = with_layers(llama31_8b_config(), layers)
        float_type = torch_dtype("bfloat16" if dtype == "auto" else dtype)
        target = random_model(config, float_type, torch_device(device), attention)
        target.generation_config.eos_token_id = None  # random text: every run decodes all its tokens
        tokenizer = word_tokenizer(config.vocab_size)
        shape = "Llama-3.1-8B shapes" if layers == 32 else f"Llama-3.1-8B shapes but {layers} of 32 layers"
        name = f"{shape}, random weights ({str(float_type).removeprefix('torch.')}"
    engine = Engine(target, tokenizer, max_len=context + tokens + 1)
    prompt = torch.randint(0, target.config.vocab_size, (context,), generator=torch.Generator().manual_seed(0))
    with bench_progress(1 + repeats * (len(rates) + 1)) as step:
        rows = oracle_runs(engine, prompt.tolist(), acceptances=rates, budget=nodes, tokens=tokens, repeats=repeats,
                           step=step)  # fmt: skip
    chains = "at the adaptive budget" if nodes is None else f"of {nodes} nodes"
    title = (f"{name}, {forward_path(target)}): {tokens} tokens after {context}, the oracle's chains {chains} "
             "against plain decoding")  # fmt: skip
    report([dataclasses.asdict(row) for row in rows], as_json, title=title)


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
    intermediate: Annotated[int, typer.Option("--intermediate", help="The draft MLP's width (0: the target's).")] = 0,
    dtype: DtypeOption = "auto",
    device: DeviceOption = "auto",
    threads: ThreadsOption = None,
    attention: AttentionOption = "auto",
    repeats: Annotated[int, typer.Option(help="Timed calls of each kind (median).")] = 5,
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False,
) -> None:
    """A random-weight LongSpec draft's cost per proposal (beam) against the target's decode and verify
    forwards, and its memory, by context and draft vocabulary. GPU: --shapes llama3.1-8b --dtype bfloat16."""
    use_threads(threads)
    lengths, sizes, trees = ints(contexts, "--context"), ints(vocabs, "--vocab"), ints(budgets, "--budget")
    check_attention(attention)
    if shapes not in (None, "llama3.1-8b"):
        raise SpecchatError(f"unknown --shapes '{shapes}'; use llama3.1-8b")
    quiet_transformers()
    from specchat.bench.draft_cost import draft_cost

    if shapes:
        from specchat.bench.synthetic import torch_device, torch_dtype
        from specchat.bench.verify_cost import llama31_8b_config, random_model, with_layers

        float_type = torch_dtype("bfloat16" if dtype == "auto" else dtype)
        target = random_model(with_layers(llama31_8b_config(), layers), float_type, torch_device(device), attention)
        name = f"random Llama-3.1-8B shapes, {layers} layers, {float_type}".replace("torch.", "")
    else:
        loaded = load(model, dtype, device, attention)
        target, name = loaded.model, f"{loaded.source.name} {loaded.weights}/{loaded.dtype}"
    from specchat.bench.progress import bench_progress

    with bench_progress(len(lengths) * len(sizes) * len(trees)) as step:
        rows = draft_cost(target, contexts=lengths, vocabs=sizes, budgets=trees, intermediate=intermediate,
                          repeats=repeats, step=step)  # fmt: skip
    report([dataclasses.asdict(row) for row in rows], as_json, title=f"random LongSpec draft on {name}: ms per call")


def _with_draft_caches(methods: list[str], choices: list[DrafterChoice], caches: list[str]) -> list[str]:
    """Each drafter that reads a draft cache, once per cache ("model@streaming"), after the others."""
    readers = [method for method, choice in zip(methods, choices) if takes_option(choice, "cache")]
    for cache in caches:
        check_draft_cache(cache, parse_drafter(readers[0]) if readers else choices[0])
    return [m for m in methods if m not in readers] + [f"{m}@{cache}" for m in readers for cache in caches]


@bench_app.command("serve")
def bench_serve(
    model: ModelOption = None,
    drafter: Annotated[str | None, typer.Option("--drafter", "-d", help="The server's drafter (default: the "
                                                                       "model's fastest, as measured).")] = None,
    clients: Annotated[str, typer.Option("--clients", help="Comma-separated numbers of clients at once.")] = "1,4,8",
    prompt_set: Annotated[
        str, typer.Option("--prompt-set", help=f"Comma-separated: {', '.join(PROMPT_SET_NAMES)}.")
    ] = "chat",
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", help="Tokens each request generates.")] = 64,
    dtype: DtypeOption = "auto",
    device: DeviceOption = "auto",
    threads: ThreadsOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False,
) -> None:
    """The OpenAI server under several clients at once: time to first token, time between tokens, tokens/s,
    and its overhead per token against the same engine driven directly."""
    use_threads(threads)
    counts = ints(clients, "--clients")
    if not counts or min(counts) < 1:
        raise SpecchatError("--clients takes numbers of clients, each at least 1")
    if max_new_tokens < 1:
        raise SpecchatError("--max-new-tokens must be at least 1")
    drafter = drafter or default_drafter(model)
    [choice] = check_drafters([drafter], None)
    check_dtype(dtype)
    from specchat.bench.prompts import load_prompt_sets
    from specchat.drafters import resolve_drafter
    from specchat.loading import resolve_model

    source = resolve_model(model)
    resolve_drafter(choice, source.profile, source.name)

    prompts = [prompt for each in load_prompt_sets(csv_list(prompt_set)).values() for prompt in each]
    if not all(isinstance(prompt, str) for prompt in prompts):
        raise SpecchatError("bench serve sends chat prompts: the fim set and prompts with a suffix are for bench")
    quiet_transformers()
    from specchat.bench.progress import bench_progress
    from specchat.bench.serve import serve_bench
    from specchat.server.server import Server, ServeSettings

    settings = ServeSettings(
        model=model, drafter=drafter, draft_budget=None, draft_cache=None, host="127.0.0.1", port=0, api_key=None,
        context=8192, max_queue=max(counts) + 1, max_body_bytes=2**22, dtype=dtype, quantize=None, device=device,
        attention="auto",
    )  # fmt: skip
    server = Server(settings)
    try:
        with bench_progress(1 + len(counts) + 1) as step:
            step(f"loading {model or 'the default model'}")
            server.start()
            server.worker.ready.wait()
            if server.worker.load_error is not None:
                raise SpecchatError(server.worker.load_error)
            rows = serve_bench(server, prompts, clients=counts, max_tokens=max_new_tokens, step=step)
    finally:
        server.stop()
    served = server.worker.served
    title = f"specchat serve: {served.name}, drafter {served.drafter}, {len(prompts)} prompts per client, greedy"
    report([dataclasses.asdict(row) for row in rows], as_json, title=title)


@bench_app.command("logits")
def bench_logits(
    model: ModelOption = None,
    tokens: Annotated[int, typer.Option("--tokens", help="Positions of real text scored.")] = 512,
    llamacpp: Annotated[bool, typer.Option(
        "--llamacpp", help="Also score llama.cpp's logits on the same file.")] = False,
    dtype: DtypeOption = "auto",
    threads: ThreadsOption = None,
    kv_cache: KvCacheOption = "auto",
    yarn: YarnOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False,
) -> None:
    """Logits of a GGUF model on its own blocks against the same file dequantized and run in fp32 (and
    llama.cpp's): mean KL, top-1 agreement, logit errors over a real text."""
    use_threads(threads)
    if tokens < 2:
        raise SpecchatError("--tokens must be at least 2")
    check_dtype(dtype)
    check_kv_cache(kv_cache)
    check_yarn(yarn)
    quiet_transformers()
    from specchat.bench.logits import logits_accuracy, text_ids
    from specchat.loading import embedded_gguf_path, resolve_model

    source = resolve_model(model)
    if not source.gguf and not source.embedded:
        raise SpecchatError("bench logits scores GGUF models (the embedded one, a GGUF profile or file)")
    path = embedded_gguf_path() if source.embedded else source.gguf_path()
    loaded = load(model, dtype, "cpu", yarn=yarn)
    rows = logits_accuracy(loaded, path, text_ids(loaded.tokenizer, tokens), llamacpp=llamacpp, kv_cache=kv_cache)
    report([dataclasses.asdict(row) for row in rows], as_json,
           title=f"{source.name}: logits against its weights dequantized by gguf-py in fp32")  # fmt: skip
