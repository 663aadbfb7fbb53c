"""The chat app driven through Textual's pilot: streaming, colours by origin, Esc, commands, save/load.

A 2-layer random Llama with the default model's tokenizer answers fast; the real default model answers
where real text matters (n-gram drafts are only accepted on text that repeats).
"""

from __future__ import annotations

import json
import statistics
import time

import pytest
import torch
from conftest import tiny_model
from rich.markdown import Markdown
from textual.events import Paste
from tui_harness import ask, make_app, note_lines, ready, send, tiny_loaded, wait_until

from specchat.answer_format import AnswerFormat
from specchat.engine.attention import use_attention
from specchat.engine.cache import Int8KVLayer
from specchat.engine.events import COPY, TARGET
from specchat.engine.generate import Engine
from specchat.engine.sampling import SamplingConfig
from specchat.errors import SpecchatError
from specchat.loading import LoadedModel, ModelSource
from specchat.quant.quantize import quantize_model
from specchat.tui.app import RENDER_HZ
from specchat.tui.ar_baseline import SAMPLES
from specchat.tui.chat_input import ChatInput
from specchat.tui.colours import DRAFT_STYLES, coloured
from specchat.tui.conversation import Conversation
from specchat.tui.help_screen import HelpScreen
from specchat.tui.message_view import MessageView, footer_line
from specchat.tui.overlay import AcceptanceOverlay
from specchat.tui.redraw_budget import RedrawBudget
from specchat.tui.session import ChatSettings, check_settings

pytestmark = pytest.mark.asyncio


@pytest.fixture(scope="module")
def tiny(tokenizer):
    return tiny_loaded(tokenizer)


def greedy_reference(loaded, prompt_ids: list[int], n: int, kv_cache: str = "auto") -> list[int]:
    """Target-only greedy decoding of `prompt_ids`: what every chat answer must equal at temperature 0."""
    engine = Engine(loaded.model, loaded.tokenizer, max_len=len(prompt_ids) + n, kv_cache=kv_cache)
    return [t for event in engine.generate(prompt_ids, max_new_tokens=n) for t in event.tokens]


async def test_type_send_and_stream_in_batches(tiny, monkeypatch):
    refreshes = []
    original = MessageView.refresh_message
    monkeypatch.setattr(
        MessageView, "refresh_message", lambda self: (refreshes.append(time.monotonic()), original(self))
    )
    app = make_app(tiny, drafter="ngram", max_new_tokens=120)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await pilot.press(*"hello there", "enter")
        await wait_until(pilot, lambda: not app.generating, what="the answer")
        await pilot.pause()
        user, answer = app.session.messages
        assert (user.role, user.text) == ("user", "hello there")
        assert answer.finish == "length" and len(answer.token_ids) == 120
        assert answer.token_ids == greedy_reference(tiny, app.session.previous.ids, 120)  # lossless in the chat
        assert app.session.last_figures.reused_tokens > 0  # the warm-up left the template's head in the cache
        samples = app.session.ar.samples  # the speedup's autoregressive steps, timed during this answer
        assert len(samples) == SAMPLES
        assert app.session.last_figures.ar_tokens_per_second == pytest.approx(1 / statistics.median(samples))
        view = app.query(MessageView).last()
        assert view.body.plain == answer.text == "".join(answer.pieces)  # nothing dropped or reordered
        assert answer.text == tiny.tokenizer.decode(answer.token_ids, skip_special_tokens=True)
        steps = answer.stats["tokens"]
        assert steps == 120
    streaming = [t for t in refreshes if t <= refreshes[-1]]
    duration = streaming[-1] - streaming[0]
    assert len(streaming) <= RENDER_HZ * duration + 3  # batched: never more than RENDER_HZ redraws a second


