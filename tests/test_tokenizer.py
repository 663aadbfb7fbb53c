"""specchat's tokenizer (the `tokenizers` library alone) answers as transformers' does on the same files: ids with and
without special tokens, decoded text, the vocabulary and special tokens, and chat templates rendered and tokenized,
for the embedded model, tiny GGUF models of a sentencepiece vocabulary (BOS added; Llama's, Phi-3's and Gemma's
conversions) and, where its file is on the machine, Qwen2.5-Coder-1.5B (151K tokens, tools in its template). Chat
templates using every part of the template language transformers gives them (namespaces, `tojson`, `raise_exception`,
loop controls, `{% generation %}`, reasoning fields) render the same."""

from __future__ import annotations

import random
import shutil

import pytest
from gguf_files import SENTENCEPIECE_WORDS, write_sentencepiece_vocabulary, write_tiny_model
from jinja2.exceptions import TemplateError
from transformers import PreTrainedTokenizerFast

from specchat.errors import SpecchatError
from specchat.loading import (
    embedded_checkpoint,
    embedded_checkpoint_dir,
    embedded_gguf_path,
    gguf_checkpoint,
    load_model,
    profile_gguf,
)
from specchat.profiles import load_profiles
from specchat.tokenizer import Tokenizer

TEXTS = ["Hello, world!", "  leading spaces\n\ttabs  ", "<|im_start|>user\nhi<|im_end|>", "<s>the</s><|end|>",
         "émoji 🤖 ünïcode 中文", "def f(x):\n    return x**2\n", "", " ", " ".join(SENTENCEPIECE_WORDS)]  # fmt: skip
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "weather", "description": "A city's weather", "parameters": CITY}}
CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!", "tool_calls": None}, {"role": "user", "content": "Again, ünï"}],
    [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "", "reasoning": "Ask the tool.",
      "tool_calls": [{"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
     {"role": "tool", "content": "{\"sky\": \"clear\"}"}],
]  # fmt: skip
# every part of the language a Hugging Face chat template may use
EXERCISING_TEMPLATE = """{%- set ns = namespace(turns=0, last='') -%}
{%- for m in messages -%}
  {%- if m['role'] not in ('system', 'user', 'assistant', 'tool') -%}{{ raise_exception('bad role') }}{%- endif -%}
  {%- set ns.turns = ns.turns + 1 -%}{%- set ns.last = m['role'] -%}
  <{{ m['role'] }}>{% if m.reasoning_content %}(thinking: {{ m.reasoning_content }}|{{ m.thinking }}){% endif %}
  {%- if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}{% endgeneration %}{% else %}{{ m['content'] }}{% endif %}
  {%- if m.tool_calls is defined %}{% for call in m.tool_calls %}{{ call.function | tojson(indent=2) }}{% endfor %}{% endif %}
  {%- if 'tool_calls' in m and m.tool_calls is none %}NONE{% endif %}
{% endfor -%}
{%- for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{% if m.role == 'system' %}{% continue %}{% endif %}[{{ m.role }}]{% endfor %}
{%- if tools %}{{ tools | tojson(sort_keys=true) }}{{ dict(a=1) | tojson }}{% endif -%}
{{ bos_token ~ '|' ~ eos_token ~ '|' ~ ns.turns ~ ns.last }}{{ strftime_now('%Y') }}{{ documents is none }}
    {% if add_generation_prompt %}
<assistant>
    {% endif %}"""  # noqa: E501


@pytest.fixture(scope="module")
def tokenizer_dirs(tmp_path_factory):
    """Converted tokenizer directories: the embedded model's, and tiny sentencepiece GGUF models' by architecture."""
    folder = tmp_path_factory.mktemp("sentencepiece")
    source = write_sentencepiece_vocabulary(folder / "vocabulary.gguf")
    models = [write_tiny_model(folder / f"tiny-{name}.gguf", source, architecture=name)
              for name in ("llama", "phi3", "gemma2")]  # fmt: skip
    dirs = {"embedded": embedded_checkpoint(dense=False), **{path.stem: gguf_checkpoint(path) for path in models}}
    coder = profile_gguf(load_profiles()["qwen2.5-coder-1.5b"], download=False)  # 151K tokens, a template with tools
    return dirs | ({"qwen2.5-coder-1.5b": gguf_checkpoint(coder)} if coder is not None else {})


def directory_of(name: str, dirs: dict[str, str]) -> str:
    """The directory of `name`; the real 1.5B's only where its file is on this machine (CI has none)."""
    if name not in dirs:
        pytest.skip(f"the {name} GGUF is not on this machine")
    return dirs[name]


@pytest.mark.parametrize("name", ["embedded", "tiny-llama", "tiny-phi3", "tiny-gemma2", "qwen2.5-coder-1.5b"])
def test_the_tokenizer_answers_as_transformers_does(tokenizer_dirs, name):
    directory = directory_of(name, tokenizer_dirs)
    theirs, ours = PreTrainedTokenizerFast.from_pretrained(directory), Tokenizer.from_dir(directory)
    for text in TEXTS:
        for special in (True, False):
            ids = theirs.encode(text, add_special_tokens=special)
            assert ours.encode(text, add_special_tokens=special) == ids, (text, special)
            for skip in (True, False):
                assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
    draw = random.Random(0)
    for _ in range(100):  # any ids, specials and bytes of broken characters among them
        ids = [draw.randrange(len(theirs)) for _ in range(draw.randrange(1, 12))]
        assert ours.convert_ids_to_tokens(ids) == theirs.convert_ids_to_tokens(ids)
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
    assert len(ours) == len(theirs) and ours.get_vocab() == theirs.get_vocab()
    assert ours.all_special_ids == theirs.all_special_ids
    for role in ("bos_token_id", "eos_token_id", "unk_token_id", "pad_token_id"):
        assert getattr(ours, role) == getattr(theirs, role), role
    assert ours.convert_tokens_to_ids("no such token") == theirs.convert_tokens_to_ids("no such token")
    assert ({i: (t.content, t.special) for i, t in ours.added_tokens_decoder.items()}
            == {i: (t.content, t.special) for i, t in theirs.added_tokens_decoder.items()})  # fmt: skip
    if name == "tiny-llama":  # the file asks for BOS: both add it
        assert ours.encode("the")[0] == ours.bos_token_id


@pytest.mark.parametrize("name", ["embedded", "tiny-llama", "qwen2.5-coder-1.5b"])
@pytest.mark.parametrize("template", [None, EXERCISING_TEMPLATE], ids=["own", "exercising"])
def test_chat_templates_render_as_transformers_renders_them(tokenizer_dirs, name, template):
    directory = directory_of(name, tokenizer_dirs)
    theirs, ours = PreTrainedTokenizerFast.from_pretrained(directory), Tokenizer.from_dir(directory)
    for conversation in CONVERSATIONS:
        for tools in (None, [WEATHER]):
            for prompt in (True, False):
                asked = dict(tools=tools, chat_template=template, add_generation_prompt=prompt)
                text = theirs.apply_chat_template(conversation, tokenize=False, **asked)
                assert ours.apply_chat_template(conversation, tokenize=False, **asked) == text
                assert ours.apply_chat_template(conversation, **asked) == theirs.encode(text, add_special_tokens=False)


def test_a_template_raises_as_it_does_under_transformers(tokenizer_dirs):
    """A template's own refusal and a misuse of the sandbox are Jinja's errors, as the chat's fallbacks expect."""
    ours = Tokenizer.from_dir(tokenizer_dirs["embedded"])
    with pytest.raises(TemplateError, match="bad role"):
        ours.apply_chat_template([{"role": "narrator", "content": "x"}], chat_template=EXERCISING_TEMPLATE)
    with pytest.raises(TemplateError):  # the sandbox's SecurityError is one
        ours.apply_chat_template(CONVERSATIONS[0], chat_template="{% set ns = namespace() %}{% set ns._x = 1 %}")


def test_a_broken_tokenizer_file_is_one_line_naming_it(tokenizer_dirs, tmp_path, monkeypatch):
    """A converted tokenizer.json cut short (a disk that filled up, a hand edit) stops the load in one line."""
    monkeypatch.setenv("SPECCHAT_CACHE", str(tmp_path))
    broken = embedded_checkpoint_dir(embedded_gguf_path())
    shutil.copytree(tokenizer_dirs["embedded"], broken)
    (broken / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    with pytest.raises(SpecchatError, match="could not load model 'smollm2-135m': cannot read .*tokenizer.json: EOF"):
        load_model(None)
