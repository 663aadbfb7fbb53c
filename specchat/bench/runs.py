"""One generation by one method, with its decode time: our engine (greedy or sampled), transformers' `generate`
and llama.cpp (both greedy).

Decode time excludes prefill for every method: ours from the engine's stats, transformers' from a streamer's
clock, llama.cpp's from its first generated token (`llamacpp.py`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from specchat.answer_format import AnswerFormat
from specchat.architectures.llama_model import CausalLM
from specchat.bench.llamacpp import METHODS, LlamaCpp
from specchat.engine.generate import Engine, eos_ids
from specchat.engine.sampling import SamplingConfig
from specchat.loading import LoadedModel, embedded_gguf_path
from specchat.quant.gguf_model import dequantized_model
from specchat.session import Session

HF_METHODS = ("hf", "hf-prompt-lookup")  # transformers' own generate: plain greedy, prompt-lookup decoding
LLAMACPP_METHODS = tuple(METHODS)  # llama.cpp on the same GGUF, plain and speculative (llamacpp.py)
BASELINES = (*HF_METHODS, *LLAMACPP_METHODS)


@dataclass
class Run:
    tokens: list[int]
    decode_tokens: int
    decode_seconds: float
    steps: int = 0
    drafted_depth: int = 0
    accepted: int = 0
    budget_total: int = 0
    draft_seconds: float = 0.0  # the drafter's proposals (part of decode_seconds)


def method_runner(method: str, loaded: LoadedModel, max_len: int, max_new_tokens: int, draft_budget: int | None,
                  llamacpp: LlamaCpp | None, kv_cache: str = "auto", sampling: SamplingConfig = SamplingConfig(),
                  hf_model: nn.Module | None = None, held: AnswerFormat = AnswerFormat()):  # fmt: skip
    """A function that generates from prompt ids with `method`, each method with its own engine; ours decode
    under `sampling`, the other tools greedily (transformers' `generate` on `hf_model`, `transformers_model`; a
    llama.cpp method on `llamacpp`); ours and llama.cpp's answers `held` to a format."""
    model = loaded.model
    if method in LLAMACPP_METHODS:
        stop_ids = eos_ids(model, loaded.tokenizer)
        return lambda ids: llamacpp_run(llamacpp, ids, max_new_tokens, stop_ids, held)
    if method not in HF_METHODS:
        drafter, _, cache = method.partition("@")  # "model@streaming": under that --draft-cache
        engine = Session.over(loaded, max_len=max_len, drafter=drafter, draft_budget=draft_budget,
                              draft_cache=cache or None, kv_cache=kv_cache).engine  # fmt: skip
        return lambda ids: engine_run(engine, ids, max_new_tokens, sampling, held)
    if method == "hf":
        return lambda ids: hf_run(hf_model, ids, max_new_tokens, {})
    return lambda ids: hf_run(hf_model, ids, max_new_tokens, {"prompt_lookup_num_tokens": 10})


def transformers_model(loaded: LoadedModel) -> nn.Module:
    """The model transformers' `generate` runs for `loaded`: itself, or where `loaded` is a GGUF file on
    specchat's own modules, the file as transformers loads one (dequantized), in the same activation dtype and
    stopping at the same tokens."""
    model = loaded.model
    if not isinstance(model, CausalLM):
        return model
    path = embedded_gguf_path() if loaded.source.embedded else loaded.source.gguf_path()
    dense = dequantized_model(path, model.name_or_path).to(model.dtype)
    dense.generation_config.eos_token_id = model.generation_config.eos_token_id
    return dense


def engine_run(engine: Engine, ids: list[int], max_new_tokens: int, sampling: SamplingConfig = SamplingConfig(),
               held: AnswerFormat = AnswerFormat()) -> Run:  # fmt: skip
    """Generation by our engine; the stats give the decode time and what was drafted and accepted. Sampled runs
    draw keyed noise seeded by `sampling.seed`, so every drafter writes the text autoregressive decoding does."""
    tokens = []
    events = engine.generate(ids, sampling=sampling, max_new_tokens=max_new_tokens, constraint=held.constraint(engine))
    for event in events:
        tokens += event.tokens
    s = event.stats
    return Run(tokens, s.decode_tokens, s.decode_seconds, s.steps, s.drafted_depth, s.accepted, s.budget_total,
               s.draft_seconds)  # fmt: skip


def llamacpp_run(llamacpp: LlamaCpp, ids: list[int], max_new_tokens: int, stop_ids: frozenset[int],
                 held: AnswerFormat = AnswerFormat()) -> Run:  # fmt: skip
    tokens, seconds = llamacpp.generate(ids, max_new_tokens, stop_ids, held)
    return Run(tokens, len(tokens) - 1, seconds, steps=len(tokens) - 1)


class _StreamClock:
    """A transformers streamer that timestamps every batch of tokens `generate` emits."""

    def __init__(self):
        self.puts: list[tuple[float, int]] = []

    def put(self, value: torch.Tensor) -> None:
        self.puts.append((time.perf_counter(), value.numel()))

    def end(self) -> None:
        pass


def hf_run(model, ids: list[int], max_new_tokens: int, options: dict) -> Run:
    clock = _StreamClock()
    eos = model.generation_config.eos_token_id  # an id or a list of them
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([ids], device=model.device),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            streamer=clock,
            pad_token_id=eos[0] if isinstance(eos, list) else eos,
            **options,
        )
    # puts[0] is the prompt, puts[1] the first token (prefill); the rest is decoding.
    decode = clock.puts[2:]
    seconds = decode[-1][0] - clock.puts[1][0] if decode else 0.0
    return Run(out[0, len(ids) :].tolist(), sum(n for _, n in decode), seconds, steps=len(decode))
