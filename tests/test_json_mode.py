"""JSON mode: the output is one JSON object, and speculation keeps it exactly what the constrained target decodes.

- the byte automaton takes every JSON object `json.dumps` writes (indented or not, escapes and unicode included),
  each proper prefix of one as valid but incomplete, and refuses what RFC 8259 refuses;
- a state's token mask is exactly the tokens the automaton takes whole, on the real tokenizer (the walk over the
  sorted vocabulary against feeding every token), whitespace runs near their cap included;
- the vocabulary's bytes are what the tokenizer encodes;
- under JSON mode, random trees of every budget, and sampled decoding with each token's own seeded draw, give the
  tokens that constrained autoregressive decoding gives; on the embedded model the answer is one JSON object that
  parses, the same with every drafter, through `specchat run --format json` too.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from conftest import tiny_model
from drafters_for_tests import RandomTreeDrafter
from test_cli import assert_one_line_error, specchat, specchat_in_process

from specchat.constraints import SyntaxText
from specchat.constraints import json_syntax as syntax
from specchat.constraints.token_masks import TokenMasks, Vocabulary, feed_bytes, vocabulary_bytes
from specchat.engine.generate import Engine
from specchat.engine.prompt import encode_prompt
from specchat.engine.sampling import SamplingConfig

SAMPLES = ["", "a b", 'q"uote', "back\\slash", "tab\t", "é☃", "\u0001", "x/y", "\U0001f600"]


def _feed(text: bytes):
    return feed_bytes(syntax, syntax.START, text)


def random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(7 if depth < 4 else 4)
    if kind == 0:
        return rng.choice([0, -1, 12, 3.5, -0.25, 1e10, 2.5e-3, 10**20, -0.0])
    if kind == 1:
        return rng.choice(SAMPLES)
    if kind == 2:
        return rng.choice([True, False, None])
    if kind == 3:
        return rng.randrange(-1000, 1000)
    if kind in (4, 5):
        return {f"k{i}{rng.choice(SAMPLES)}": random_value(rng, depth + 1) for i in range(rng.randrange(4))}
    return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]


def test_the_automaton_takes_json_objects_and_their_prefixes():
    rng = random.Random(0)
    for _ in range(300):
        value = {f"k{i}": random_value(rng) for i in range(rng.randrange(4))}
        for style in ({}, {"indent": 2}, {"ensure_ascii": False}, {"separators": (",", ":")}):
            text = json.dumps(value, **style).encode()
            end = _feed(text)
            assert end is not None and syntax.complete(end), text
            for cut in range(len(text)):
                state = _feed(text[:cut])
                assert state is not None and not syntax.complete(state), (text, cut)


@pytest.mark.parametrize("text", [
    b'[1]', b'"a"', b'1', b'{"a":01}', b'{"a":1.}', b'{"a":-}', b'{"a":.5}', b'{"a":+1}', b'{"a":1e}', b'{"a" 1}',
    b'{"a":1,}', b'{,}', b'{"a":tru}', b'{"a":nul}', b'{"a":"\\x"}', b'{"a":"\\u12g4"}', b'{"a":1]', b'{"a":[1}',
    b'{} ', b'{}{}', b'{"a":"\n"}', b"{'a':1}", b'{a:1}', b'{"a":NaN}', b'{"a":[1,]}', b' {}', b'\n{}',
])  # fmt: skip
def test_the_automaton_refuses_all_but_one_object(text):
    """Invalid JSON, a value other than an object, and anything after the object (the end must come)."""
    state = _feed(text)
    assert state is None or not syntax.complete(state)


def test_whitespace_runs_are_capped():
    limit = syntax.MAX_WHITESPACE
    assert _feed(b" {") is None  # the object from the first byte
    assert _feed(b"{" + b" " * limit + b"}") is not None
    assert _feed(b"{" + b" " * (limit + 1)) is None
    assert _feed(b'{"a":' + b"\n" * limit + b"1," + b" " * limit + b'"b":2}') is not None
    assert _feed(b'{"a": "' + b" " * 500 + b'"}') is not None  # inside a string: text


@pytest.fixture(scope="module")
def pieces(tokenizer):
    return vocabulary_bytes(tokenizer)


def test_the_vocabulary_bytes_are_what_the_tokenizer_encodes(tokenizer, pieces):
    for text in ['{"name": "Zoë", "tags": ["a\\tb", 3.5e-2]}', "  déjà vu ☃\n\tend", "print('x')\r\n"]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert b"".join(pieces[i] for i in ids) == text.encode()
    assert all(pieces[i] is None for i in tokenizer.all_special_ids)


def test_a_state_mask_is_every_token_the_automaton_takes(tokenizer, pieces, default_model):
    size = default_model.model.config.vocab_size
    masks = TokenMasks(Vocabulary(pieces, size), syntax, frozenset({2}))
    prefixes = [b"", b"{", b'{"na', b'{"name": ', b'{"name": "Al', b'{"a": [1, 2', b'{"a": {"b": tr', b'{"a": 1}',
                b'{"a": "x\\', b'{"a": "\\u00', b'{"a": -', b'{"a": 12', b'{"a": 1.5e', b'{\n  "a": 1,\n',
                b"{" + b" " * 40, b"{" + b"\n" * (syntax.MAX_WHITESPACE - 1), b"{" + b" " * syntax.MAX_WHITESPACE,
                b'{"a": [1, ' + b" " * 60]  # fmt: skip
    for prefix in prefixes:
        state = _feed(prefix)
        expected = np.array([i < size and piece is not None and feed_bytes(syntax, state, piece) is not None
                             for i, piece in enumerate(pieces)] + [False] * (size - len(pieces)))  # fmt: skip
        if syntax.complete(state):
            expected[2] = True  # the end, and only there
        assert (masks.allowed(state).numpy() == expected).all(), prefix
        assert masks.allowed(state).any()


VOCAB = 1024


def _decode(engine: Engine, prompt: list[int], n: int, sampling=SamplingConfig()):
    events = engine.generate(prompt, sampling=sampling, max_new_tokens=n, constraint=engine.json_constraint())
    return [token for event in events for token in event.tokens]


@pytest.mark.parametrize("family, seed, budget", [("llama", 2, 4), ("qwen2", 3, 16), ("qwen3", 4, 64)])
def test_random_trees_under_json_mode_equal_constrained_decoding(family, seed, budget, tokenizer, pieces):
    model = tiny_model(family, vocab_size=VOCAB, seed=seed)
    prompt = torch.randint(3, VOCAB, (12,), generator=torch.Generator().manual_seed(seed)).tolist()
    alone = _decode(Engine(model, tokenizer, max_len=256), prompt, 80)
    text = b"".join(pieces[t] for t in alone if pieces[t])
    assert _feed(text) is not None and text.lstrip().startswith(b"{")
    assert len(set(alone)) > 5  # the mask left the random model real choices
    drafter = RandomTreeDrafter(vocab_size=VOCAB, seed=seed, reference=prompt + alone, p_correct=0.7)
    engine = Engine(model, tokenizer, max_len=256, drafter=drafter, draft_budget=budget)
    assert _decode(engine, prompt, 80) == alone
    assert sum(len(tree) for tree in drafter.proposals) > len(drafter.proposals)  # trees, not chains of one


def test_sampled_json_mode_draws_the_same_tokens_with_a_drafter(tokenizer):
    model = tiny_model("qwen3", vocab_size=VOCAB, seed=4)
    prompt = list(range(40, 52))
    sampling = SamplingConfig(temperature=1.0, top_k=50, seed=7)
    alone = _decode(Engine(model, tokenizer, max_len=256), prompt, 60, sampling)
    drafter = RandomTreeDrafter(vocab_size=VOCAB, seed=3, reference=prompt + alone, p_correct=0.8)
    engine = Engine(model, tokenizer, max_len=256, drafter=drafter, draft_budget=8)
    assert _decode(engine, prompt, 60, sampling) == alone
    assert alone != _decode(Engine(model, tokenizer, max_len=256), prompt, 60)  # sampling really drew


@pytest.mark.slow
def test_the_embedded_model_answers_one_json_object_with_every_drafter(default_model):
    from specchat.session import Session

    prompt = "Give the name, age and city of a fictional person as JSON."
    answers = {}
    for drafter in ("none", "ngram", "longspec"):
        session = Session.over(default_model, max_len=512, drafter=drafter)
        ids = encode_prompt(default_model.tokenizer, prompt)
        events = list(session.engine.generate(ids, max_new_tokens=120, constraint=session.engine.json_constraint()))
        assert events[-1].finish_reason == "eos"
        answers[drafter] = [token for event in events for token in event.tokens]
        text = "".join(event.text for event in events)
        assert isinstance(json.loads(text), dict)
    assert answers["ngram"] == answers["none"] == answers["longspec"]


@pytest.mark.slow
def test_run_format_json():
    result = specchat("run", "Give the name, age and city of a fictional person as JSON.", "--format", "json", "--json",
                      "-n", "120", "--temperature", "0", warm=True)  # fmt: skip
    report = json.loads(result.stdout)
    assert report["finish_reason"] == "eos"
    assert isinstance(json.loads(report["text"]), dict)


def test_run_refuses_an_unknown_format(monkeypatch, capfd):
    assert_one_line_error(specchat_in_process(monkeypatch, capfd, "run", "hi", "--format", "yaml"), "--format", "json")


def test_json_mode_is_one_object_of_the_engine(default_model):
    engine = Engine(default_model.model, default_model.tokenizer, max_len=64)
    assert isinstance(engine.json_constraint(), SyntaxText) and engine.json_constraint() is engine.json_constraint()
