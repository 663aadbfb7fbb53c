"""The one pipeline every drafter trains through, each stage resumable: the data directory's samples with the
target's features of them (`training_set.py`), the shared loop (`trainer.py`) on the drafter kind's objective,
then `training.json` (recipe, data, times, the evaluation log) and `curves.png` beside the checkpoint in
`<out>`, which is a usable checkpoint from the first state checkpoint on. A kind supplies only a `Trainee`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specchat.training.curves import CHAIN_TAU, plot_training
from specchat.training.trainer import TrainProgress, TrainRecipe, train
from specchat.training.training_set import TrainingSet

SUMMARY = "training.json"
CURVES = "curves.png"


@dataclass
class Trainee:
    """What one drafter kind brings to the pipeline."""

    objective: object  # the kind's loss over a batch (`trainer.py`'s contract), its `module` the trained one
    save: Callable[[], None]  # writes the checkpoint to `<out>`: at each state checkpoint and at the end
    title: str  # of the curves
    summary: dict = field(default_factory=dict)  # the kind's own fields of training.json
    finish: Callable[[], dict] = dict  # after the loop (LongSpec chooses its vocabulary): more summary fields
    tau_label: str = CHAIN_TAU  # the curves' tau axis: what the kind's held-out evaluation measures


def quiet_stage(_name: str, _total: int) -> Callable[[int], None]:
    """The default `stage`: announces nothing and hears no progress."""
    return lambda _tokens: None


def train_drafter(loaded, data: Path | list[Path], out: Path, recipe: TrainRecipe,
                  trainee: Callable[[TrainingSet], Trainee], *, hidden: bool = False, layers: tuple[int, ...] = (),
                  limits: dict[str, int] | None = None, resume: bool = False, checkpoint_minutes: float = 5.0,
                  stage: Callable[[str, int], Callable[[int], None]] = quiet_stage,
                  progress: Callable[[TrainProgress], None] = lambda _p: None) -> dict:  # fmt: skip
    """Train the drafter `trainee(training_set)` describes on `data`, write it and its summary to `out`; returns
    the summary. `hidden`: the features are the target's last hidden states (TokenSwift's heads), not its
    greedy labels and layer states; `layers`: the states entering those target layers (EAGLE-3); `limits`: the most
    samples of each split read from each directory. `stage(name, total)` announces a stage and returns its progress
    callback."""
    data_set = TrainingSet.load(loaded, data, stage, hidden=hidden, layers=layers, limits=limits)
    kind = trainee(data_set)
    start = time.perf_counter()
    done = train(kind.objective, data_set.samples, data_set.features, data_set.heldout, data_set.heldout_features,
                 recipe, out, resume=resume, checkpoint_minutes=checkpoint_minutes, save=kind.save,
                 progress=progress)  # fmt: skip
    seconds = {"features": round(data_set.feature_seconds, 1),
               "training_this_run": round(time.perf_counter() - start, 1)}
    summary = {
        "target": loaded.source.name, "weights": loaded.weights, "dtype": loaded.dtype, "recipe": asdict(recipe),
        **kind.summary, "data": data_set.summary() | ({"limits": limits} if limits else {}), "seconds": seconds,
        "steps": done.step, "log": done.log,
        **kind.finish(),
    }  # fmt: skip
    (out / SUMMARY).write_text(json.dumps(summary, indent=1) + "\n")
    plot_training(done.log, out / CURVES, title=kind.title, tau_label=kind.tau_label)
    return summary
