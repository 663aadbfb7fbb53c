"""One chat: the loaded model, its engine, the settings and the conversation, without any UI.

The app calls `begin_turn` and `reset` on its own thread and iterates `run` in a worker thread while holding
`lock`, so the engine only ever runs on one thread at a time. Changing the drafter or the budget takes effect
at the next answer and keeps the conversation's cache; changing the context rebuilds the engine.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from specchat.answer_format import AnswerFormat
from specchat.checks import check_kv_cache
from specchat.drafters import DRAFT_CACHES, attach_drafter, parse_drafter, resolve_drafter
from specchat.engine.budget import MAX_BUDGET
from specchat.engine.events import StepEvent
from specchat.engine.generate import Engine
from specchat.engine.prompt import encode_chat
from specchat.engine.prompt_cache import read_prompt_cache, write_prompt_cache
from specchat.engine.sampling import SamplingConfig
from specchat.engine.sampling_config import MAX_SEED
from specchat.engine.text import TextStream
from specchat.errors import SpecchatError
from specchat.loading import LoadedModel
from specchat.tui.ar_baseline import ArBaseline
from specchat.tui.chat_prompt import ChatPrompt, chat_messages, next_prompt
from specchat.tui.figures import Figures, memory_in_use
from specchat.tui.transcript import Message, json_is

DEFAULT_CONTEXT = 8192  # the conversation's cache when --context is not given (or the model's window)

# Blocking; hears load stages through its argument; raises SpecchatError.
ModelLoader = Callable[[Callable[[str], None]], tuple[LoadedModel, SamplingConfig]]


@dataclass(frozen=True)
class ChatSettings:
    drafter: str = "ngram"
    draft_budget: int | None = None  # None: the engine's adaptive budget
    draft_cache: str | None = None  # --draft-cache for a drafter that reads one; None: its default
    system: str | None = None  # None: the chat template's default
    max_new_tokens: int = 1024  # per answer
    context: int | None = None  # most tokens the conversation may hold
    kv_cache: str = "auto"  # --kv-cache; the command line's, whatever a loaded chat says (`apply_settings_json`)
    format: AnswerFormat = AnswerFormat()  # what every answer is held to (--format, --schema, --grammar-file, /format)
    stop: tuple[str, ...] = ()  # strings that end an answer (an ollama model's Modelfile stops)


@dataclass(frozen=True)
class Update:
    """One engine step as the UI needs it: the event, each token's printable text, the overlay's figures."""

    event: StepEvent
    pieces: list[str]
    figures: Figures


def _next_turn(messages: list[Message], start: int) -> int:
    """The index of the first user message after `start`: dropping the oldest turn drops its answer too."""
    index = start + 1
    while index < len(messages) and messages[index].role != "user":
        index += 1
    return index


def check_settings(settings: ChatSettings) -> None:
    """One-line errors for settings no engine can run with (from the command line or a saved chat)."""
    if not isinstance(settings.drafter, str):
        raise SpecchatError("the drafter must be a name")
    parse_drafter(settings.drafter)
    if settings.draft_cache is not None and settings.draft_cache not in DRAFT_CACHES:  # kept while drafters change
        raise SpecchatError(f"the draft cache must be one of {', '.join(DRAFT_CACHES)}")
    budget = settings.draft_budget
    if budget is not None and not (isinstance(budget, int) and 1 <= budget <= MAX_BUDGET):
        raise SpecchatError(f"the draft budget must be between 1 and {MAX_BUDGET} (or auto)")
    if not isinstance(settings.max_new_tokens, int) or settings.max_new_tokens < 1:
        raise SpecchatError("the most new tokens per answer must be at least 1")
    if settings.context is not None and not (isinstance(settings.context, int) and settings.context >= 16):
        raise SpecchatError("the context must hold at least 16 tokens")
    if settings.system is not None and not isinstance(settings.system, str):
        raise SpecchatError("the system prompt must be text")
    if not (isinstance(settings.stop, tuple) and all(isinstance(each, str) and each for each in settings.stop)):
        raise SpecchatError("the stop strings must be a list of non-empty texts")
    if not isinstance(settings.format, AnswerFormat):
        raise SpecchatError("the answer format must be text, JSON, a JSON Schema or a grammar")
    check_kv_cache(settings.kv_cache)


class ChatSession:
    def __init__(self, loaded: LoadedModel, sampling: SamplingConfig, settings: ChatSettings,
                 prompt_cache: Path | None = None):  # fmt: skip
        if not getattr(loaded.tokenizer, "chat_template", None):
            raise SpecchatError(f"model '{loaded.source.name}' has no chat template; use `specchat run --raw`")
        self.loaded = loaded
        self.prompt_cache = prompt_cache  # a file the conversation's keys and values are kept in after each answer
        self.sampling = sampling
        self.settings = settings
        self.messages: list[Message] = []
        self.lock = threading.Lock()  # held by whoever drives the engine
        self.engine: Engine | None = None  # built (again) on the next answer when None
        self.drafter_ready = False  # whether the engine drafts as the settings say
        self.previous: ChatPrompt | None = None  # the prompt the last answer continued
        self.retries = 0  # answers asked again (/retry): a seeded chat's draws go on from its seed plus these
        self.ar = ArBaseline()  # what an autoregressive step costs here, for the speedup
        self.recent_tau: deque[int] = deque(maxlen=60)
        self.last_figures: Figures | None = None

    @property
    def model_name(self) -> str:
        return self.loaded.source.name

    def update_settings(self, **changes) -> None:
        self.settings = dataclasses.replace(self.settings, **changes)
        if "context" in changes:
            self.engine = None
        if {"drafter", "draft_budget", "draft_cache", "context"} & changes.keys():
            self.drafter_ready = False
        if "system" in changes:
            self.previous = None

    def reset(self, messages: list[Message] | None = None) -> int:
        """Start over (/clear), or with loaded messages (/load): as many of the newest as fit the context with
        room for an answer. Returns how many of the oldest were left out."""
        messages, dropped = list(messages or []), 0
        while dropped < len(messages) and not self._fits(self._prompt_tokens(messages[dropped:])):
            dropped = _next_turn(messages, dropped)
        self.messages = messages[dropped:]
        self.previous = None
        return dropped

    def begin_turn(self, text: str) -> tuple[Message, Message, list[int], int]:
        """Add the user's message and an empty answer; return both, the prompt ids to generate from, and how
        many of the oldest messages were dropped to make room (the system prompt always stays)."""
        user = Message("user", text)
        messages, dropped = self.messages + [user], 0
        while True:
            seen = messages[dropped:]
            answer = seen[-2] if len(seen) > 1 and seen[-2].role == "assistant" else None
            turns = chat_messages(self.settings.system, seen)
            previous = self.previous if not dropped else None  # a dropped turn changes the whole prompt
            prompt = next_prompt(self.loaded.tokenizer, turns, answer, previous, self._eos_ids())
            if self._fits(len(prompt.ids)):
                break
            if len(seen) == 1:
                raise SpecchatError(
                    f"the message takes {len(prompt.ids)} tokens with the chat template; the context holds "
                    f"{self._engine().capacity} with room for an answer (start with a larger --context)"
                )
            dropped = min(_next_turn(messages, dropped), len(messages) - 1)  # the new message always stays
        reply = Message("assistant")
        self.messages = seen + [reply]
        self.previous = prompt
        return user, reply, prompt.ids, dropped

    def abandon_turn(self) -> None:
        """Forget the last turn: its answer failed before its first token, or it is to be answered again (/retry);
        the chat stays well formed."""
        del self.messages[-2:]
        self.previous = None

    def retry(self) -> str:
        """The message the last answer answers, its turn forgotten to be asked again (/retry). A seeded chat draws from
        then on with its seed plus the retries so far: the answer asked again is another, and the same chat with the
        same seed, messages and retries is the same text."""
        if len(self.messages) < 2 or self.messages[-1].role != "assistant":
            raise SpecchatError("no answer to retry yet")
        question = self.messages[-2].text
        self.abandon_turn()
        self.retries += 1
        return question

    def _sampling(self) -> SamplingConfig:
        """The sampling of the next answer: the chat's, its seed moved on by the retries."""
        if self.sampling.seed is None or not self.retries:
            return self.sampling
        return dataclasses.replace(self.sampling, seed=(self.sampling.seed + self.retries) % (MAX_SEED + 1))

    def warm_up(self) -> None:
        """Answer a throwaway "Hi" in two tokens, so the first real answer starts warm.

        It pays the one-time costs (the first forward's kernel setup, the verification-cost calibration on a
        new machine, the autoregressive timing behind the speedup) and leaves the chat template's head in the
        cache, where the first real prompt finds it and skips prefilling it again.
        """
        ids = encode_chat(self.loaded.tokenizer, chat_messages(self.settings.system, [Message("user", "Hi")]))
        with self.lock:
            for _ in self.run(ids, max_new_tokens=2, keep=False):  # the prompt cache keeps the last session's text
                pass
        self.recent_tau.clear()
        self.last_figures = None

    def choose_drafter(self, text: str) -> None:
        """Draft with `text` (NAME, NAME:DIR or A+B) from the next answer: one-line errors for what cannot run here."""
        source = self.loaded.source
        resolve_drafter(parse_drafter(text, "/drafter"), source.profile, source.name, "/drafter")
        self.update_settings(drafter=text)

    def use_drafter(self) -> None:
        """Make the engine draft as the settings say (a checkpoint loads here); one-line errors."""
        engine = self._engine()
        if not self.drafter_ready:
            attach_drafter(engine, self.loaded.source, self.settings.drafter, draft_budget=self.settings.draft_budget,
                           draft_cache=self.settings.draft_cache)  # fmt: skip
            self.drafter_ready = True

    def run(self, prompt_ids: list[int], *, max_new_tokens: int | None = None, keep: bool = True) -> Iterator[Update]:
        """Generate one answer (call with `lock` held). Stopping early is just stopping the iteration. With a prompt
        cache (and `keep`), the prefix it shares with the prompt is read from it first and the conversation is
        kept in it after, however the answer ended."""
        self.use_drafter()
        engine = self._engine()
        stream = TextStream(self.loaded.tokenizer, self.settings.stop)  # a stop string is not shown
        budget = max_new_tokens or self.settings.max_new_tokens
        cached, trouble = keep and self.prompt_cache is not None, None
        if cached:
            try:
                read_prompt_cache(engine, self.prompt_cache, prompt_ids)
            except OSError as error:  # cut short: the answer goes on, and the file is replaced
                trouble = f"--prompt-cache {self.prompt_cache} could not be read ({error}); it is written anew"
        events = engine.generate(prompt_ids, sampling=self._sampling(), max_new_tokens=budget, stop=self.settings.stop,
                                 constraint=self.settings.format.constraint(engine))  # fmt: skip
        try:
            for index, event in enumerate(events):
                if index:
                    self.recent_tau.append(len(event.tokens))
                pieces = [stream.add([token]) for token in event.tokens]
                if event.finish_reason is not None and pieces:  # what waited to be told from a stop string
                    pieces[-1] += stream.flush()
                yield Update(event, pieces, self._figures(engine, event))
                if engine.drafter is not None and self.ar.wants_sample(index, engine.length):
                    self.ar.add(engine.autoregressive_step_seconds(sampling=self.sampling, repeats=1), engine.length)
        finally:
            events.close()
            if cached:
                try:
                    write_prompt_cache(engine, self.prompt_cache)
                except OSError as error:  # a full disk: the answer stays, the chat goes on
                    trouble = f"--prompt-cache {self.prompt_cache} not written: {error.strerror or error}"
            if trouble is not None:
                raise SpecchatError(trouble)

    def settings_json(self) -> dict:
        return {
            "model": self.model_name,
            **dataclasses.asdict(self.settings),
            "sampling": dataclasses.asdict(self.sampling),
        }

    def apply_settings_json(self, saved: dict) -> None:
        """Settings from a saved chat; bad values are one-line errors. The model stays the one loaded, and so does
        the KV cache: it is how this model runs (an int8 cache saved on a CPU cannot run on a GPU)."""
        known = {f.name for f in dataclasses.fields(ChatSettings)} - {"kv_cache"}
        sampling = saved.get("sampling", {})
        if not isinstance(sampling, dict):
            raise SpecchatError("bad settings in the saved chat: sampling must be an object")
        fields = {f.name: f.type for f in dataclasses.fields(SamplingConfig)}
        sampling = dict(sampling)
        for name, value in sampling.items():
            if name not in fields:
                raise SpecchatError(f"bad settings in the saved chat: unknown sampling setting {name!r}")
            if "tuple" in fields[name]:  # token ids (suppress)
                if not (isinstance(value, list) and all(json_is(each, int) for each in value)):
                    raise SpecchatError(f"bad settings in the saved chat: sampling.{name} must be a list of token ids")
                sampling[name] = tuple(value)
                continue
            whole = "int" in fields[name]
            if not (json_is(value, int if whole else float) or name == "seed" and value is None):
                kind = "a whole number" if whole else "a number"
                raise SpecchatError(f"bad settings in the saved chat: sampling.{name} must be {kind}")
        saved = {k: v for k, v in saved.items() if k in known}
        if "format" in saved:
            saved["format"] = _saved_format(saved["format"])
        if isinstance(saved.get("stop"), list):  # JSON's form of the tuple
            saved["stop"] = tuple(saved["stop"])
        try:
            sampling = SamplingConfig(**sampling)
            settings = dataclasses.replace(self.settings, **saved)
        except ValueError as error:
            raise SpecchatError(f"bad settings in the saved chat: sampling.{error}") from None
        check_settings(settings)
        self.sampling = sampling
        self.update_settings(**{f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)})

    def _engine(self) -> Engine:
        if self.engine is None:
            window = self.loaded.model.config.max_position_embeddings
            context = min(self.settings.context or DEFAULT_CONTEXT, window)
            self.engine = Engine(self.loaded.model, self.loaded.tokenizer, max_len=context,
                                 kv_cache=self.settings.kv_cache)  # fmt: skip
            self.drafter_ready = False
        return self.engine

    def _eos_ids(self) -> frozenset[int]:
        return self._engine().eos_ids

    def _prompt_tokens(self, messages: list[Message]) -> int:
        return len(encode_chat(self.loaded.tokenizer, chat_messages(self.settings.system, messages)))

    def _fits(self, prompt_tokens: int) -> bool:
        """Whether a prompt this long leaves room for an answer (a quarter of the context, at most -n)."""
        capacity = self._engine().capacity
        return prompt_tokens + min(self.settings.max_new_tokens, capacity // 4) <= capacity

    def _figures(self, engine: Engine, event: StepEvent) -> Figures:
        """Takes the engine that produced `event`: a settings change may already have dropped `self.engine`."""
        stats = event.stats
        ar_seconds = None if engine.drafter is None else self.ar.seconds_at(engine.length)  # AR: no speedup
        policy = engine.policy
        budget = None if engine.drafter is None else policy.budget if policy else engine.fixed_budget
        memory, memory_kind = memory_in_use(engine.device)
        self.last_figures = Figures(
            tokens=stats.new_tokens,
            tau=stats.mean_accepted_length,
            acceptance_rate=stats.acceptance_rate,
            tokens_per_second=stats.tokens_per_second,
            ar_tokens_per_second=1 / ar_seconds if ar_seconds else None,
            ar_context=self.ar.context if ar_seconds else None,
            per_depth=tuple(stats.per_depth_acceptance),
            recent_tau=tuple(self.recent_tau),
            context_used=engine.length,
            context_max=engine.capacity,
            drafter=self.settings.drafter,
            budget=budget,
            adaptive=engine.drafter is not None and policy is not None,
            mean_budget=stats.mean_budget,
            memory_bytes=memory,
            memory_kind=memory_kind,
            prompt_tokens=stats.prompt_tokens,
            reused_tokens=stats.reused_tokens,
            prefill_seconds=stats.prefill_seconds,
        )
        return self.last_figures


def _saved_format(saved: object) -> AnswerFormat:
    """A saved chat's answer format, checked as the command line checks one."""
    from specchat.constraints import Grammar, GrammarError, JsonSchema, SchemaError

    fields = {f.name for f in dataclasses.fields(AnswerFormat)}
    if not isinstance(saved, dict) or not set(saved) <= fields:
        raise SpecchatError(f"bad settings in the saved chat: format must be an object of {', '.join(sorted(fields))}")
    try:
        held = AnswerFormat(**saved)
        if not isinstance(held.json, bool):
            raise TypeError("json must be true or false")
        if held.schema is not None:
            JsonSchema(held.schema)
        for text, regex in ((held.grammar, False), (held.regex, True)):
            if text is not None:
                Grammar.from_regex(text) if regex else Grammar.from_gbnf(text)
    except (TypeError, GrammarError, SchemaError) as error:
        raise SpecchatError(f"bad settings in the saved chat: format: {error}") from None
    return held
