"""GBNF grammars and regular expressions: the text is one the grammar derives, and speculation keeps it exactly what
constrained decoding gives.

- the format reads as llama.cpp reads it (literals, sets, `.`, groups, the repetitions, escapes, comments, rules
  over lines), and a grammar it cannot hold is refused in one line naming the line or rule;
- the automaton takes exactly the texts a regular grammar's regular expression matches, and every prefix of one; a
  regular expression read into rules matches what Python's `re` matches whole (ASCII classes), or is refused by name;
  UTF-8 characters byte by byte, refusing a byte that begins a character the grammar could not take;
- a state's token mask is exactly the tokens the automaton takes whole, on the real tokenizer (free text with
  non-ASCII characters, a character begun in a token, literals, repetitions);
- random trees and sampled decoding give the tokens constrained autoregressive decoding gives, a grammar's literals
  verified as forced chains; on the embedded model `specchat run --grammar` answers the grammar's text.
"""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest
import torch
from conftest import tiny_model
from drafters_for_tests import RandomTreeDrafter
from test_cli import assert_one_line_error, specchat, specchat_in_process

from specchat.constraints import Grammar, GrammarError
from specchat.constraints.token_masks import TokenMasks, Vocabulary, feed_bytes, vocabulary_bytes
from specchat.engine.generate import Engine
from specchat.engine.sampling import SamplingConfig


def _state(grammar: Grammar, text: str | bytes):
    return feed_bytes(grammar, grammar.start, text.encode() if isinstance(text, str) else text)


def _takes(grammar: Grammar, text: str) -> bool:
    state = _state(grammar, text)
    return state is not None and grammar.complete(state)


CHESS = r'''
# moves, numbered
root ::= (
    "1. " move " " move "\n"
    ([1-9] [0-9]? ". " move " " move "\n")+
)
move ::= (pawn | nonpawn | castle) [+#]?
pawn ::= ([a-h] "x")? [a-h] [1-8] ("=" [NBKQ])?
nonpawn ::= [NBKQR] [a-h]? [1-8]? "x"? [a-h] [1-8]
castle ::= "O-O" "-O"?
'''


