"""Measures what a grammar's token masks cost on a real vocabulary (not a test: prints one row a state).

For a few grammars (free text to a newline, llama-cpp-python's JSON grammar, a choice, a list) and texts written
under each, the first mask of the state the text leads to (computed: the walk over the sorted vocabulary) and the
second (kept), with how many tokens it allows.

    .venv/bin/python scripts/grammar_masks.py --model qwen2.5-coder-1.5b
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from specchat.constraints import Grammar, Vocabulary, vocabulary_bytes  # noqa: E402
from specchat.constraints.token_masks import TokenMasks, feed_bytes  # noqa: E402
from specchat.loading import load_model  # noqa: E402

JSON = r'''
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
'''
CASES = [
    ("line", r'root ::= [^\n]* "\n"', ["", "Hello wor"]),
    ("json", JSON, ["", "{", '{"na', '{"name": ', '{"name": "Al', '{"a": [1, 2', '{"a": 1}']),
    ("choice", 'root ::= "yes" | "no" | "maybe"', ["", "ma"]),
    ("list", r'root ::= ("- " [A-Za-z ]+ "\n"){3}', ["", "- ", "- Apple", "- Apple\n-"]),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    args = parser.parse_args()
    loaded = load_model(args.model)
    vocabulary = Vocabulary(vocabulary_bytes(loaded.tokenizer), loaded.model.config.vocab_size)
    for name, text, prefixes in CASES:
        grammar = Grammar.from_gbnf(text)
        masks = TokenMasks(vocabulary, grammar, frozenset({0}))
        for prefix in prefixes:
            state = feed_bytes(grammar, grammar.start, prefix.encode())
            timings = []
            for _ in range(2):
                start = time.perf_counter()
                allowed = masks.allowed(state)
                timings.append(time.perf_counter() - start)
            print(f"{name:7} {prefix!r:16} {int(allowed.sum()):7d} tokens  first {1e3 * timings[0]:7.1f} ms  "
                  f"kept {1e6 * timings[1]:5.0f} us")


if __name__ == "__main__":
    main()
