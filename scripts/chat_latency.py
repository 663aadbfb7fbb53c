"""How fast the chat app feels, on the default model in a real terminal (tmux). Prints a table and JSON.

    .venv/bin/python scripts/chat_latency.py [--keys 20] [--json]

- start to ready: a warm `make chat` started until the model is loaded and the input takes keys;
- enter to first token: Enter pressed until the answer's first token is on screen;
- start to first token: both (the typing in between excluded);
- key to screen: while a long answer streams, a key typed into the input until it is drawn (median, p90, max);
- and the screen after the first answer, overlay included.

Not a test: timings are measured and reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' helpers
from tmux_terminal import Terminal  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
COMMAND = f"cd {ROOT} && env -u COLUMNS -u LINES make -s chat ARGS='--temperature 0 --max-new-tokens 600'"
QUESTION = "What is the capital of France? Answer in two sentences."
LONG_QUESTION = "Write a long story about a dragon who learns to bake bread."


def input_line(screen: str) -> str:
    """The text in the input box (the line below its top edge)."""
    lines = screen.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("▊▔"))
    return lines[top + 1].strip("▊▎ ")


def poll(terminal: Terminal, condition, timeout: float, every: float = 0.05) -> float:
    """Seconds until `condition(screen)` holds, looking every `every` seconds (a busy loop of capture-pane
    would take a core from the app on a 2-core machine)."""
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if condition(terminal.screen()):
            return time.perf_counter() - start
        time.sleep(every)
    raise TimeoutError(f"condition not met in {timeout} s:\n{terminal.screen()}")


def measure(keys: int) -> dict:
    start = time.perf_counter()
    terminal = Terminal(COMMAND, width=100, height=30)
    try:
        poll(terminal, lambda s: "ready on" in s, timeout=300)
        ready = time.perf_counter() - start
        terminal.send(QUESTION)
        poll(terminal, lambda s: QUESTION[:40] in s, timeout=10)
        terminal.send("Enter")
        first_token = poll(terminal, lambda s: "no answer yet" not in s, timeout=120, every=0.01)
        poll(terminal, lambda s: "answering…" not in s, timeout=300)
        after_one_answer = terminal.screen()
        terminal.send(LONG_QUESTION, "Enter")
        poll(terminal, lambda s: "answering…" in s, timeout=30)
        latencies = []
        for k in range(1, keys + 1):
            time.sleep(0.2)
            if "answering…" not in terminal.screen():
                break
            terminal.send("x")
            latencies.append(poll(terminal, lambda s, k=k: input_line(s) == "x" * k, timeout=10, every=0.002))
        terminal.send("Escape", "C-q")
    finally:
        terminal.close()
    return {
        "start_to_ready_s": round(ready, 2),
        "enter_to_first_token_s": round(first_token, 2),
        "start_to_first_token_s": round(ready + first_token, 2),
        "key_to_screen_ms_median": round(1000 * statistics.median(latencies), 1),
        "key_to_screen_ms_p90": round(1000 * sorted(latencies)[int(0.9 * (len(latencies) - 1))], 1),
        "key_to_screen_ms_max": round(1000 * max(latencies), 1),
        "keys_while_generating": len(latencies),
        "screen_after_one_answer": after_one_answer,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=20, help="keys typed while the answer streams")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(args.keys)
    if args.json:
        print(json.dumps(result, ensure_ascii=False, indent=1))
        return
    print(result.pop("screen_after_one_answer"))
    for name, value in result.items():
        print(f"{name:<26} {value}")


if __name__ == "__main__":
    main()
