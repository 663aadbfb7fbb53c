"""Decode speed of the chat app against `specchat run`, same prompts, same run. Prints a table and JSON.

    .venv/bin/python scripts/chat_speed.py [--drafter none] [-n 600] [--repeats 2] [--json]

The chat runs in a real terminal (tmux, 100x30) and is asked each prompt in a fresh conversation (/clear);
its tokens/s is the one the answer's footer shows. `specchat run` answers the same prompt with the same
options (greedy), as a separate process, between the chat's answers. Both report decode tokens/s (prefill
excluded). Not a test: timings are measured and reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' helpers
from tmux_terminal import Terminal  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = (
    "Write a long story about a dragon who learns to bake bread.",
    "Describe a walk through a busy market on a summer morning.",
    "Tell me a long story about a lighthouse keeper and a storm.",
)  # each runs to the token limit both ways (in bf16 a reused cached prefix can change a greedy answer)
POLL_SECONDS = 1.5  # each look at the screen runs tmux, whose CPU time the chat would pay for
FOOTER = re.compile(r"(\d+) tok · ([\d.]+) tok/s")


def chat_answer(terminal: Terminal, prompt: str) -> tuple[int, float]:
    """Ask in a fresh conversation; the tokens and tokens/s of the answer's footer."""
    terminal.send("/clear", "Enter")
    time.sleep(0.3)
    terminal.send(prompt, "Enter")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
        screen = terminal.screen()
        if "answering…" not in screen and (match := FOOTER.search(screen)):
            return int(match.group(1)), float(match.group(2))
    raise TimeoutError(f"no answer footer:\n{terminal.screen()}")


def run_answer(prompt: str, args) -> tuple[int, float]:
    command = [sys.executable, "-m", "specchat", "run", prompt, "-t", "0", "-n", str(args.n), "--drafter",
               args.drafter, "--json"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    answer = json.loads(result.stdout)
    return answer["new_tokens"], answer["tokens_per_second"]


def measure(args) -> list[dict]:
    options = f"--temperature 0 --max-new-tokens {args.n} --drafter {args.drafter}"
    command = f"cd {ROOT} && env -u COLUMNS -u LINES HF_HUB_OFFLINE=1 {sys.executable} -m specchat chat {options}"
    terminal = Terminal(command, width=100, height=30)
    rows = []
    try:
        deadline = time.monotonic() + 300
        while "ready on" not in terminal.screen():
            if time.monotonic() > deadline:
                raise TimeoutError(terminal.screen())
            time.sleep(0.2)
        for prompt in PROMPTS * args.repeats:
            chat_tokens, chat = chat_answer(terminal, prompt)
            run_tokens, run = run_answer(prompt, args)
            rows.append({"prompt": prompt[:40], "chat_tokens": chat_tokens, "chat_tok_s": chat,
                         "run_tokens": run_tokens, "run_tok_s": round(run, 1),
                         "ratio": round(chat / run, 3)})  # fmt: skip
        terminal.send("C-q")
    finally:
        terminal.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafter", default="none")
    parser.add_argument("-n", type=int, default=600, help="tokens per answer")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = measure(args)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for row in rows:
        print(f"{row['prompt']:<42} chat {row['chat_tokens']:>4} tok {row['chat_tok_s']:>6.1f} tok/s  "
              f"run {row['run_tokens']:>4} tok {row['run_tok_s']:>6.1f} tok/s  {row['ratio']:.2f}x")
    print(f"median chat / run: {statistics.median(r['ratio'] for r in rows):.2f}")


if __name__ == "__main__":
    main()
