"""The adaptive tree budget against fixed budgets, interleaved prompt by prompt in one process (one process per
budget, as `specchat bench --draft-budget N` runs them, compares minutes of a drifting memory, not budgets): our AR,
the drafter under the adaptive budget and under each fixed one, each prompt's runs in turn.

    python scripts/budget_ab.py [--model qwen2.5-coder-1.5b] [--drafter tokenswift+ngram] [--prompt-set chat]
        [--budgets 2,3] [--rounds 2] [-n 128]
"""

from __future__ import annotations

import argparse

from specchat.bench.prompts import load_prompt_sets
from specchat.bench.runs import engine_run
from specchat.cli.common import load
from specchat.drafters import attach_drafter
from specchat.engine.generate import Engine
from specchat.engine.prompt import encode_prompt


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--drafter", default="tokenswift+ngram")
    parser.add_argument("--prompt-set", default="chat")
    parser.add_argument("--budgets", default="2,3")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("-n", type=int, default=128)
    args = parser.parse_args()
    loaded = load(args.model, "auto", "cpu")
    prompts = [encode_prompt(loaded.tokenizer, p) for p in load_prompt_sets([args.prompt_set])[args.prompt_set]]
    budgets = {"our AR": None, "adaptive": None} | {f"fixed {b}": int(b) for b in args.budgets.split(",")}
    engines = {}
    for name, budget in budgets.items():
        engines[name] = Engine(loaded.model, loaded.tokenizer, max_len=4096)
        if name != "our AR":
            attach_drafter(engines[name], loaded.source, args.drafter, draft_budget=budget)
    for engine in engines.values():  # warm-up, and the adaptive budget's calibration
        engine_run(engine, prompts[0], 32)
    runs = {name: [] for name in engines}
    for _ in range(args.rounds):
        for ids in prompts:
            for name, engine in engines.items():
                runs[name].append(engine_run(engine, ids, args.n))
    ar_speed = sum(r.decode_tokens for r in runs["our AR"]) / sum(r.decode_seconds for r in runs["our AR"])
    for name, done in runs.items():
        speed = sum(r.decode_tokens for r in done) / sum(r.decode_seconds for r in done)
        steps = sum(r.steps for r in done)
        tau, nodes = sum(r.decode_tokens for r in done) / steps, sum(r.budget_total for r in done) / steps
        print(f"{name:10s} {speed:6.2f} tok/s  {speed / ar_speed:.3f}x our AR  tau {tau:.2f}  nodes a step {nodes:.2f}")


if __name__ == "__main__":
    main()
