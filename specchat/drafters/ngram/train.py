"""`specchat train ngram`: the n-gram drafter's table of the target's own answers (`drafters/ngram/answer_store.py`).

Nothing is learnt: the training answers are written as one token file next to a config naming the model they
came from. The held-out answers stay out, so they measure the table as they measure a trained drafter.
"""

from __future__ import annotations

import json
from pathlib import Path

from specchat.drafters.ngram.answer_store import FILE, AnswerStore
from specchat.errors import SpecchatError
from specchat.training.data import read_records


def build_answer_store(data: Path, out: Path) -> dict:
    """Write the table of `data`'s training answers (greedy and sampled alike: both are the target's) to `out`;
    returns its config."""
    recipe = data / "recipe.json"
    if not recipe.is_file():
        raise SpecchatError(f"{data} holds no training data; make it with `specchat train data --out {data}`")
    answers = [(r["prompt_ids"], r["answer_ids"]) for r in read_records(data, "train")
               if r["answer_ids"] and r["sampling"] != "text"]
    if not answers:
        raise SpecchatError(f"{data}: no training answers yet")
    out.mkdir(parents=True, exist_ok=True)
    AnswerStore.from_records(answers).save(out)
    config = {"model_type": "answers", "model": json.loads(recipe.read_text())["model"], "records": len(answers),
              "answer_tokens": sum(len(answer) for _, answer in answers), "file": FILE}  # fmt: skip
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    return config
