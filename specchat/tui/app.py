"""The chat app: a conversation, the acceptance overlay and an input line, around one `ChatSession`.

The model loads and every answer is generated in worker threads; the UI thread only renders. Answers
arrive through an `AnswerStream`, drained and redrawn as often as the UI's share of the CPU allows.
"""

from __future__ import annotations

import gc
import time
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.timer import Timer
from textual.widgets import Footer

from specchat import STARTED, first_use
from specchat.errors import SpecchatError, unexpected
from specchat.tui.answer_stream import AnswerEnd, AnswerStream, Status
from specchat.tui.chat_input import ChatInput
from specchat.tui.colours import legend
from specchat.tui.commands import BY_NAME, CommandSpec, parse_command
from specchat.tui.conversation import Conversation, Note
from specchat.tui.help_screen import HelpScreen
from specchat.tui.message_view import MessageView
from specchat.tui.overlay import NARROW, AcceptanceOverlay
from specchat.tui.palette import SlashCommands
from specchat.tui.redraw_budget import RedrawBudget
from specchat.tui.session import ChatSession, ChatSettings, ModelLoader
from specchat.tui.transcript import default_chat_path, load_chat, save_chat

RENDER_HZ = 15  # most redraws of the streaming answer per second (fewer where frames are slow: RedrawBudget)
OVERLAY_HZ = 4  # most redraws of the overlay per second while an answer streams: its numbers are read, not watched
QUIT_WAIT_SECONDS = 30  # at most this long at quit for a stopped answer's prompt cache to be written


class ChatApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "specchat"
    COMMANDS = App.COMMANDS | {SlashCommands}
    BINDINGS: ClassVar[list[Binding]] = [  # keys that never type text: the input keeps every printable key
        Binding("escape", "escape", "stop / leave input"),
        Binding("f1", "help", "help"),
        Binding("f2", "toggle_overlay", "overlay"),
        Binding("ctrl+t", "toggle_view", "colours/markdown"),
    ]

    def __init__(self, loader: ModelLoader, settings: ChatSettings, prompt_cache: Path | None = None):
        super().__init__()
        self.loader = loader
        self.initial_settings = settings
        self.prompt_cache = prompt_cache  # `--prompt-cache`: the conversation's keys and values kept in a file
        self.session: ChatSession | None = None
        self.answer: AnswerStream | None = None  # the answer streaming now
        self.question: MessageView | None = None  # the user's message the streaming answer replies to
        self.reply: MessageView | None = None
        self.plain = False
        self.error: str | None = None  # why the app gave up (a failed load), for the command line
        self._loading: Note | None = None  # the line that shows load progress, then "ready"
        self._stage = "loading the model"  # what the load is doing, shown with the time since the process began
        self._clock: Timer | None = None  # ticks the loading line
        self._waiting: tuple[str, Note] | None = None  # a message sent while loading, and the note saying so
        self._pump: Timer | None = None
        self._status: Note | None = None  # what one-time work the streaming answer waits on says (a download)
        self._redraws: RedrawBudget | None = None  # paces the streaming answer's redraws
        self._overlay_drawn = 0.0  # when the overlay last showed a streaming answer's figures

    @property
    def generating(self) -> bool:
        return self.answer is not None

    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            yield Conversation(id="conversation")
            yield AcceptanceOverlay(id="overlay")
        yield ChatInput(id="input")
        yield Footer()

    def on_mount(self) -> None:
        conversation = self.query_one(Conversation)
        conversation.border_subtitle = legend()
        self._loading = conversation.add_note("")
        self._tick()
        self._clock = self.set_interval(0.1, self._tick)
        self.query_one(ChatInput).focus()  # the input owns the keyboard from the first frame
        self._load()

    # Loading

    def _tick(self) -> None:
        self._loading.update(f"{self._stage}… ({time.perf_counter() - STARTED:.1f} s)")

    @work(thread=True, exclusive=True, group="load")
    def _load(self) -> None:
        def progress(stage: str) -> None:
            self.call_from_thread(setattr, self, "_stage", stage)

        first_use.tell(progress)  # a first run's one-time work shows in the loading line, not on a hidden stderr
        try:
            loaded, sampling = self.loader(progress)
            session = ChatSession(loaded, sampling, self.initial_settings, self.prompt_cache)
            progress("warming up (the first time on this machine also times verification)")
            session.warm_up()
        except SpecchatError as error:
            self.call_from_thread(self._load_failed, str(error))
        except Exception as error:  # noqa: BLE001 - e.g. a broken checkpoint: one line, then a clean exit
            self.call_from_thread(self._load_failed, unexpected(error))
        else:
            self.call_from_thread(self._loaded, session)
        finally:
            first_use.tell(None)  # later one-time work (another drafter's calibration) must not reach a closed app

    def _loaded(self, session: ChatSession) -> None:
        gc.freeze()  # the model's and the app's objects: the collector stops rescanning them (a third of a frame)
        self._clock.stop()
        self.session = session
        loaded = session.loaded
        stretch = f", window x{loaded.yarn:g} by YaRN" if loaded.yarn else ""
        window, asked = loaded.model.config.max_position_embeddings, session.settings.context
        past = (f" --context {asked} holds {window} tokens, the model's window"
                f"{'' if loaded.yarn else ' (--yarn F stretches it F times)'}." if asked and asked > window else "")
        self._loading.update(
            f"{session.model_name} ({loaded.weights} weights, {loaded.dtype}{stretch}) ready on {loaded.model.device} "
            f"in {time.perf_counter() - STARTED:.1f} s.{past} /help lists the commands."
        )
        self._show_settings()
        if self._waiting is not None:
            line, note = self._waiting
            self._waiting = None
            note.remove()
            self._ask(line)

    def _load_failed(self, message: str) -> None:
        self._clock.stop()
        self.error = message
        self._loading.update(Text(f"error: {message}  (quitting…)", style="bold red"))
        self._loading.add_class("error")
        self.set_timer(3, self.exit)

    # Input

    @on(ChatInput.Submitted)
    def _submitted(self, event: ChatInput.Submitted) -> None:
        line = event.value.strip()
        if not line:
            return
        chat_input = self.query_one(ChatInput)
        if not line.startswith("/") and (self.generating or self._waiting is not None):
            self._note("an answer is still on its way: wait, or press Esc to stop it", error=True)
            return  # the text stays in the input, to send once the answer is done
        chat_input.remember(line)
        chat_input.value = ""
        if line.startswith("/"):
            self._run_command(line)
        elif self.session is None:
            first, *more = line.splitlines()
            shown = f"{first}{'…' if more else ''}"
            self._waiting = line, self._note(f"“{shown}” is answered as soon as the model is ready")
        else:
            self._ask(line)

    def on_key(self, event) -> None:
        """A printable key no widget took goes to the input: typed after Esc, or before the first frame (such
        keys reach the app even once the input has focus)."""
        chat_input = self.query_one(ChatInput)
        if event.is_printable and event.character and self.screen is self.screen_stack[0]:
            chat_input.focus()
            chat_input.insert(event.character)
            event.stop()

    def choose_command(self, spec: CommandSpec) -> None:
        """From the command palette: run it, or type it into the input when it takes an argument."""
        if spec.takes_argument:
            chat_input = self.query_one(ChatInput)
            chat_input.value = f"/{spec.name} "
            chat_input.focus()
        else:
            self._run_command(f"/{spec.name}")

    # Answers

    def _ask(self, text: str) -> None:
        try:
            user, reply, prompt_ids, dropped = self.session.begin_turn(text)
        except SpecchatError as error:
            self._note(f"error: {error}", error=True)
            return
        if dropped:
            self._note(f"the context is full: the {dropped} oldest messages above no longer reach the model "
                       "(the system prompt stays)")  # fmt: skip
        conversation = self.query_one(Conversation)
        self.question = conversation.add_message(user, speaker="you")
        self.reply = conversation.add_message(reply, speaker=self.session.model_name, plain=self.plain)
        conversation.anchor()
        self.answer = AnswerStream()
        self.call_after_refresh(self._start_answer, self.answer, prompt_ids)

    def _start_answer(self, answer: AnswerStream, prompt_ids: list[int]) -> None:
        """Generate once the new messages are on screen, so laying them out takes no CPU time from the decode."""
        self._redraws = RedrawBudget()
        self._pump = self.set_interval(1 / RENDER_HZ, self._render_answer)
        self._generate(answer, prompt_ids)

    @work(thread=True, exclusive=True, group="generate")
    def _generate(self, answer: AnswerStream, prompt_ids: list[int]) -> None:
        answer.produce(self.session, prompt_ids)

    def _render_answer(self) -> None:
        """Apply every step that arrived since the last frame, then redraw once: when the redraw budget allows,
        and at once for the answer's first tokens and its end."""
        reply, overlay = self.reply, self.query_one(AcceptanceOverlay)
        if not (self.answer.ended or not reply.message.pieces or self._redraws.allows()):
            return
        figures = None
        for item in self.answer.drain():
            if isinstance(item, Status):  # the answer waits on one-time work: one note says how it goes
                self._status = self._status or self._note("")
                self._status.update(item.line)
                continue
            if isinstance(item, AnswerEnd):
                self._finish_answer(item)
                return
            reply.message.extend(item.event.tokens, item.event.origins, item.pieces)
            figures = item.figures
        if figures is not None:
            reply.refresh_message()
            if time.monotonic() - self._overlay_drawn >= 1 / OVERLAY_HZ:
                overlay.figures = figures
                self._overlay_drawn = time.monotonic()

    def _finish_answer(self, end: AnswerEnd) -> None:
        self._pump.stop()
        self._status = None  # its last line stays
        question, reply, session = self.question, self.reply, self.session
        self.answer = self.question = self.reply = None
        if end.error is not None and not reply.message.token_ids:
            session.abandon_turn()  # nothing was generated: as if the message was never sent
            question.remove()
            reply.remove()
        else:
            reply.message.finish = end.finish
            if session.last_figures is not None:
                reply.message.stats = session.last_figures.summary()
                self.query_one(AcceptanceOverlay).figures = session.last_figures
            reply.refresh_message()
        if end.error is not None:
            self._note(f"error: {end.error}", error=True)

    # Keys

    def action_escape(self) -> None:
        if self.generating:
            self.answer.stop()
        elif isinstance(self.focused, ChatInput):
            self.query_one(Conversation).focus()  # to scroll with the keys; typing comes back to the input

    def on_resize(self, event) -> None:
        narrow = event.size.width < NARROW
        if narrow != self.has_class("narrow"):
            self.set_class(narrow, "narrow")
            self.query_one(AcceptanceOverlay).display = not narrow  # F2 still shows it, under the conversation

    def action_toggle_overlay(self) -> None:
        overlay = self.query_one(AcceptanceOverlay)
        overlay.display = not overlay.display

    def action_toggle_view(self) -> None:
        self.plain = not self.plain
        self.query_one(Conversation).set_plain(self.plain)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def on_unmount(self) -> None:
        """However the app ends (Ctrl+Q, /quit, an error), tell a streaming answer to stop: its thread ends
        after the step in flight instead of generating on to the token limit. With a prompt cache the app waits
        for it to end, so that the conversation is written whole before the process exits."""
        if self.generating:
            self.answer.stop()
            if self.prompt_cache is not None:
                self.answer.wait(QUIT_WAIT_SECONDS)

    # Commands

    def _run_command(self, line: str) -> None:
        """Parse and carry out a slash command; any problem is an inline error, never a crash."""
        try:
            command = parse_command(line)
            if BY_NAME[command.name].needs_idle and self.generating:
                raise SpecchatError(f"/{command.name} waits until the answer is done (Esc stops it)")
            if self.session is None and command.name not in ("help", "quit"):
                raise SpecchatError("the model is still loading")
            getattr(self, f"_command_{command.name}")(command.value)
        except SpecchatError as error:
            self._note(f"error: {error}", error=True)

    def _command_system(self, text: str | None) -> None:
        self.session.update_settings(system=text)
        self._note(f"system prompt: {text}" if text else "system prompt: the model's default")

    def _command_temp(self, value: float) -> None:
        self.session.sampling = replace(self.session.sampling, temperature=value)
        self._show_settings()
        self._note(f"temperature {value:g}" + (" (greedy)" if value == 0 else "") + ", from the next answer")

    def _command_drafter(self, name: str) -> None:
        self.session.choose_drafter(name)
        self._show_settings()
        self._note(f"drafter {name}, from the next answer")

    def _command_budget(self, budget: int | None) -> None:
        self.session.update_settings(draft_budget=budget)
        self._show_settings()
        self._note(f"draft budget {budget or 'auto'}, from the next answer")

    def _command_format(self, held) -> None:
        self.session.update_settings(format=held)
        self._show_settings()
        self._note(f"answers held to {held.label()}, from the next answer" if not held.free else "answers in free text")

    def _command_stop(self, strings: tuple[str, ...]) -> None:
        self.session.update_settings(stop=strings)
        listed = ", ".join(repr(each) for each in strings)
        self._note(f"answers end before {listed}, from the next answer" if strings else "no stop strings")

    def _command_retry(self, _) -> None:
        """The last turn forgotten and its message asked again: the cache holds the conversation up to it, so only
        the answer is computed anew."""
        question = self.session.retry()
        for view in list(self.query(MessageView))[-2:]:
            view.remove()
        self._ask(question)

    def _command_clear(self, _) -> None:
        self.session.reset()
        self.query_one(Conversation).clear()
        self.query_one(AcceptanceOverlay).figures = None
        self._note("new conversation")

    def _command_save(self, path: Path | None) -> None:
        path = (path or default_chat_path()).expanduser().absolute()
        save_chat(path, self.session.messages, self.session.settings_json())
        self._note(f"saved {len(self.session.messages)} messages to {path}")

    def _command_load(self, path: Path) -> None:
        messages, settings = load_chat(path)
        self.session.apply_settings_json(settings)
        dropped = self.session.reset(messages)
        conversation = self.query_one(Conversation)
        conversation.clear()
        for message in self.session.messages:
            speaker = "you" if message.role == "user" else settings.get("model", self.session.model_name)
            conversation.add_message(message, speaker=speaker, plain=self.plain)
        self.query_one(AcceptanceOverlay).figures = None
        self._show_settings()
        if dropped:
            capacity = self.session.engine.capacity
            self._note(f"loaded the last {len(messages) - dropped} of {len(messages)} messages from {path}: the "
                       f"context holds {capacity} tokens with room for an answer")  # fmt: skip
        else:
            self._note(f"loaded {len(messages)} messages from {path}")

    def _command_stats(self, _) -> None:
        figures = self.session.last_figures
        if figures is None:
            self._note("no answer yet")
            return
        self._note(figures.describe())

    def _command_help(self, _) -> None:
        self.action_help()

    def _command_quit(self, _) -> None:
        self.exit()

    # Helpers

    def _note(self, text: str, *, error: bool = False) -> Note:
        conversation = self.query_one(Conversation)
        note = conversation.add_note(text, error=error)
        conversation.anchor()
        return note

    def _show_settings(self) -> None:
        session = self.session
        settings, sampling = session.settings, session.sampling
        budget = "" if settings.drafter == "none" else f" (budget {settings.draft_budget or 'auto'})"
        temperature = "greedy" if sampling.greedy else f"T {sampling.temperature:g}"
        held = "" if settings.format.free else f" · {settings.format.label()}"
        self.query_one(Conversation).border_title = (f"{session.model_name} · {settings.drafter}{budget} · "
                                                     f"{temperature}{held}")  # fmt: skip
