"""A model's load, phase by phase (`load_model`: its tokenizer, its weights, the rest) and specchat's imports before it,
checkouts in turn: each name=path loads with the specchat of that checkout (PYTHONPATH) in a fresh process, warm (a
first load of each, which may build the decoder and convert the file, is not timed). Medians of `--repeats`.

    .venv/bin/python scripts/launch_time.py [--model qwen2.5-coder-1.5b] [--repeats 5] new=. old=/tmp/oldtree

Not a test: timings are measured and reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

PHASES = ("imports", "tokenizer", "weights", "load")
CHILD = """
import json, pathlib, sys, time
start = time.perf_counter()
import specchat.session, specchat.engine.generate
import specchat.quant.gguf_model as gguf_model
from specchat.loading import load_model
imported = time.perf_counter()
spent, before = {"tokenizer": 0.0, "weights": 0.0}, 0.0
def timed(function, phase):
    def call(*args, **kwargs):
        begin = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            spent[phase] += time.perf_counter() - begin
    return call
if (pathlib.Path(specchat.__file__).parent / "tokenizer.py").is_file():  # specchat's own tokenizer
    from specchat.tokenizer import Tokenizer as owner
    method = "from_dir"
else:  # transformers', its import counted in the tokenizer's phase and the load
    begin = time.perf_counter()
    from transformers import PreTrainedTokenizerFast as owner
    before = spent["tokenizer"] = time.perf_counter() - begin
    method = "from_pretrained"
setattr(owner, method, classmethod(timed(getattr(owner, method).__func__, "tokenizer")))
gguf_model.load_gguf_model = timed(gguf_model.load_gguf_model, "weights")
begin = time.perf_counter()
load_model(sys.argv[1] if len(sys.argv) > 1 else None)
print(json.dumps({"imports": imported - start, **spent, "load": before + time.perf_counter() - begin}))
"""


def load_phases(path: str, model: str | None) -> dict[str, float]:
    path = os.path.abspath(path)  # the child's working directory too: `python -c` imports from there first
    env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", CHILD, *([model] if model else [])], cwd=path, env=env,
                            check=True, capture_output=True, text=True)  # fmt: skip
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None, help="default: the embedded model")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("checkouts", nargs="+", help="name=path")
    args = parser.parse_args()
    checkouts = dict(item.split("=", 1) for item in args.checkouts)
    for path in checkouts.values():
        load_phases(path, args.model)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in checkouts}
    for _ in range(args.repeats):
        for name, path in checkouts.items():
            runs[name].append(load_phases(path, args.model))
    for name, phases in runs.items():
        medians = {phase: statistics.median(run[phase] for run in phases) for phase in PHASES}
        loads = ", ".join(f"{run['load']:.2f}" for run in phases)
        print(f"{name}: " + ", ".join(f"{phase} {seconds:.2f} s" for phase, seconds in medians.items())
              + f" (loads {loads})")  # fmt: skip


if __name__ == "__main__":
    main()
