"""What the tree budget chose, step by step, and the live prices it chose by: a model's prompt sets decoded
`--rounds` times in one process (the prices carry over from prompt to prompt, as in `specchat bench`).

    python scripts/budget_trace.py [--model qwen2.5-coder-1.5b] [--drafter tokenswift+ngram] [--prompt-set chat,code]
        [-n 64] [--rounds 2] [--max-len 4096]

Per prompt: the mean budget, each step's budget and how many of its nodes were accepted (3/2: a budget of 3, two
accepted), and every timed forward as nodes:ms, with the prices of 1, 3 and 7 nodes in decode steps after each
plain step.
"""

from __future__ import annotations

import argparse

from specchat.bench.prompts import load_prompt_sets
from specchat.bench.runs import engine_run
from specchat.cli.common import load
from specchat.drafters import attach_drafter
from specchat.engine.budget import AdaptiveBudget
from specchat.engine.generate import Engine
from specchat.engine.prompt import encode_prompt
from specchat.engine.verify_cost import VerifyCost


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--drafter", default="tokenswift+ngram")
    parser.add_argument("--prompt-set", default="chat,code")
    parser.add_argument("-n", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-len", type=int, default=4096)
    args = parser.parse_args()

    steps: list[str] = []
    forwards: list[str] = []
    observe, counted = VerifyCost.observe, AdaptiveBudget.observe

    def timed(cost: VerifyCost, n: int, seconds: float) -> None:
        observe(cost, n, seconds)
        prices = f" [{' '.join(f'{k}:{cost.relative(k):.2f}' for k in (1, 3, 7))}]" if n == 0 else ""
        forwards.append(f"{n}:{seconds * 1e3:.0f}{prices}")

    def verified(policy: AdaptiveBudget, tree, path: list[int], **kwargs) -> None:
        counted(policy, tree, path, **kwargs)
        steps.append(f"{kwargs.get('budget') or 0}/{len(path)}")

    VerifyCost.observe, AdaptiveBudget.observe = timed, verified
    loaded = load(args.model, "auto", "cpu")
    engine = Engine(loaded.model, loaded.tokenizer, max_len=args.max_len)
    attach_drafter(engine, loaded.source, args.drafter, draft_budget=None, draft_cache=None)
    sets = load_prompt_sets(args.prompt_set.split(","))
    for round_ in range(args.rounds):
        for name, prompts in sets.items():
            for number, prompt in enumerate(prompts):
                steps.clear()
                forwards.clear()
                run = engine_run(engine, encode_prompt(loaded.tokenizer, prompt), args.n)
                mean, speed = run.budget_total / max(run.steps, 1), run.decode_tokens / run.decode_seconds
                print(f"round {round_} {name} {number}: {speed:.1f} tok/s, mean budget {mean:.2f}")
                print("  steps " + " ".join(steps))
                print("  forwards " + " ".join(forwards))


if __name__ == "__main__":
    main()