async def test_an_answer_without_redraw_budget_shows_its_first_tokens_and_its_end(tiny, monkeypatch):
    """The budget only thins the redraws in between: the first tokens show at once, the end completely."""
    shown = []
    original = MessageView.refresh_message
    monkeypatch.setattr(MessageView, "refresh_message", lambda self: (original(self), shown.append(self.body.plain)))
    monkeypatch.setattr("specchat.tui.app.RedrawBudget", lambda: RedrawBudget(share=0.0))
    app = make_app(tiny, drafter="none", max_new_tokens=1500)  # longer than one frame of the pump
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        shown.clear()
        await pilot.press(*"hello", "enter")
        await wait_until(pilot, lambda: not app.generating, what="the answer")
        answer = app.session.messages[-1]
    answer_frames = [text for text in shown if text]
    assert len(answer_frames) == 2  # the first tokens, then everything at the end
    everything = coloured(answer.pieces, answer.origins).plain  # as the view shows it (control codes dropped)
    assert everything.startswith(answer_frames[0]) and len(answer_frames[0]) < len(everything)
    assert answer_frames[1] == everything


@pytest.mark.slow
async def test_accepted_drafts_are_coloured_by_origin_and_keep_colours(default_model):
    app = make_app(default_model, drafter="ngram", max_new_tokens=48)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        answer = await ask(pilot, "Repeat this list twice: apple, pear, plum, fig, kiwi, lime, date.")
        lookups = [origin for origin in ("ngram", COPY) if origin in answer.origins]  # short matches, copies
        assert TARGET in answer.origins and lookups
        view = app.query(MessageView).last()
        by_style = {}
        for span in view.body.spans:
            by_style.setdefault(str(span.style), []).append(view.body.plain[span.start : span.end])
        for origin in lookups:
            drafted = "".join(p for p, o in zip(answer.pieces, answer.origins) if o == origin)
            assert "".join(by_style.pop(DRAFT_STYLES[origin], [])) == drafted  # pieces may all be empty
        assert not by_style  # target tokens carry no style at all
        await pilot.press("ctrl+t")  # plain Markdown, from the input
        assert isinstance(view.content.renderables[1], Markdown)
        await pilot.press("ctrl+t")  # and back: the finished message kept its colours
        assert view.content.renderables[1] is view.body and view.body.spans


async def test_escape_stops_at_once_keeps_the_answer_and_the_next_turn_reuses_the_cache(default_model):
    """The real model answers for long enough (3000 tokens, over 10 s here) that every key lands mid-answer."""
    app = make_app(default_model, drafter="ngram", max_new_tokens=3000)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await send(pilot, "Tell me a very long story about the sea.")
        await wait_until(pilot, lambda: len(app.session.messages[-1].token_ids) >= 1, what="the first tokens")
        for line in ("/save", "/clear", "hello?"):  # nothing that needs the finished answer runs meanwhile
            await send(pilot, line)
        errors = note_lines(app, errors=True)
        assert "/save waits until the answer is done" in errors[0] and "/clear waits" in errors[1]
        assert "still on its way" in errors[2]
        assert app.query_one(ChatInput).value == "hello?"  # kept, to send once the answer is done
        await pilot.press("escape")
        await wait_until(pilot, lambda: not app.generating, timeout=5, what="the stop")
        await pilot.pause()
        first = app.session.messages[-1]
        assert first.finish == "stopped" and 1 <= len(first.token_ids) < 3000
        assert "stopped (Esc)" in footer_line(first)
        engine = app.session.engine
        committed = list(engine.ids)
        assert committed[-len(first.token_ids) :] == first.token_ids  # every committed token reached the UI
        held = engine.length

        await send(pilot, "And then?")
        # the first tokens are drawn at once, later ones as the redraw budget allows (rarely on a busy machine)
        await wait_until(pilot, lambda: len(app.session.messages[-1].token_ids) >= 1, what="the second answer")
        assert app.session.last_figures.reused_tokens >= held - 1  # earlier turns were not prefilled again
        await pilot.press("escape")
        await wait_until(pilot, lambda: not app.generating, timeout=5, what="the second stop")
        second = app.session.messages[-1]
        assert second.token_ids == greedy_reference(default_model, app.session.previous.ids, len(second.token_ids))


