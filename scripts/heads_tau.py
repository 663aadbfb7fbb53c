"""Held-out figures of TokenSwift heads on a `specchat train data` directory, as the trainer measures them (chain
tau teacher-forced on greedy answers, per-head top-1 / top-3, loss): on its first N held-out records, for each
heads directory in turn, so that checkpoints compare on the same answers. The target is the directory's own
(`recipe.json`); its hidden states are computed once and kept in DATA/features, as a trainer keeps them.

    python scripts/heads_tau.py DATA N HEADS [HEADS ...]
"""

import json
import os
import sys
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from specchat.architectures import parts  # noqa: E402
from specchat.cli.common import load  # noqa: E402
from specchat.drafters.tokenswift.model import load_heads  # noqa: E402
from specchat.drafters.tokenswift.objective import TokenSwiftObjective  # noqa: E402
from specchat.engine.generate import Engine  # noqa: E402
from specchat.training.data import read_records  # noqa: E402
from specchat.training.features import target_hidden  # noqa: E402
from specchat.training.samples import MAX_SAMPLE_TOKENS, samples_of  # noqa: E402
from specchat.training.training_set import target_head  # noqa: E402


@torch.no_grad()
def main() -> None:
    data, count, heads_dirs = Path(sys.argv[1]), int(sys.argv[2]), [Path(d) for d in sys.argv[3:]]
    loaded = load(json.loads((data / "recipe.json").read_text())["model"], "auto", "auto")
    model = loaded.model
    samples = samples_of(list(read_records(data, "heldout"))[:count])
    features = target_hidden(Engine(model, loaded.tokenizer, max_len=MAX_SAMPLE_TOKENS), data, "heldout", samples)
    print(f"{data}: {len(samples)} held-out samples, {sum(map(len, samples))} tokens")
    for folder in heads_dirs:
        heads = load_heads(folder, device=model.device, dtype=torch.float32, target_config=model.config).eval()
        vocab = heads.draft_vocab if heads.draft_vocab is not None else torch.arange(model.config.vocab_size)
        metrics = TokenSwiftObjective(heads, target_head(model), vocab, embed=parts(model).embed).evaluate(
            samples, features)
        print(f"{folder}: " + ", ".join(f"{name} {value:.4f}" for name, value in metrics.items()))


if __name__ == "__main__":
    main()
