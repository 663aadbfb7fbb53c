"""`specchat bench`: decoding speed of each method on the same prompts, against our autoregressive decoding.

`compare` runs every method on the same prompts, interleaved (method by method within each prompt, all of
it repeated) after a warm-up, so slow drifts of a noisy machine hit every method alike. Decode speed
excludes prefill for every method (`runs.py`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from specchat.answer_format import AnswerFormat
from specchat.bench.llamacpp import LlamaCpp
from specchat.bench.progress import NO_PROGRESS
from specchat.bench.prompts import Prompt, prompt_ids
from specchat.bench.runs import BASELINES, HF_METHODS, LLAMACPP_METHODS, Run, method_runner, transformers_model
from specchat.engine.sampling_config import SamplingConfig
from specchat.engine.target_forward import forward_path, held_kv_cache
from specchat.loading import LoadedModel
from specchat.quant.formats import weight_format


@dataclass
class BenchRow:
    method: str  # a drafter name (our engine) or one of BASELINES
    prompt_set: str
    weights: str  # "q4_1", "int4-g32", "float32", ...
    dtype: str  # activations
    kv_cache: str  # the target's KV cache as our engine held it: "auto" (the activations' dtype), "bf16" or "int8"
    new_tokens: int  # per repeat, summed over the set's prompts
    tokens_per_second: float  # decode only
    speedup_vs_ar: float  # over our autoregressive decoding, same set and dtype, same run
    mean_accepted_length: float | None
    acceptance_rate: float | None
    identical_to_ar: bool  # greedy ids equal our AR run's on every prompt
    mean_budget: float | None  # tree budget in force per step (fixed, or chosen by the engine)
    draft_ms_per_step: float | None = None  # the drafter's time per decode step, all steps counted (--json only)
    decoder: str = ""  # what computed it: our decoder and its code path (`forward_path`), transformers, llama.cpp's

    def as_dict(self) -> dict:
        return {"drafter": self.method, **{k: v for k, v in asdict(self).items() if k != "method"}}

    def as_table_row(self) -> dict[str, str]:
        """The row as the table shows it: human headers and units, narrow enough for 80 columns."""
        figure = lambda value, digits: "-" if value is None else f"{value:.{digits}f}"  # noqa: E731
        activations = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(self.dtype, self.dtype)
        kv = {"int8": "·kv8", "bf16": "·kv16"}.get(self.kv_cache, "")  # a KV cache other than the activations' dtype
        return {
            "method": "AR" if self.method == "none" else self.method,
            "set": self.prompt_set,
            "weights": self.weights if self.method in LLAMACPP_METHODS else f"{self.weights}·{activations}{kv}",
            "tok/s": figure(self.tokens_per_second, 1),
            "vs AR": f"{self.speedup_vs_ar:.2f}x",
            "tau": "-" if self.method in BASELINES else figure(self.mean_accepted_length, 2),
            "accept": figure(self.acceptance_rate, 2),
            "exact": "yes" if self.identical_to_ar else "no",  # the same ids as our AR
            "budget": figure(self.mean_budget, 1),
        }


def compare(
    loaded: LoadedModel,
    prompt_sets: dict[str, list[Prompt]],
    methods: list[str],
    *,
    max_new_tokens: int,
    repeats: int,
    draft_budget: int | None = None,
    llamacpp: Sequence[LlamaCpp] = (),
    kv_cache: str = "auto",
    sampling: SamplingConfig = SamplingConfig(),
    held: AnswerFormat = AnswerFormat(),
    step: Callable[[str], None] = NO_PROGRESS,
) -> list[BenchRow]:
    """Generation of every prompt by every method, our engine's over a `kv_cache` cache and under `sampling`
    (the other tools' greedy); "none" (our AR) is always measured, and each of `llamacpp` (plain, speculative).
    Every answer is `held` to a format (llama.cpp's under its own grammar of it). `step(what)` hears each generation
    as it starts (`progress.py`)."""
    by_method = {each.method: each for each in llamacpp}
    methods = ["none", *[m for m in methods if m != "none"], *by_method]
    tokenizer = loaded.tokenizer
    encoded = {name: [prompt_ids(tokenizer, p) for p in prompts] for name, prompts in prompt_sets.items()}
    max_len = max(len(ids) for ids_list in encoded.values() for ids in ids_list) + max_new_tokens
    hf_model = transformers_model(loaded) if set(methods) & set(HF_METHODS) else None
    runners = {m: method_runner(m, loaded, max_len, max_new_tokens, draft_budget, by_method.get(m), kv_cache, sampling,
                                hf_model, held) for m in methods}  # fmt: skip
    decoders = {m: _decoder(m, loaded, hf_model, by_method.get(m)) for m in methods}
    held_kv = held_kv_cache(loaded.model, kv_cache)  # what our engine holds: auto may mean bf16

    warmup = next(iter(encoded.values()))[0]
    for method, runner in runners.items():
        step(f"{method}: warm-up")
        runner(warmup)
    runs: dict[tuple[str, str], list[list[Run]]] = defaultdict(list)  # (method, set) -> [repeat][prompt]
    for repeat in range(repeats):
        for name, prompts in encoded.items():
            results = {m: [] for m in methods}
            for i, ids in enumerate(prompts):
                for method in methods:
                    step(f"{method}: {name} prompt {i + 1}/{len(prompts)}, repeat {repeat + 1}/{repeats}")
                    results[method].append(runners[method](ids))
            for method in methods:
                runs[method, name].append(results[method])

    rows = []
    for name in encoded:
        ar_speed = _speed(runs["none", name])
        for method in methods:
            repeats_runs = runs[method, name]
            flat = [run for repeat in repeats_runs for run in repeat]
            steps = sum(r.steps for r in flat)
            drafted = sum(r.drafted_depth for r in flat)
            rows.append(
                BenchRow(
                    method=method,
                    prompt_set=name,
                    weights="gguf" if method in LLAMACPP_METHODS else weight_format(hf_model) if method in HF_METHODS
                    else loaded.weights,  # fmt: skip
                    dtype="llama.cpp" if method in LLAMACPP_METHODS else loaded.dtype,
                    kv_cache="llama.cpp" if method in LLAMACPP_METHODS else kv_cache if method in HF_METHODS
                    else held_kv,  # fmt: skip
                    new_tokens=sum(len(r.tokens) for r in repeats_runs[0]),
                    tokens_per_second=round(_speed(repeats_runs), 3),
                    speedup_vs_ar=round(_speed(repeats_runs) / ar_speed, 3),
                    mean_accepted_length=round(sum(r.decode_tokens for r in flat) / steps, 3) if steps else None,
                    acceptance_rate=round(sum(r.accepted for r in flat) / drafted, 3) if drafted else None,
                    identical_to_ar=all(
                        a.tokens == b.tokens for a, b in zip(flat, [r for rep in runs["none", name] for r in rep])
                    ),
                    mean_budget=round(sum(r.budget_total for r in flat) / steps, 2)
                    if method not in ("none", *BASELINES)
                    else None,
                    draft_ms_per_step=round(1e3 * sum(r.draft_seconds for r in flat) / steps, 2)
                    if method not in ("none", *BASELINES) and steps
                    else None,
                    decoder=decoders[method],
                )
            )
    return rows


def _decoder(method: str, loaded: LoadedModel, hf_model, llamacpp: LlamaCpp | None) -> str:
    """What computes `method`'s rows: llama.cpp's build, transformers on its device, or our decoder and its path."""
    if llamacpp is not None:
        return llamacpp.build
    if method in HF_METHODS:
        return f"transformers, {hf_model.device.type}"
    return forward_path(loaded.model)


def _speed(repeats_runs: list[list[Run]]) -> float:
    tokens = sum(r.decode_tokens for repeat in repeats_runs for r in repeat)
    seconds = sum(r.decode_seconds for repeat in repeats_runs for r in repeat)
    return tokens / seconds if seconds else 0.0