async def test_what_an_answer_waits_on_shows_in_one_note(default_model):
    """One-time work said during an answer (a drafter's download after /drafter, through `first_use`) redraws one
    note under the reply, its last line kept."""
    app = make_app(default_model, drafter="ngram", max_new_tokens=3000)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await send(pilot, "Tell me a very long story about the sea.")
        await wait_until(pilot, lambda: len(app.session.messages[-1].token_ids) >= 1, what="the first tokens")
        before = len(note_lines(app))
        for line in ("model.safetensors:  50%|#####     | 1.0M/2.0M", "model.safetensors: 100%|##########| 2.0M/2.0M"):
            app.answer.say(line)
        await pilot.press("escape")
        await wait_until(pilot, lambda: not app.generating, timeout=5, what="the stop")
        notes = note_lines(app)
        assert len(notes) == before + 1 and notes[-1].startswith("model.safetensors: 100%")


async def test_quitting_mid_answer_stops_the_answer(default_model):
    """Ctrl+Q while the real model streams a 3000-token answer: its thread stops after the step in flight
    instead of generating on to the limit (minutes here) while the app waits to end."""
    app = make_app(default_model, drafter="none", max_new_tokens=3000)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await send(pilot, "Tell me a very long story about the sea.")
        await wait_until(pilot, lambda: len(app.session.messages[-1].token_ids) >= 1, what="the first tokens")
        answer = app.answer
        await pilot.press("ctrl+q")
    deadline = time.monotonic() + 10
    while not answer.ended and time.monotonic() < deadline:
        time.sleep(0.05)
    assert answer.ended and len(app.session.engine.ids[: app.session.engine.length]) < 2000


async def test_save_then_load_round_trips_messages_settings_and_origins(default_model, tmp_path):
    app = make_app(default_model, drafter="ngram", max_new_tokens=24)
    path = tmp_path / "chat.json"
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await send(pilot, "/temp 0")
        await send(pilot, "/system You are terse.")
        first = await ask(pilot, "Repeat: red, green, blue, red, green, blue.")
        saved = [json.loads(json.dumps(m.__dict__)) for m in app.session.messages]
        await send(pilot, f"/save {path}")
        await send(pilot, "/temp 0.7")
        await send(pilot, "/clear")
        assert app.session.messages == [] and not app.query(MessageView)
        await send(pilot, f"/load {path}")
        assert [m.__dict__ for m in app.session.messages] == saved
        assert app.session.sampling.temperature == 0 and app.session.settings.system == "You are terse."
        views = list(app.query(MessageView))
        assert [v.message.role for v in views] == ["user", "assistant"]
        assert views[1].body.plain == first.text and len(views[1].body.spans) == sum(
            1 for i, o in enumerate(first.origins) if o != TARGET and first.pieces[i]
        )
        answer = await ask(pilot, "Once more.")  # the loaded chat goes on
        assert answer.token_ids and answer.finish in ("eos", "length")
    data = json.loads(path.read_text())
    assert data["format"] == "specchat-chat/1" and data["settings"]["drafter"] == "ngram"


async def test_answers_held_to_a_grammar_or_a_schema_and_the_format_saved(default_model, tmp_path):
    """`/format FILE`: a GBNF grammar, then a JSON Schema, hold the answers (drafted, the default drafter); the
    format is shown, saved with the chat and loaded back."""
    grammar, schema = tmp_path / "answer.gbnf", tmp_path / "flag.json"
    grammar.write_text('root ::= "Yes." | "No."')
    flag = {"type": "object", "properties": {"blue": {"type": "boolean"}}, "required": ["blue"]}
    schema.write_text(json.dumps(flag))
    app = make_app(default_model, drafter="ngram", max_new_tokens=160)  # room for any whitespace JSON allows
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await send(pilot, f"/format {grammar}")
        assert (await ask(pilot, "Is the sky blue?")).text in ("Yes.", "No.")
        await send(pilot, f"/format {schema}")
        assert "JSON mode" in app.query_one(Conversation).border_title
        assert list(json.loads((await ask(pilot, "Is the sky blue? Answer in JSON.")).text)) == ["blue"]
        await send(pilot, f"/save {tmp_path / 'chat.json'}")
        await send(pilot, "/format text")
        assert app.session.settings.format.free
        await send(pilot, f"/load {tmp_path / 'chat.json'}")
        assert app.session.settings.format == AnswerFormat(json=True, schema=flag)


