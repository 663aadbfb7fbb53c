"""Measures `specchat write` on a model, the default one unless --model (not a test: prints a table and JSON).

Each drafter writes the same book (same prompt, seed and settings) in one process: tokens/s over the whole
book and per 1K tokens at its start and end (flat cost per token), resident memory after the first 1K tokens
and at the end, tau, acceptance, distinct-1..4, refills, the speedup the writer reports (AR timed by the
engine in the same run) and the speedup over the autoregressive book written here (the first row).

    .venv/bin/python scripts/writer_speed.py --tokens 20000 --drafter none,ngram,tokenswift
    .venv/bin/python scripts/writer_speed.py --tokens 5000 --drafter none --penalty 1.0,1.2
    .venv/bin/python scripts/writer_speed.py --model qwen2.5-coder-1.5b --tokens 20000 --drafter none,tokenswift
    .venv/bin/python scripts/writer_speed.py --model qwen2.5-coder-1.5b --tokens 20000 --drafter none \
        --kv-cache auto,int8
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import tempfile
import time
from pathlib import Path

import psutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from specchat.loading import load_model  # noqa: E402
from specchat.writer import settings as defaults  # noqa: E402
from specchat.writer.start import new_book  # noqa: E402
from specchat.writer.write import write_book  # noqa: E402

MARK = 1000  # tokens per timing window


def measure(loaded, drafter: str, tokens: int, penalty: float, seed: int, kv_cache: str, folder: Path) -> dict:
    sampling = {**defaults.SAMPLING, "penalty": penalty, "seed": seed}
    name = re.sub(r"[^\w.+-]", "_", drafter)  # a drafter NAME:PATH names a file too
    book, engine = new_book(loaded, folder / f"{name}-{penalty}-{kv_cache}.txt", tokens, defaults.STORY, raw=False,
                            sampling=sampling, stop_at_eos=False, force=True, kv_cache=kv_cache,
                            drafter=drafter)  # fmt: skip
    marks: list[tuple[int, float, int]] = []  # (tokens, seconds, rss) at each crossing of a MARK

    def status(now):
        if now.tokens >= MARK * (len(marks) + 1) or now.tokens == tokens:
            marks.append((now.tokens, now.seconds, psutil.Process().memory_info().rss))

    report = write_book(engine, book, tokens, status=status)
    book.close()
    first, last = marks[0], marks[-1]
    before_last = max((m for m in marks if m[0] <= last[0] - MARK), key=lambda m: m[0], default=(0, 0.0, 0))
    return {
        "drafter": drafter, "penalty": penalty, "kv_cache": kv_cache, "tokens": report.tokens,
        "tokens_per_second": round(report.tokens_per_second, 1), "tau": round(report.mean_accepted_length or 1.0, 3),
        "acceptance": None if report.acceptance_rate is None else round(report.acceptance_rate, 3),
        "ms_per_token_first_1k": round(1000 * first[1] / first[0], 3),
        "ms_per_token_last_1k": round(1000 * (last[1] - before_last[1]) / (last[0] - before_last[0]), 3),
        "rss_mib_at_1k": round(first[2] / 2**20), "rss_mib_at_end": round(last[2] / 2**20),
        "distinct": [round(d, 4) for d in (report.distinct_1, report.distinct_2, report.distinct_3, report.distinct_4)],
        "refills": report.refills, "prefill_seconds": round(report.prefill_seconds, 1),
        "ar_tokens_per_second_timed":
            None if report.ar_tokens_per_second is None else round(report.ar_tokens_per_second, 1),
        "speedup_vs_timed_ar": None if report.speedup_vs_ar is None else round(report.speedup_vs_ar, 3),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=20000)
    parser.add_argument("--drafter", default="none,ngram")
    parser.add_argument("--penalty", default=str(defaults.PENALTY))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--model", default=None, help="a profile or GGUF (default: the embedded model)")
    parser.add_argument("--kv-cache", default="auto", help="comma-separated: auto | int8 (each its own book)")
    args = parser.parse_args()
    loaded = load_model(args.model)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for penalty, kv_cache, drafter in itertools.product(map(float, args.penalty.split(",")),
                                                            args.kv_cache.split(","), args.drafter.split(",")):
            start = time.perf_counter()
            rows.append(measure(loaded, drafter, args.tokens, penalty, args.seed, kv_cache, Path(folder)))
            rows[-1]["wall_seconds"] = round(time.perf_counter() - start, 1)
            ar = next((r for r in rows if r["drafter"] == "none" and r["penalty"] == penalty), None)
            if ar is not None:
                rows[-1]["speedup_vs_ar_book"] = round(rows[-1]["tokens_per_second"] / ar["tokens_per_second"], 3)
            print(json.dumps(rows[-1]), flush=True)
    columns = ["drafter", "penalty", "kv_cache", "tokens_per_second", "speedup_vs_ar_book", "speedup_vs_timed_ar",
               "tau", "acceptance", "ms_per_token_first_1k", "ms_per_token_last_1k", "rss_mib_at_1k", "rss_mib_at_end",
               "distinct", "refills", "prefill_seconds"]  # fmt: skip
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row.get(c, "-")) for c in columns) + " |")


if __name__ == "__main__":
    main()
