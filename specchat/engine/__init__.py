"""The engine: tree speculative decoding of one target model over a static KV cache, no UI code.

Its public API, importable from here (each name loads its module on first use, so that `specchat.engine.events`
and the option checks stay free of torch):

- `Engine`: a session over one target model; `Engine.generate(prompt_ids, sampling=..., max_new_tokens=...)`
  prefills (reusing the cached prefix the prompt shares with the session) and yields a `StepEvent` per step;
  `Engine.prompt_logprobs(ids, top)` scores a text (each token's log-probability under the model);
- `StepEvent`, `TARGET`: what a step committed and where each token came from; `GenerationStats`: running
  totals (tau, acceptance, decode speed);
- `SamplingConfig`: the target distribution (greedy or temperature / top-k / top-p / min-p / penalty, seed);
- `Constraint`: a syntax the output is held to (`Engine.json_constraint(schema)`: JSON mode, or a JSON Schema;
  `Engine.grammar_constraint(gbnf)`: a text a GBNF grammar derives; `Engine.tool_call_constraint(functions, form)`:
  an answer whose tool calls are held to their tools' schemas);
- `encode_prompt`, `encode_chat`: prompt text -> ids through the tokenizer's chat template;
- `read_prompt_cache(engine, path, ids)`, `write_prompt_cache(engine, path)`: a text's keys and values kept in a
  file and read back where a later prompt shares its prefix (`specchat run --prompt-cache`);
- `DraftTree`: what a drafter proposes; `TreeCache`: the static cache a drafter may read;
- `use_attention`, `check_attention`: how trees are verified (`--attention`);
- `Timer`, `verification_forward`: the timer and the verification forward that calibration and the
  benchmarks share.

docs/design.md describes how the pieces fit together.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_MODULES = {
    "Engine": "generate",
    "StepEvent": "events",
    "TARGET": "events",
    "GenerationStats": "stats",
    "SamplingConfig": "sampling_config",
    "Constraint": "constraint",
    "encode_prompt": "prompt",
    "encode_chat": "prompt",
    "read_prompt_cache": "prompt_cache",
    "write_prompt_cache": "prompt_cache",
    "DraftTree": "tree",
    "TreeCache": "cache",
    "use_attention": "attention",
    "check_attention": "attention",
    "Timer": "timing",
    "verification_forward": "verify_forward",
}

__all__ = [
    "TARGET",
    "Constraint",
    "DraftTree",
    "Engine",
    "GenerationStats",
    "SamplingConfig",
    "StepEvent",
    "Timer",
    "TreeCache",
    "check_attention",
    "encode_chat",
    "encode_prompt",
    "read_prompt_cache",
    "use_attention",
    "verification_forward",
    "write_prompt_cache",
]


def __getattr__(name: str):
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:
    from specchat.engine.attention import check_attention, use_attention
    from specchat.engine.cache import TreeCache
    from specchat.engine.constraint import Constraint
    from specchat.engine.events import TARGET, StepEvent
    from specchat.engine.generate import Engine
    from specchat.engine.prompt import encode_chat, encode_prompt
    from specchat.engine.prompt_cache import read_prompt_cache, write_prompt_cache
    from specchat.engine.sampling_config import SamplingConfig
    from specchat.engine.stats import GenerationStats
    from specchat.engine.timing import Timer
    from specchat.engine.tree import DraftTree
    from specchat.engine.verify_forward import verification_forward