async def test_a_chat_on_an_int8_cache_answers_over_it_and_keeps_it_through_a_load(tokenizer, tmp_path):
    """`chat --kv-cache int8`: the engine's cache is int8 and the answers are plain decoding's over it. The KV
    cache is how the loaded model runs, as its dtype is: a saved chat records it, and loading one (here, one
    saved before the setting existed) keeps the command line's."""
    with pytest.raises(SpecchatError, match="invalid --kv-cache 'q4'; use auto, bf16, int8"):
        check_settings(ChatSettings(kv_cache="q4"))
    model = tiny_model("llama", head_dim=64).to(torch.bfloat16)  # the compiled CPU decoder runs it (int8 cache:
    quantize_model(model, "int4", dtype=torch.bfloat16)  # weights whose rows it computes independently)
    use_attention(model, "canonical")
    loaded = LoadedModel(model, tokenizer, ModelSource("tiny-llama", "tiny-llama"), 0.0)
    app = make_app(loaded, drafter="ngram", max_new_tokens=40, kv_cache="int8")
    path, old = tmp_path / "chat.json", tmp_path / "old.json"
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        answer = await ask(pilot, "hello there")
        assert {type(layer) for layer in app.session.engine.cache.layers} == {Int8KVLayer}
        assert answer.token_ids == greedy_reference(loaded, app.session.previous.ids, 40, kv_cache="int8")
        await send(pilot, f"/save {path}")
        saved = json.loads(path.read_text())
        assert saved["settings"]["kv_cache"] == "int8"
        del saved["settings"]["kv_cache"]
        old.write_text(json.dumps(saved))
        await send(pilot, f"/load {old}")
        assert not note_lines(app, errors=True) and len(app.session.messages) == 2
        assert (await ask(pilot, "and again")).finish == "length"
        assert app.session.settings.kv_cache == "int8"
        assert {type(layer) for layer in app.session.engine.cache.layers} == {Int8KVLayer}


BAD_COMMANDS = [
    ("/nope", "unknown command '/nope'"),
    ("/temp hot", "/temp takes a number"),
    ("/temp -1", "/temp takes a number"),
    ("/budget 0", "/budget takes 1..64"),
    ("/drafter eagle", "unknown drafter 'eagle'"),
    ("/drafter glide", "pass a checkpoint directory with /drafter glide:PATH"),  # the chat's command, not the flag
    ("/drafter none:x", "use /drafter none"),
    ("/clear now", "/clear takes no argument"),
    ("/load", "/load needs a file"),
    ("/load /no/such/chat.json", "could not read"),
    ("/format", "/format takes text, json or a file"),
    ("/format /no/such/list.gbnf", "/format: cannot read /no/such/list.gbnf"),
]


async def test_bad_commands_are_inline_errors(tiny):
    app = make_app(tiny, max_new_tokens=4)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        for line, needle in BAD_COMMANDS:
            await send(pilot, line)
            assert needle in note_lines(app, errors=True)[-1], (line, note_lines(app))
            assert app.is_running
        answer = await ask(pilot, "still there?")  # and the chat still works
        assert len(answer.token_ids) == 4


async def test_loading_a_file_that_is_not_a_chat_is_an_inline_error(tiny, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "specchat-chat/1", "settings": {"drafter": "eagle"}, "messages": []}))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    app = make_app(tiny, max_new_tokens=4)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await send(pilot, f"/load {bad}")
        await send(pilot, f"/load {broken}")
        errors = note_lines(app, errors=True)
        assert any("unknown drafter 'eagle'" in e for e in errors) and any("is not JSON" in e for e in errors)
        assert app.session.settings.drafter == "ngram"