@pytest.mark.parametrize("text, takes, refuses", [
    ('root ::= "yes" | "no"', ["yes", "no"], ["", "ye", "yess", "No"]),
    (CHESS, ["1. e4 e5\n2. Nf3 Nc6\n", "1. d4 d5\n2. c4 dxc4\n3. O-O-O Qxd1#\n"],
     ["1. e4 e5\n", "1. e9 e5\n2. a1 a2\n"]),
    (r'root ::= [a-c]{2,3} "-" [^a-z\n]* "."', ["ab-.", "abc-XY?.", "ca-é☃.", "bb-\u0080."],
     ["a-.", "abcd-.", "ab-x."]),
    (r'root ::= "\x41\u00e9\U0001F600\t\"\\" [\[\]\-]+', ['Aé😀\t"\\[]-'], ['Aé😀\t"\\']),
    ('root ::= item ("," item)*\nitem ::= "x" | "(" root ")"', ["x", "x,(x,x),((x))"], ["", "x,", "(x", "()"]),
    ('root ::= . . "!"', ["ab!", "é☃!", "\n\t!"], ["a!", "abc!"]),
    ("root ::= [0-9]{3} x{0}\nx ::= \"never\"", ["123"], ["12", "1234", "123never"]),
    ('root ::= ("a" |\n  "b"\n  | "c")  # a group over lines\n', ["a", "b", "c"], ["ab", ""]),
    ('root ::= ("a"? | "c"*)* "b"', ["b", "aab", "acccab"], ["", "ba"]),  # repeating what may be empty
    ("root ::= r1\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(1, 2000)) + 'r2000 ::= "x"', ["x"], ["xx"]),
])  # fmt: skip
def test_grammars_take_what_they_derive_and_their_prefixes(text, takes, refuses):
    grammar = Grammar.from_gbnf(text)
    for each in takes:
        assert _takes(grammar, each), each
        data = each.encode()
        for cut in range(len(data)):
            assert _state(grammar, data[:cut]) is not None, (each, cut)
    for each in refuses:
        assert not _takes(grammar, each), each


REGULAR = [  # a grammar and the regular expression of the same texts
    ('root ::= ("ab" | "c")* "d"?', r"(ab|c)*d?"),
    ('root ::= [a-c]+ ("-" [0-9]{1,2})?', r"[a-c]+(-[0-9]{1,2})?"),
    ('root ::= (x | y)+\nx ::= "a" "b"?\ny ::= [^ab]', r"(ab?|[^ab])+"),
    ('root ::= "a"{2,} "b"{0,3} c\nc ::= "c" | ', r"a{2,}b{0,3}c?"),
]


@pytest.mark.parametrize("text, pattern", REGULAR)
def test_regular_grammars_take_what_their_expressions_match(text, pattern):
    grammar, rng = Grammar.from_gbnf(text), random.Random(0)
    matched = 0
    for _ in range(3000):
        candidate = "".join(rng.choice("abcd-1") for _ in range(rng.randrange(7)))
        assert _takes(grammar, candidate) == bool(re.fullmatch(pattern, candidate)), candidate
        matched += bool(re.fullmatch(pattern, candidate))
    assert matched > 20


@pytest.mark.parametrize("pattern, example", [
    (r"^\d{3}-\d{2,4}$", "123-4567"),
    (r"(ab|c)+d?", "abcabd"),
    (r"[^a-c\d]x*", "éxx"),
    (r"\w+@\w+\.com", "alan_t@enigma.com"),
    (r"(?:a|b)*?c{,2}", "abbcc"),
    (r"a.b", "a\tb"),
    (r"[\]a-]+\W", "]a-é"),
    (r"(?P<x>a+)b{2,}", "aabbb"),
    (r"[\s\S]b", "\nb"),
    (r"x\.y\{1\}{1}", "x.y{1}"),
    (r"colou?r|gr[ae]y", "colour"),
    (r"(a|bc){1,3}|\x41\u00e9$", "abca"),
    (r"(a?)*b|(c|d*)+", "aab"),
])  # fmt: skip
def test_regular_expressions_match_what_re_matches_whole(pattern, example):
    """Against texts one or two edits from a match, and random ones, over the match's characters and a few more."""
    grammar, rng = Grammar.from_regex(pattern), random.Random(1)
    alphabet = sorted(set(example) | set("a1 .\né"))
    assert _takes(grammar, example)
    matched = 0
    for trial in range(2000):
        candidate = list(example) if trial % 2 else [rng.choice(alphabet) for _ in range(rng.randrange(9))]
        for _ in range(rng.randrange(1, 3)):
            at = rng.randrange(len(candidate) + 1)
            candidate[at:at + rng.randrange(2)] = rng.choice(["", rng.choice(alphabet)])
        candidate = "".join(candidate)
        expected = bool(re.fullmatch(pattern, candidate, re.ASCII))
        assert _takes(grammar, candidate) == expected, candidate
        matched += expected
    assert matched > 20


@pytest.mark.parametrize("pattern, message", [
    (r"(?=a)b", "lookarounds"), (r"(a)\1", "backreferences"), (r"a\bc", "word boundaries"), (r"(a", "missing ')'"),
    (r"a)", "unbalanced ')'"), (r"*a", "'*' repeats nothing"), (r"a{3,1}", "below the minimum"), (r"(?i)a", "flags"),
    (r"a^b", "anchors (^)"), (r"[z-a]", "runs backwards"),
    ("a\\", "cannot end in a backslash"), (r"\q", "unknown escape"),
])  # fmt: skip
def test_a_regular_expression_no_grammar_holds_is_refused_by_name(pattern, message):
    with pytest.raises(GrammarError, match=re.escape(message)):
        Grammar.from_regex(pattern)


def test_utf8_bytes_are_taken_one_at_a_time():
    grammar = Grammar.from_gbnf('root ::= [a-z] [à-ÿ] "☃"')
    assert _state(grammar, b"a\xc3") is not None  # a character begun that [à-ÿ] may hold
    assert _state(grammar, b"a\xc4") is None  # U+0100.. cannot be in it
    assert _state(grammar, b"a\xc3\xa9\xe2\x98") is not None and _takes(grammar, "aé☃")
    for refused in (b"a\x80", b"a\xc3A", b"a\xff"):  # a continuation first, a character cut short, no UTF-8
        assert _state(grammar, refused) is None
    free = Grammar.from_gbnf(r'root ::= [^\n]*')
    assert _state(free, "\ud7ff".encode()) is not None and _state(free, b"\xed\xa0") is None  # no surrogates
    assert _state(free, b"\xe0\x80") is None and _state(free, b"\xf4\x90") is None  # overlong, past U+10FFFF


@pytest.mark.parametrize("text, message", [
    ('root ::= "a"\nroot ::= "b"', "rule 'root' is defined twice"),
    ('root ::= x', "rule 'x' is used but not defined"),
    ('answer ::= "a"', "no rule named 'root'"),
    ('root ::= root "a" | "b"', "rule 'root' is left-recursive"),
    ('root ::= x "a"\nx ::= "b"? root', "left-recursive"),
    ('root ::= "abc', "line 1, column 14: unterminated string"),
    ('root ::= "a"\n\nroot2 ::= [a-', "line 3, column 14: unterminated character set"),
    ('root ::= "\\q"', "unknown escape \\q"),
    ('root ::= "\\x4"', "\\x needs 2 hex digits"),
    ('root ::= [z-a]', "runs backwards"),
    ('root ::= "a"{3,1}', "the maximum is below the minimum"),
    ('root ::= "a"{5000}', "above 2000"),
    ('root ::= *"a"', "'*' repeats nothing"),
    ('root ::= "a" )', "unexpected ')'"),
    ('root = "a"', "expected '::='"),
    ('root ::= <think>', "token references"),
    ('root ::= ("a" | "b"', "expected ')'"),
])  # fmt: skip
def test_a_grammar_outside_the_format_is_refused_naming_its_place(text, message):
    with pytest.raises(GrammarError, match=re.escape(message)):
        Grammar.from_gbnf(text)


@pytest.fixture(scope="module")
def vocabulary(tokenizer):
    return Vocabulary(vocabulary_bytes(tokenizer), len(tokenizer))


@pytest.mark.parametrize("text, prefixes", [
    (r'root ::= [^\n]* "\n"', ["", "Hello wor", "déjà", b"caf\xc3", "☃ "]),
    (r"regex:\w+@\w+\.(com|org)", ["", "alan", "alan@", "alan@enigma.", "alan@enigma.co"]),
    (r'root ::= "- " [A-Za-z ]+ ("\n- " [A-Za-z ]+){0,2}', ["", "- ", "- Apple", "- Apple\n", "- A\n- B\n- C"]),
    ('root ::= "The answer is " ("yes" | "no" | "maybe") "."', ["", "The ans", "The answer is ", "The answer is no"]),
    (r'root ::= "{" ws "\"a\":" ws [0-9]+ ws "}"' + "\nws ::= [ \\t\\n]*", ["", "{", '{ "a":', '{"a": 12 ']),
])  # fmt: skip
def test_a_state_mask_is_every_token_the_automaton_takes(text, prefixes, vocabulary):
    grammar = Grammar.from_regex(text.removeprefix("regex:")) if text.startswith("regex:") else Grammar.from_gbnf(text)
    masks = TokenMasks(vocabulary, grammar, frozenset({2}))
    for prefix in prefixes:
        state = _state(grammar, prefix)
        expected = np.array([piece is not None and feed_bytes(grammar, state, piece) is not None
                             for piece in vocabulary.pieces[: vocabulary.size]])  # fmt: skip
        if grammar.complete(state):
            expected[2] = True
        allowed = masks.allowed(state).numpy()
        assert (allowed == expected).all(), (prefix, np.flatnonzero(allowed != expected)[:10])
        assert allowed.any()


VOCAB = 1024
SHOPPING = r'''
root ::= "The:\n" item ("," " "? item){1,4} "."
item ::= [a-z]+ | [0-9]{1,3} " " [a-z]+
'''


def _decode(engine: Engine, prompt: list[int], n: int, sampling=SamplingConfig()):
    events = list(engine.generate(prompt, sampling=sampling, max_new_tokens=n,
                                  constraint=engine.grammar_constraint(SHOPPING)))  # fmt: skip
    return [token for event in events for token in event.tokens], [o for event in events for o in event.origins]


@pytest.mark.parametrize("family, seed, budget, sampling", [
    ("llama", 2, 4, SamplingConfig()),
    ("qwen3", 4, 16, SamplingConfig(temperature=1.0, top_k=50, seed=7)),
])  # fmt: skip
def test_random_trees_under_a_grammar_equal_constrained_decoding(family, seed, budget, sampling, tokenizer):
    model = tiny_model(family, vocab_size=VOCAB, seed=seed)
    prompt = torch.randint(3, VOCAB, (12,), generator=torch.Generator().manual_seed(seed)).tolist()
    alone, _ = _decode(Engine(model, tokenizer, max_len=256), prompt, 60, sampling)
    text = tokenizer.decode(alone)
    assert text.startswith("The:\n") and _state(Grammar.from_gbnf(SHOPPING), text) is not None
    assert len(set(alone)) > 5  # the mask left the random model real choices
    drafter = RandomTreeDrafter(vocab_size=VOCAB, seed=seed, reference=prompt + alone, p_correct=0.7)
    engine = Engine(model, tokenizer, max_len=256, drafter=drafter, draft_budget=budget)
    drafted, origins = _decode(engine, prompt, 60, sampling)
    assert drafted == alone
    assert "forced" in origins  # ":\n" is the grammar's, proposed as one chain


def test_the_grammar_constraint_is_kept_by_the_engine(default_model):
    engine = Engine(default_model.model, default_model.tokenizer, max_len=64)
    assert engine.grammar_constraint(SHOPPING) is engine.grammar_constraint(SHOPPING)
    with pytest.raises(GrammarError):
        engine.grammar_constraint("root ::= nothing")


def test_run_answers_the_grammar_s_text(tmp_path):
    grammar = tmp_path / "answer.gbnf"
    grammar.write_text('root ::= "The capital of France is " [A-Z] [a-z]+ "."\n')
    result = specchat("run", "What is the capital of France?", "--grammar-file", str(grammar), "--json",
                      "--temperature", "0", warm=True)  # fmt: skip
    report = json.loads(result.stdout)
    assert re.fullmatch(r"The capital of France is [A-Z][a-z]+\.", report["text"]) and report["finish_reason"] == "eos"


@pytest.mark.parametrize("args, needles", [
    (("--grammar", "root ::= x"), ("--grammar:", "rule 'x' is used but not defined")),
    (("--grammar-file", "/no/such.gbnf"), ("--grammar-file: cannot read /no/such.gbnf",)),
    (("--grammar", 'root ::= "a"', "--format", "json"), ("give one of --format json, --schema, --grammar",)),
    (("--grammar", 'root ::= "a"', "--ignore-eos"), ("--ignore-eos with a GBNF grammar: a held text must end",)),
])  # fmt: skip
def test_run_refuses_a_bad_grammar_in_one_line(args, needles, monkeypatch, capfd):
    assert_one_line_error(specchat_in_process(monkeypatch, capfd, "run", "hi", *args), *needles)
