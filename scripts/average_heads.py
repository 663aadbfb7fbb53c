"""Weight-space average of two TokenSwift heads of one target and draft vocabulary: `TUNED` (fine-tuned from
`BASE` with `train tokenswift --init BASE`) times WEIGHT plus `BASE` times 1 - WEIGHT, written in bf16 to OUT with
TUNED's training.json (the average recorded in it) and curves. Fine-tuned on one kind of text, heads gain on it and
lose some elsewhere; the average trades the gain against the loss (docs/training.md, the 1.5B's heads, compares it
with training on both kinds together).

    python scripts/average_heads.py BASE TUNED WEIGHT OUT
"""

import json
import shutil
import sys
from pathlib import Path

import torch

from specchat.drafters.tokenswift.model import load_heads, save_heads


def main() -> None:
    base_dir, tuned_dir, weight, out = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]), Path(sys.argv[4])
    base, tuned = load_heads(base_dir, dtype=torch.float32), load_heads(tuned_dir, dtype=torch.float32)
    base_state, tuned_state = base.state_dict(), tuned.state_dict()
    if base_state.keys() != tuned_state.keys() or not torch.equal(base.draft_vocab, tuned.draft_vocab):
        raise SystemExit(f"{tuned_dir} is not a fine-tuning of {base_dir}: other blocks or draft vocabulary")
    tuned.load_state_dict({name: weight * value + (1 - weight) * base_state[name] if value.is_floating_point()
                           else value for name, value in tuned_state.items()})  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    save_heads(out, tuned, dtype=torch.bfloat16)
    summary = json.loads((tuned_dir / "training.json").read_text())
    summary["averaged"] = {"base": str(base_dir), "weight_of_tuned": weight}
    (out / "training.json").write_text(json.dumps(summary, indent=1) + "\n")
    shutil.copy(tuned_dir / "curves.png", out / "curves.png")
    print(f"{out}: {weight} x {tuned_dir} + {1 - weight:g} x {base_dir}")


if __name__ == "__main__":
    main()