@pytest.mark.parametrize(
    "settings, messages, needle",
    [
        ({"sampling": {"temperature": "hot"}}, [], "sampling.temperature must be a number"),
        ({"sampling": {"top_k": 2.5}}, [], "sampling.top_k must be a whole number"),
        ({"sampling": {"top_p": 7}}, [], "sampling.top_p must be in (0, 1]"),
        ({"sampling": {"heat": 1}}, [], "unknown sampling setting 'heat'"),
        ({"context": "big"}, [], "the context must hold"),
        ({}, [{"role": "user", "text": 5}], "message 1: text must be a string"),
        ({}, [{"role": "assistant", "text": "x", "token_ids": ["a"], "pieces": ["x"], "origins": ["target"]}],
         "every entry of token_ids must be a whole number"),
        ({}, [{"role": "user", "text": "hi", "mood": "good"}], "unknown field 'mood'"),
    ],
)
async def test_a_saved_chat_with_wrong_types_is_one_line(tiny, tmp_path, settings, messages, needle):
    path = tmp_path / "chat.json"
    path.write_text(json.dumps({"format": "specchat-chat/1", "settings": settings, "messages": messages}))
    app = make_app(tiny, max_new_tokens=4)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await send(pilot, f"/load {path}")
        errors = note_lines(app, errors=True)
        assert len(errors) == 1 and needle in errors[0] and "not supported" not in errors[0], errors


async def test_an_answer_with_only_text_loads_as_a_finished_answer(tiny, tmp_path):
    path = tmp_path / "chat.json"
    messages = [{"role": "user", "text": "Hi"}, {"role": "assistant", "text": "Hello! How can I help?"}]
    path.write_text(json.dumps({"format": "specchat-chat/1", "settings": {}, "messages": messages}))
    app = make_app(tiny, max_new_tokens=4)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await send(pilot, f"/load {path}")
        view = app.query(MessageView).last()
        assert view.message.finish == "loaded" and "answering" not in footer_line(view.message)
        assert "Hello! How can I help?" in str(view.content.renderables[1])
        answer = await ask(pilot, "Thanks.")  # the chat goes on from the loaded text
        assert len(answer.token_ids) == 4


