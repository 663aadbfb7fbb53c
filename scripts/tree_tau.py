"""What a scoring drafter's trees can reach on Qwen2.5-Coder-1.5B, teacher-forced (not a test: prints a table).

The target answers each prompt of the bench's sets greedily; then, at every position of each answer, the drafter
(following the answer as the engine would feed it, the target's own states included) proposes the tree the
engine asks a scoring drafter for, and the tree is cut to n nodes as the adaptive budget cuts it. Printed per
set and n: tokens a step (tau: the cut tree's path along the answer, plus the target's bonus token, over the steps
the engine would take, each from where the last one's tokens end: averaged over every position instead, a step
would count as often inside a run of easy tokens as at its start, where the engine's steps start), the cost
of verifying n nodes against a decode step (the engine's calibration on this machine, at this context class),
and their ratio: the speedup over plain decoding were drafting free and every step n nodes. It bounds what
sizing trees can gain, and says whether a target needs better drafts or cheaper rows.

    python scripts/tree_tau.py [--drafter tokenswift+ngram] [--prompt-set chat,code,summarize] [-n 128]
        [--prompts docs/examples/chat-prompts.jsonl --first 1100 --count 48]

`--prompts`: a JSON-lines file of prompts (each line's first turn), lines `--first` on, instead of the bench's sets.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from specchat.bench.prompts import load_prompt_sets  # noqa: E402
from specchat.cli.common import load  # noqa: E402
from specchat.drafters import attach_drafter  # noqa: E402
from specchat.drafters.composite import CompositeDrafter, matched_run  # noqa: E402
from specchat.drafters.mode_choice import BOTH  # noqa: E402
from specchat.engine.budget import SCORED_TREE  # noqa: E402
from specchat.engine.generate import Engine  # noqa: E402
from specchat.engine.prompt import encode_prompt  # noqa: E402
from specchat.engine.sampling_config import SamplingConfig  # noqa: E402
from specchat.training.prompts import file_prompts  # noqa: E402

SIZES = (1, 2, 3, 4, 5, 7, 15)


def answer(engine: Engine, prompt: list[int], tokens: int) -> list[int]:
    """The target's greedy answer, without a drafter (greedy output is the same with any)."""
    drafter, engine.drafter = engine.drafter, None
    out = [token for event in engine.generate(prompt, max_new_tokens=tokens, fresh=True) for token in event.tokens]
    engine.drafter = drafter
    return out


@torch.inference_mode()
def accepted_by_size(engine: Engine, prompt: list[int], reply: list[int]) -> list[list[int]]:
    """Per decode step of `reply` (the root: each committed token but the last), the tokens each cut of the
    drafter's tree would have accepted."""
    ids = prompt + reply
    states = engine.target_states(ids, feature_layers=engine.state_layers)  # states[p] predicted ids[p + 1]
    drafter = engine.drafter
    drafter.prefill(prompt, states[: len(prompt)], 0)
    drafter.commit(reply[:1], states[:0])  # prefill's token: no new state, as in the engine
    steps = []
    for m in range(len(prompt) + 1, len(ids)):  # ids[:m] committed, the root ids[m - 1]
        if isinstance(drafter, CompositeDrafter):
            drafter.modes.mode = BOTH  # a composite's timed choice of parts is not what is measured here
        tree = drafter.propose(SCORED_TREE, SamplingConfig())
        steps.append([matched_run(tree.cut(n), ids[m:]) for n in SIZES])
        drafter.commit([ids[m]], states[m - 1 : m])
    return steps


def walked_steps(accepted: list[int]) -> int:
    """The steps the engine takes through an answer whose drafts at each position would have `accepted` so many
    tokens: each commits those and the bonus, and the next drafts where they end."""
    position, steps = 0, 0
    while position < len(accepted):
        position += accepted[position] + 1
        steps += 1
    return steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--drafter", default="tokenswift+ngram")
    parser.add_argument("--prompt-set", default="chat,code,summarize")
    parser.add_argument("--prompts", type=Path, help="a JSON-lines file of prompts, instead of --prompt-set")
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, default=48)
    parser.add_argument("-n", type=int, default=128)
    args = parser.parse_args()
    loaded = load("qwen2.5-coder-1.5b", "auto", "cpu")
    engine = Engine(loaded.model, loaded.tokenizer, max_len=4096)
    attach_drafter(engine, loaded.source, args.drafter, draft_budget=None, draft_cache=None)
    if not engine.drafter.scores_nodes:
        raise SystemExit(f"{args.drafter} does not score its nodes: its trees are not cut by size")
    if args.prompts:
        chats = file_prompts(args.prompts)[args.first : args.first + args.count]
        sets = {args.prompts.stem: [chat.turns[0] for chat in chats]}
    else:
        sets = load_prompt_sets(args.prompt_set.split(","))
    cost = None
    print(f"{args.drafter}, {args.n} tokens an answer; tau / verification cost (x a decode step) / ratio")
    print("set       tokens " + " ".join(f"{f'n={n}':>17}" for n in SIZES))
    for name, texts in sets.items():
        tokens, steps = 0, [0] * len(SIZES)
        for text in texts:
            prompt = encode_prompt(loaded.tokenizer, text)
            accepted = accepted_by_size(engine, prompt, answer(engine, prompt, args.n))
            cost = cost or engine._verify_cost()  # priced at the first answer's context class
            tokens += len(accepted)
            for i in range(len(SIZES)):
                steps[i] += walked_steps([step[i] for step in accepted])
        taus = [tokens / taken for taken in steps]
        cells = [f"{tau:5.2f} /{cost.relative(n):5.2f} /{tau / cost.relative(n):5.2f}" for n, tau in zip(SIZES, taus)]
        print(f"{name:10s} {tokens:5d} " + " ".join(f"{cell:>17}" for cell in cells), flush=True)


if __name__ == "__main__":
    main()
