"""Measures a tool call's latency through the server's own path (not a test: prints a table and JSON).

The model's template lists two tools, the user asks about the weather, and `tool_choice` names `get_weather`: each
drafter answers the same request `--repeats` times in one process (the first, cold, pays the prompt's prefill and
the call schema's token masks; the later ones reuse both, as a server's next request with the same tools does).
With `--llamacpp`, llama-cpp-python answers it too (its `chatml-function-calling` format: its own prompt, and it
writes the function's name itself, the model only the arguments), as the yardstick a Python user would reach for.

    .venv/bin/python scripts/tool_call_speed.py --model qwen2.5-coder-1.5b --drafter tokenswift+ngram,none --llamacpp
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from specchat.loading import load_model  # noqa: E402
from specchat.server.app import Served  # noqa: E402
from specchat.server.requests import chat_request  # noqa: E402
from specchat.session import Session  # noqa: E402
from specchat.tool_calls import call_reader  # noqa: E402

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city",
     "parameters": {"type": "object", "required": ["city"], "properties": {
         "city": {"type": "string", "description": "City name"},
         "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}},
    {"type": "function", "function": {"name": "search_files", "description": "Search the repository for files whose "
     "content matches a query", "parameters": {"type": "object", "required": ["query"], "properties": {
         "query": {"type": "string"}, "max_results": {"type": "integer"}}}}},
]  # fmt: skip
MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What's the weather in Paris? Use celsius."}]  # fmt: skip
CHOICE = {"type": "function", "function": {"name": "get_weather"}}


def ours(loaded, drafter: str, repeats: int) -> list[dict]:
    engine = Session.over(loaded, max_len=4096, drafter=drafter).engine
    served = Served(engine, loaded.tokenizer, "m", frozenset(), drafter, {})
    request = chat_request({"messages": MESSAGES, "tools": TOOLS, "tool_choice": CHOICE, "temperature": 0,
                            "parallel_tool_calls": False})  # fmt: skip
    ids, constraint = served.prompt_ids(request), served.constraint(request)
    rows = []
    for _ in range(repeats):
        start, text = time.perf_counter(), ""
        for event in engine.generate(ids, max_new_tokens=100, constraint=constraint(engine)):
            text += event.text
        seconds = time.perf_counter() - start
        reader = call_reader(served.tool_format)
        reader.feed(text)
        reader.finish()
        stats = event.stats
        rows.append({"method": drafter, "seconds": round(seconds, 3), "tokens": stats.new_tokens,
                     "decode_tok_s": round((stats.new_tokens - 1) / stats.decode_seconds, 2),
                     "tau": round(stats.mean_accepted_length, 2),
                     "call": [(call.name, call.arguments) for call in reader.calls]})  # fmt: skip
    return rows


def llamacpp(path: str, repeats: int) -> list[dict]:
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_threads=2, n_ctx=4096, chat_format="chatml-function-calling", verbose=False)
    rows = []
    for _ in range(repeats):
        start = time.perf_counter()
        reply = llm.create_chat_completion(messages=MESSAGES, tools=TOOLS, tool_choice=CHOICE, temperature=0,
                                           max_tokens=100)  # fmt: skip
        call = reply["choices"][0]["message"]["tool_calls"][0]["function"]
        rows.append({"method": "llama.cpp", "seconds": round(time.perf_counter() - start, 3),
                     "tokens": reply["usage"]["completion_tokens"], "call": [(call["name"], call["arguments"])]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--drafter", default="tokenswift+ngram,none")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--llamacpp", action="store_true")
    args = parser.parse_args()
    loaded = load_model(args.model)
    rows = [row for drafter in args.drafter.split(",") for row in ours(loaded, drafter, args.repeats)]
    if args.llamacpp:
        rows += llamacpp(str(loaded.source.gguf_path()), args.repeats)
    for row in rows:
        print(f"{row['method']:>18}  {row['seconds']:6.2f} s  {row['tokens']:3d} tokens  "
              f"{row.get('decode_tok_s', '-')!s:>6} tok/s  tau {row.get('tau', '-')!s:>4}  {row['call']}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