async def test_save_without_a_name_writes_to_the_data_directory(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    app = make_app(tiny, max_new_tokens=4)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await ask(pilot, "hi")
        await send(pilot, "/save")
        saved = list((tmp_path / "data" / "specchat" / "chats").glob("chat-*.json"))
        assert len(saved) == 1 and not list(tmp_path.glob("*.json"))  # not in the current directory
        assert any(f"saved 2 messages to {saved[0]}" in line for line in note_lines(app))


async def test_input_history_walks_back_and_forth(tiny):
    app = make_app(tiny)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        for line in ("/temp 0.5", "/budget 4", "/drafter none"):
            await send(pilot, line)
        chat_input = app.query_one(ChatInput)
        chat_input.value = "half typed"
        await pilot.press("up")
        assert chat_input.value == "/drafter none"
        await pilot.press("up", "up", "up")
        assert chat_input.value == "/temp 0.5"
        await pilot.press("down")
        assert chat_input.value == "/budget 4"
        await pilot.press("down", "down")
        assert chat_input.value == "half typed"
        assert app.session.settings.drafter == "none" and app.session.settings.draft_budget == 4


async def test_pasted_code_keeps_its_lines_and_reaches_the_model_whole(tiny):
    """Textual's one-line Input kept a paste's first line only: code asked about lost all but its first line."""
    code = "def add(a, b):\n    return a + b\n\nprint(add(1, 2))"
    app = make_app(tiny, max_new_tokens=4)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await pilot.press(*"Explain:", "shift+enter")
        app.post_message(Paste(code))  # as the terminal delivers it: to the app, which gives it to the focus
        await pilot.pause()
        assert app.query_one(ChatInput).value == "Explain:\n" + code
        assert app.query_one(ChatInput).size.height == 5  # the box grew to its five lines
        await pilot.press("enter")
        await wait_until(pilot, lambda: not app.generating, what="the answer")
        assert app.session.messages[0].text == "Explain:\n" + code
        assert "\n    return a + b\n" in tiny.tokenizer.decode(app.session.previous.ids)
        assert app.query_one(ChatInput).value == ""


async def test_a_backslash_before_enter_starts_a_new_line_in_any_terminal(tiny):
    app = make_app(tiny, max_new_tokens=4)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await pilot.press(*"first\\", "enter", *"second", "enter")
        await wait_until(pilot, lambda: not app.generating, what="the answer")
        assert app.session.messages[0].text == "first\nsecond"


async def test_up_and_down_move_within_a_message_and_walk_the_history_at_its_edges(tiny):
    app = make_app(tiny)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await send(pilot, "/system be brief\nand kind")
        assert app.session.settings.system == "be brief\nand kind"  # a command's argument keeps its lines
        chat_input = app.query_one(ChatInput)
        await pilot.press(*"one", "shift+enter", *"two")
        await pilot.press("up")  # from the second line to the first
        assert chat_input.value == "one\ntwo" and chat_input.cursor_location[0] == 0
        await pilot.press("up")  # on the first line: the history
        assert chat_input.value == "/system be brief\nand kind"
        await pilot.press("down", "down")  # to its last line, then back to the message being typed
        assert chat_input.value == "one\ntwo"


async def test_retry_answers_the_last_message_again_from_the_cache(tiny):
    app = make_app(tiny, max_new_tokens=12)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await send(pilot, "/retry")
        assert "no answer to retry yet" in note_lines(app, errors=True)[-1]
        first = await ask(pilot, "hello there")
        await send(pilot, "/retry")
        await wait_until(pilot, lambda: not app.generating, what="the answer again")
        await pilot.pause()
        user, again = app.session.messages
        assert (user.text, again.role) == ("hello there", "assistant") and len(app.query(MessageView)) == 2
        assert again.token_ids == first.token_ids  # greedy: the same answer
        figures = app.session.last_figures
        assert figures.reused_tokens == figures.prompt_tokens - 1  # the conversation up to it, from the cache


async def test_a_seeded_chat_s_retry_is_another_answer_and_the_same_chat_the_same_text(tiny):
    """Every draw is keyed by the seed and the token's place, so the same question asked again with the same seed
    would be the same answer: a retry draws with the seed plus the retries so far."""
    seeded = SamplingConfig(temperature=1.0, seed=3)

    async def answers(retry: bool) -> list[list[int]]:
        app = make_app(tiny, seeded, max_new_tokens=12)
        async with app.run_test(size=(80, 24)) as pilot:
            await ready(pilot)
            said = [(await ask(pilot, "hello there")).token_ids]
            if retry:
                said.append((await ask(pilot, "/retry")).token_ids)
            return said

    first, again = await answers(retry=True)
    assert again != first and await answers(retry=False) == [first]


async def test_stop_strings_end_the_next_answers_before_them_unshown(tiny):
    """`/stop` as ollama's `/set parameter stop`: quoted strings may hold spaces; alone, it ends answers at the end of
    the turn only again. The answer is the greedy one cut before the first stop string."""
    app = make_app(tiny, max_new_tokens=16)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        whole = (await ask(pilot, "hello there")).text
        stop = whole[6:9]
        assert stop.strip() and stop not in whole[:6]
        await send(pilot, f'/stop "{stop}" "never said"')
        assert app.session.settings.stop == (stop, "never said")
        await send(pilot, "/retry")
        await wait_until(pilot, lambda: not app.generating, what="the answer again")
        await pilot.pause()
        cut = app.session.messages[-1]
        assert cut.text == whole[: whole.index(stop)] and cut.finish == "stop"
        assert app.query(MessageView).last().body.plain == cut.text  # the stop string is not shown
        await send(pilot, "/stop")
        assert app.session.settings.stop == () and note_lines(app)[-1] == "no stop strings"
        await send(pilot, '/stop "unclosed')
        assert "quote a stop string that holds spaces" in note_lines(app, errors=True)[-1]


async def test_overlay_toggles_and_help_explains_the_numbers(tiny):
    app = make_app(tiny, drafter="ngram", max_new_tokens=16)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await ask(pilot, "hi")
        overlay = app.query_one(AcceptanceOverlay)
        assert overlay.display and overlay.figures is app.session.last_figures
        await pilot.press("f2")
        assert not overlay.display
        await pilot.press("f2", "f1")
        assert isinstance(app.screen, HelpScreen)
        help_text = str(app.screen.query_one("#help Static").content)
        assert "mean accepted length" in help_text and "/budget N|auto" in help_text
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_command_palette_offers_the_slash_commands(tiny):
    app = make_app(tiny)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+p")
        await pilot.press(*"/temp", "enter")  # takes an argument: typed into the input
        await pilot.pause()
        assert app.query_one(ChatInput).value == "/temp "
        await pilot.press("ctrl+p")
        await pilot.press(*"/stats", "enter")  # takes none: runs
        await pilot.pause()
        assert "no answer yet" in note_lines(app)


async def test_a_load_failure_is_shown_and_the_app_quits(tokenizer):
    def loader(progress):
        progress("loading")
        raise SpecchatError("model 'nowhere/nothing' is not available offline")

    from specchat.tui.app import ChatApp
    from specchat.tui.session import ChatSettings

    app = ChatApp(loader, ChatSettings())
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: app.error is not None, what="the error")
        await pilot.pause()
        assert any("not available offline" in line for line in note_lines(app, errors=True))
        await wait_until(pilot, lambda: not app.is_running, timeout=10, what="the app to quit")
    assert app.error == "model 'nowhere/nothing' is not available offline"


