"""Where a decode step's time goes on Qwen2.5-Coder-1.5B (or `--model`): the chat prompts decoded once to warm up (and
calibrate the budget), then again under cProfile, one process; the time per step in the decoder's forward,
its output head, the drafter's proposal and the rest (Python); `--top N` lists the N functions with the most own time.
`--temperature` samples as `specchat bench` does (the model's other defaults, keyed noise).

    python scripts/step_profile.py [--model qwen2.5-coder-1.5b] [--drafter tokenswift] [--prompt-set chat] [-n 64]
        [--temperature 0.7] [--top 30]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats

from specchat.bench.prompts import load_prompt_sets
from specchat.bench.runs import engine_run
from specchat.cli.bench import bench_sampling
from specchat.cli.common import load
from specchat.drafters import attach_drafter
from specchat.engine.generate import Engine
from specchat.engine.prompt import encode_prompt


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--drafter", default="tokenswift")
    parser.add_argument("--prompt-set", default="chat")
    parser.add_argument("-n", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top", type=int, default=0, help="also list the N functions with the most own time")
    args = parser.parse_args()
    loaded = load(args.model, "auto", "cpu")
    sampling = bench_sampling(loaded, args.temperature)
    prompts = [encode_prompt(loaded.tokenizer, p) for p in load_prompt_sets([args.prompt_set])[args.prompt_set]]
    engine = Engine(loaded.model, loaded.tokenizer, max_len=4096)
    if args.drafter != "none":
        attach_drafter(engine, loaded.source, args.drafter, draft_budget=None, draft_cache=None)
    for ids in prompts:
        engine_run(engine, ids, args.n, sampling)
    profile = cProfile.Profile()
    profile.enable()
    runs = [engine_run(engine, ids, args.n, sampling) for ids in prompts]
    profile.disable()
    steps = sum(run.steps for run in runs)
    decode = sum(run.decode_seconds for run in runs)  # the engine's decode time: prefill and the first token excluded
    stats = pstats.Stats(profile).stats  # {(file, line, name): (calls, _, own, cumulative, {caller: ...})}

    def find(name: str, file: str) -> tuple:
        return next(key for key in stats if key[2] == name and key[0].endswith(file))

    def inside(key: tuple, caller: tuple) -> float:  # cumulative seconds of `key`'s calls made by `caller`
        return stats[key][4].get(caller, (0, 0, 0, 0))[3]

    launch = find("_launch", "engine/generate.py")
    forward = inside(find("_tree_forward", "engine/generate.py"), launch)  # the target's forward of each tree
    # the lean forward's own time: its output head (a call into the CPU decoder that cProfile does not see) and the
    # Python around the decoder's call
    head_calls, _, head_time, _, _ = stats[find("__call__", "engine/lean_forward.py")]
    # the proposals a step asks for (a composite drafter's parts are inside its own)
    draft = sum(inside(key, launch) for key in stats if key[2] == "propose")
    print(f"{steps} steps, {decode:.2f} s decoding, {decode / steps * 1e3:.2f} ms a step (under cProfile):")
    print(f"  the target's forward: {forward / steps * 1e3:.2f} ms, of which its output head "
          f"{head_time / head_calls * 1e3:.2f} ms (a call's mean, prefill's included, and the Python around it)")
    print(f"  the drafter's proposal: {draft / steps * 1e3:.2f} ms")
    print(f"  the rest (verification, commits, budget, events): {(decode - forward - draft) / steps * 1e3:.2f} ms")
    pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
