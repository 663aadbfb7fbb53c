"""Draw `specchat bench` rows: decode tokens/s and tau per method, grouped by prompt set (matplotlib)."""

from __future__ import annotations

from pathlib import Path

from specchat.errors import SpecchatError

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    raise SpecchatError("--plot needs matplotlib: pip install 'specchat[plot]'") from None


def plot_rows(rows: list[dict], path: Path, *, title: str) -> None:
    groups = sorted({(r["prompt_set"], r["dtype"]) for r in rows}, key=lambda g: (g[1], g[0]))
    methods = list(dict.fromkeys(r["drafter"] for r in rows))
    value = {(r["prompt_set"], r["dtype"], r["drafter"]): r for r in rows}
    width = 0.8 / len(methods)
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for axis, key, label in (
        (axes[0], "tokens_per_second", "decode tokens/s"),
        (axes[1], "mean_accepted_length", "tau (tokens per step)"),
    ):
        for m, method in enumerate(methods):
            heights = [(value.get((*g, method)) or {}).get(key) or 0 for g in groups]
            axis.bar([i + m * width for i in range(len(groups))], heights, width, label=method)
        axis.set_xticks([i + width * (len(methods) - 1) / 2 for i in range(len(groups))])
        axis.set_xticklabels([f"{s}\n{d}" for s, d in groups])
        axis.set_ylabel(label)
    axes[0].legend()
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