async def test_a_model_without_a_chat_template_is_a_load_failure(tiny):
    from copy import copy

    plain = copy(tiny)
    plain.tokenizer = copy(tiny.tokenizer)
    plain.tokenizer.chat_template = None
    app = make_app(plain, sampling=SamplingConfig())
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(pilot, lambda: app.error is not None, what="the error")
    assert "no chat template" in app.error


async def test_typing_while_loading_stays_in_the_input_and_is_answered_once_ready(tiny):
    """The input owns the keyboard from the first frame: `?` is text, not help, and Enter queues the message."""
    import threading

    from specchat.tui.app import ChatApp
    from specchat.tui.session import ChatSettings

    release = threading.Event()

    def loader(progress):
        progress("loading a slow test model")
        release.wait(30)
        return tiny, SamplingConfig()

    app = ChatApp(loader, ChatSettings(drafter="ngram", max_new_tokens=8))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press(*"Capital of France?")
        assert not isinstance(app.screen, HelpScreen) and app.query_one(ChatInput).value == "Capital of France?"
        first = note_lines(app)[0]
        await pilot.pause(0.3)
        assert note_lines(app)[0] != first and "(" in first  # the loading clock keeps counting
        await pilot.press("enter")
        assert app.session is None and any("answered as soon as the model is ready" in n for n in note_lines(app))
        release.set()
        await ready(pilot)
        await wait_until(pilot, lambda: app.session.messages and not app.generating, what="the queued answer")
        user, answer = app.session.messages
        assert user.text == "Capital of France?" and len(answer.token_ids) == 8
        assert not any("answered as soon as" in n for n in note_lines(app))
        assert any(" ready on cpu in " in n for n in note_lines(app))


async def test_a_context_past_the_window_is_said_with_the_ready_line(tiny):
    window = tiny.model.config.max_position_embeddings
    app = make_app(tiny, context=window * 2)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        assert app.session._engine().capacity <= window
        assert any(f"--context {window * 2} holds {window} tokens, the model's window (--yarn F" in n
                   for n in note_lines(app))


