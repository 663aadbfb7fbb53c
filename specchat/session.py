"""A session: a target model loaded, an engine over it sized for the work, its drafter attached. What `run`,
`serve`, `bench` and `train data` open, and what a Python program opens in one call:

    from specchat.session import Session

    session = Session.open("qwen2.5-coder-1.5b", max_len=4096)  # the drafter its profile measured fastest
    for event in session.engine.generate(session.encode("Write a haiku about the sea."), max_new_tokens=64):
        print(event.text, end="")

`Session.over(loaded, ...)` does the same over a model already loaded (a command that reads the prompt with the
model's tokenizer before it sizes the engine, a benchmark that runs several engines over one model).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from specchat.drafters import DEFAULT_DRAFTER, DrafterChoice, attach_drafter
from specchat.engine.generate import Engine
from specchat.engine.prompt import encode_prompt
from specchat.loading import LoadedModel, load_model

if TYPE_CHECKING:
    from collections.abc import Callable


@dataclass
class Session:
    loaded: LoadedModel
    engine: Engine
    drafter: DrafterChoice  # what drafts, resolved (its checkpoint found)

    @classmethod
    def open(cls, model: str | None = None, *, max_len: int, drafter: str | DrafterChoice | None = None,
             dtype: str = "auto", quantize: str | None = None, device: str = "auto", attention: str = "auto",
             yarn: float | None = None, progress: Callable[[str], None] = lambda _stage: None,
             **engine_options) -> Session:  # fmt: skip
        """Load `model` (a profile alias, repo id, directory or GGUF file; None: the embedded model) and open a
        session over it; `engine_options` are `over`'s."""
        loaded = load_model(model, dtype=dtype, quantize=quantize, device=device, attention=attention, yarn=yarn,
                            progress=progress)  # fmt: skip
        return cls.over(loaded, max_len=max_len, drafter=drafter, **engine_options)

    @classmethod
    def over(cls, loaded: LoadedModel, *, max_len: int, drafter: str | DrafterChoice | None = None,
             draft_budget: int | None = None, draft_cache: str | None = None, kv_budget: int | None = None,
             draft_forward: bool | None = None, kv_cache: str = "auto", prefix_bytes: int = 0) -> Session:  # fmt: skip
        """An engine over `loaded` holding `max_len` tokens, drafting with `drafter` (default: the drafter the
        model's profile names, else n-gram lookup) and its options (`attach_drafter`)."""
        engine = Engine(loaded.model, loaded.tokenizer, max_len=max_len, kv_cache=kv_cache, prefix_bytes=prefix_bytes)
        if drafter is None:
            profile = loaded.source.profile
            drafter = profile.drafter if profile else DEFAULT_DRAFTER
        choice = attach_drafter(engine, loaded.source, drafter, draft_budget=draft_budget, draft_cache=draft_cache,
                                kv_budget=kv_budget, draft_forward=draft_forward)  # fmt: skip
        return cls(loaded, engine, choice)

    def encode(self, prompt: str, *, system: str | None = None, raw: bool = False) -> list[int]:
        """The prompt's token ids, through the model's chat template unless `raw`."""
        return encode_prompt(self.loaded.tokenizer, prompt, system=system, raw=raw)
