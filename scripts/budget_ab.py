"""The adaptive tree budget against fixed budgets, interleaved prompt by prompt in one process (one process per
budget, as `specchat bench --draft-budget N` runs them, compares minutes of a drifting memory, not budgets): our AR,
the drafter under the adaptive budget and under each fixed one, each prompt's runs in turn (the order reversed every
other prompt), and each method's speed over the adaptive budget's, prompt by prompt: their mean and its standard error.
Every run's text must be our AR's.

    python scripts/budget_ab.py [--model qwen2.5-coder-1.5b] [--drafter tokenswift+ngram] [--prompt-set chat]
        [--prompts docs/examples/chat-prompts.jsonl --first 1100 --count 64] [--budgets 2,3] [--rounds 1] [-n 128]

`--prompts`: a JSON-lines file whose lines carry a "prompt" (or "turns", the first taken), lines `--first` on.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from specchat.bench.prompts import load_prompt_sets
from specchat.bench.runs import engine_run
from specchat.cli.common import load
from specchat.drafters import attach_drafter
from specchat.engine.generate import Engine
from specchat.engine.prompt import encode_prompt
from specchat.training.prompts import file_prompts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--drafter", default="tokenswift+ngram")
    parser.add_argument("--prompt-set", default="chat")
    parser.add_argument("--prompts", type=Path, help="a JSON-lines file of prompts, instead of --prompt-set")
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, default=64)
    parser.add_argument("--budgets", default="2,3")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("-n", type=int, default=128)
    args = parser.parse_args()
    loaded = load(args.model, "auto", "cpu")
    if args.prompts:
        texts = [prompt.turns[0] for prompt in file_prompts(args.prompts)[args.first : args.first + args.count]]
    else:
        texts = load_prompt_sets([args.prompt_set])[args.prompt_set]
    prompts = [encode_prompt(loaded.tokenizer, text) for text in texts]
    budgets = {"our AR": None, "adaptive": None} | {f"fixed {b}": int(b) for b in args.budgets.split(",")}
    engines = {}
    for name, budget in budgets.items():
        engines[name] = Engine(loaded.model, loaded.tokenizer, max_len=4096)
        if name != "our AR":
            attach_drafter(engines[name], loaded.source, args.drafter, draft_budget=budget)
    for engine in engines.values():  # warm-up, and the adaptive budget's calibration
        engine_run(engine, prompts[0], 32)
    runs = {name: [] for name in engines}
    for turn, ids in enumerate(prompts * args.rounds):
        for name in list(engines)[:: 1 if turn % 2 == 0 else -1]:
            runs[name].append(engine_run(engines[name], ids, args.n))
        if differ := [name for name in engines if runs[name][-1].tokens != runs["our AR"][-1].tokens]:
            raise SystemExit(f"prompt {turn % len(prompts)}: {', '.join(differ)} did not write our AR's text")
    ar_speed = speed(runs["our AR"])
    for name, done in runs.items():
        steps = sum(r.steps for r in done)
        tau, nodes = sum(r.decode_tokens for r in done) / steps, sum(r.budget_total for r in done) / steps
        ratios = [speed([run]) / speed([adaptive]) for run, adaptive in zip(done, runs["adaptive"])]
        error = statistics.stdev(ratios) / len(ratios) ** 0.5
        print(f"{name:10s} {speed(done):6.2f} tok/s  {speed(done) / ar_speed:.3f}x our AR  tau {tau:.2f}  nodes a step"
              f" {nodes:.2f}  x adaptive {statistics.mean(ratios):.3f} (se {error:.3f})")


def speed(runs: list) -> float:
    """Decoded tokens a second over `runs`."""
    return sum(r.decode_tokens for r in runs) / sum(r.decode_seconds for r in runs)


if __name__ == "__main__":
    main()