async def test_a_printable_key_after_escape_returns_to_the_input(tiny):
    app = make_app(tiny)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        chat_input = app.query_one(ChatInput)
        await pilot.press("escape")
        assert app.focused is not chat_input
        await pilot.press(*"hi?")
        assert app.focused is chat_input and chat_input.value == "hi?"
        assert not isinstance(app.screen, HelpScreen)


async def test_autoregressive_answers_show_no_speedup(tiny):
    app = make_app(tiny, drafter="ngram", max_new_tokens=40)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await ask(pilot, "hi")
        assert app.session.last_figures.speedup is not None  # measured against AR steps timed at this context
        await send(pilot, "/drafter none")
        await ask(pilot, "and again")
        assert app.session.last_figures.speedup is None and app.session.last_figures.ar_context is None


async def test_a_narrow_terminal_hides_the_overlay_and_f2_stacks_it_below(tiny):
    app = make_app(tiny, drafter="ngram", max_new_tokens=8)
    async with app.run_test(size=(60, 24)) as pilot:
        await ready(pilot)
        overlay, conversation = app.query_one(AcceptanceOverlay), app.query_one("#conversation")
        assert not overlay.display and conversation.size.width >= 56  # the conversation keeps the width
        await pilot.press("f2")
        await pilot.pause()
        assert overlay.display and overlay.region.y > conversation.region.y  # under it, not beside it
        assert conversation.size.width >= 56


async def test_the_tau_sparkline_averages_steps_instead_of_flattening_them(tiny):
    from textual.widgets import Sparkline

    app = make_app(tiny)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        spark = app.query_one("#spark", Sparkline)
        assert spark.summary_function([1, 6, 2]) == 3  # a bar per bucket of steps: their mean, not their max


async def test_a_full_context_drops_the_oldest_turns_and_the_chat_goes_on(tiny):
    app = make_app(tiny, drafter="ngram", max_new_tokens=400, context=200, system="Be brief.")
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        first = await ask(pilot, "Tell me a long story.")
        assert first.finish == "context"  # the cache filled before -n: said as such
        view = app.query(MessageView).last()
        assert "the context is full" in footer_line(view.message)
        for turn in range(3):  # every later message is answered, the oldest turns make room
            answer = await ask(pilot, f"And then? ({turn})")
            assert answer.token_ids and not note_lines(app, errors=True)
        assert any("the context is full: the 2 oldest messages" in line for line in note_lines(app))
        assert app.session.messages[0].text.startswith("And then?")  # what the model still sees
        prompt = app.session.previous
        assert prompt.text.count("Be brief.") == 1  # the system prompt stays
        assert len(prompt.ids) <= app.session.engine.capacity


async def test_a_message_longer_than_the_context_is_an_inline_error(tiny):
    app = make_app(tiny, max_new_tokens=8, context=64)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await send(pilot, "word " * 300)
        assert any("the context holds" in line for line in note_lines(app, errors=True))
        answer = await ask(pilot, "hi")  # and the chat still works
        assert len(answer.token_ids) == 8


async def test_loading_a_chat_larger_than_the_context_loads_what_fits(tiny, tmp_path):
    turns = []
    for i in range(20):
        turns += [{"role": "user", "text": f"Question {i}: " + "tell me more " * 10},
                  {"role": "assistant", "text": f"Answer {i}: " + "here is more " * 10}]  # fmt: skip
    path = tmp_path / "long.json"
    path.write_text(json.dumps({"format": "specchat-chat/1", "settings": {"context": 300}, "messages": turns}))
    app = make_app(tiny, max_new_tokens=16)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await send(pilot, f"/load {path}")
        kept = app.session.messages
        assert 0 < len(kept) < 40 and kept[0].role == "user" and kept[-1].text.startswith("Answer 19")
        assert any(f"loaded the last {len(kept)} of 40 messages" in line for line in note_lines(app))
        assert len(app.query(MessageView)) == len(kept)
        answer = await ask(pilot, "Go on.")
        assert len(answer.token_ids) == 16
