"""Time to first token of each turn of a conversation of about 2K tokens, through `specchat serve` with its prompt
cache (the default) and with `--no-prompt-cache`, streamed through the `openai` client; the answers compared:

    python scripts/serve_ttft.py [--model qwen2.5-coder-1.5b] [--turns 3] [--tokens 2000]
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' helpers
from test_serve import Server  # noqa: E402

TEXT = ("The river rose in the night and by morning the lower fields were under water. The farmers moved their "
        "animals to the hill, where the old church stood, and waited for the rain to stop. ")  # fmt: skip


def conversation_turns(server: Server, model: str, turns: int, words: int) -> list[tuple[float, int, str]]:
    """(seconds to the first token, prompt tokens, answer) of each turn."""
    client = server.client()
    messages = [{"role": "user", "content": "Summarise this story in one sentence.\n\n" + TEXT * (words // 30)}]
    results = []
    for turn in range(turns):
        start, first, text, usage = time.perf_counter(), None, [], None
        stream = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=24,
                                                stream=True, stream_options={"include_usage": True})  # fmt: skip
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.perf_counter() - start
                text.append(chunk.choices[0].delta.content)
            if chunk.usage:
                usage = chunk.usage
        results.append((first, usage.prompt_tokens, "".join(text)))
        messages += [{"role": "assistant", "content": "".join(text)},
                     {"role": "user", "content": ["And who waited on the hill?", "Say it again, shorter."][turn % 2]}]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=2000, help="about this many words of story")
    args = parser.parse_args()
    runs = {}
    for name, flags in [("prompt cache", []), ("--no-prompt-cache", ["--no-prompt-cache"])]:
        server = Server("--model", args.model, "--context", "4096", *flags)
        try:
            server.wait_ready()
            runs[name] = conversation_turns(server, args.model, args.turns, args.tokens)
        finally:
            server.stop()
    for turn in range(args.turns):
        cells = ", ".join(f"{name} {runs[name][turn][0]:.2f} s" for name in runs)
        same = len({runs[name][turn][2] for name in runs}) == 1
        print(f"turn {turn + 1} ({runs['prompt cache'][turn][1]} prompt tokens): {cells}; answers equal: {same}")


if __name__ == "__main__":
    main()
