"""Draw a training run's curves from its evaluation log: loss (training and held-out) and held-out chain tau."""

from __future__ import annotations

from pathlib import Path

CHAIN_TAU = "held-out greedy chain tau (depth 5)"


def plot_training(log: list[dict], path: Path, *, title: str, tau_label: str = CHAIN_TAU) -> bool:
    """Write the curves to `path` (PNG); False when matplotlib is not installed (`specchat[plot]`)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    steps = [entry["step"] for entry in log]
    figure, (loss, tau) = plt.subplots(1, 2, figsize=(11, 4))
    loss.plot(steps, [entry["train_loss"] for entry in log], label="training (last step)")
    loss.plot(steps, [entry["heldout_loss"] for entry in log], label="held-out")
    loss.set_xlabel("optimizer step")
    loss.set_ylabel("cross-entropy (nats)")
    loss.legend()
    tau.plot(steps, [entry["heldout_chain_tau"] for entry in log], color="tab:green")
    tau.set_xlabel("optimizer step")
    tau.set_ylabel(tau_label)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True
