"""The training loop every drafter shares: AdamW, cosine schedule with warm-up, gradient accumulation, bf16
autocast, periodic held-out evaluation, and checkpoints a stopped run resumes from exactly.

An objective supplies the trainable `module`, `loss(sample, features, rng) -> (summed loss, rows)` and
`evaluate(samples, features) -> metrics`. The order of samples is a seeded shuffle per epoch and each sample's
random draws (positions, lag) come from a generator seeded by (seed, epoch, sample), so a resumed run
takes the same steps as an unbroken one.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from specchat.errors import SpecchatError
from specchat.training.samples import fingerprint

STATE = "train-state.safetensors"


@dataclass(frozen=True)
class TrainRecipe:
    epochs: float = 3.0
    batch: int = 16  # samples per optimizer step (gradients accumulated over them)
    lr: float = 5e-4
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.1
    warmup: float = 0.1  # fraction of the steps
    warmup_steps: int = 0  # when > 0, the warm-up in steps instead of `warmup` (TokenSwift's 50)
    seed: int = 0
    autocast: bool = True  # bf16 autocast (CPUs with AVX-512 bf16 and GPUs run it faster)
    evaluations: int = 10  # held-out evaluations over the run


@dataclass
class TrainProgress:
    step: int
    steps: int
    loss: float  # the last step's mean loss per scored row
    tokens: int  # sample tokens processed by this process
    seconds: float
    log: list[dict] = field(default_factory=list)  # one entry per evaluation

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def learning_rate(step: int, steps: int, recipe: TrainRecipe) -> float:
    """Linear warm-up over the first `warmup` of the steps (or `warmup_steps`), then cosine down to zero."""
    warmup = recipe.warmup_steps or max(1, round(steps * recipe.warmup))
    if step < warmup:
        return recipe.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return recipe.lr * 0.5 * (1 + math.cos(math.pi * progress))


def epoch_order(count: int, epoch: int, seed: int) -> list[int]:
    order = list(range(count))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


def train(objective, samples, features, heldout, heldout_features, recipe: TrainRecipe, out: Path, *,
          resume: bool = False, checkpoint_minutes: float = 5.0, save: Callable[[], None] = lambda: None,
          progress: Callable[[TrainProgress], None] = lambda _progress: None) -> TrainProgress:  # fmt: skip
    """Train `objective.module` on `samples` under `recipe`, keeping its state in `out`; returns the progress.

    `save()` writes the drafter's checkpoint (at each state checkpoint and at the end). A run that finds a
    state in `out` needs `resume` (else it refuses, so nothing is overwritten by mistake).
    """
    out.mkdir(parents=True, exist_ok=True)
    module = objective.module
    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=recipe.lr, betas=recipe.betas, weight_decay=recipe.weight_decay)
    per_epoch = math.ceil(len(samples) / recipe.batch)
    steps = math.ceil(per_epoch * recipe.epochs)
    state = _State(out / STATE, module, optimizer, recipe, fingerprint(samples))
    done = TrainProgress(0, steps, float("nan"), 0, 0.0)
    if state.exists():
        if not resume:
            raise SpecchatError(f"{out} holds a training run; pass --resume to go on with it, or use another --out")
        done.step, done.log = state.load()
    evaluate_every = max(1, steps // max(1, recipe.evaluations))
    start = last_save = time.perf_counter()
    progress(done)
    while done.step < steps:
        epoch, offset = divmod(done.step, per_epoch)
        batch = epoch_order(len(samples), epoch, recipe.seed)[offset * recipe.batch : (offset + 1) * recipe.batch]
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(done.step, steps, recipe)
        done.loss = _step(objective, samples, features, batch, epoch, recipe)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        done.step += 1
        done.tokens += sum(len(samples[i]) for i in batch)
        done.seconds = time.perf_counter() - start
        if done.step % evaluate_every == 0 or done.step == steps:
            done.log.append({"step": done.step, "train_loss": done.loss,
                             "lr": learning_rate(done.step - 1, steps, recipe),
                             **_evaluate(objective, heldout, heldout_features, recipe)})  # fmt: skip
        if done.step == steps or time.perf_counter() - last_save >= checkpoint_minutes * 60:
            state.save(done.step, done.log)
            save()
            last_save = time.perf_counter()
        progress(done)
    return done


def _step(objective, samples, features, batch: list[int], epoch: int, recipe: TrainRecipe) -> float:
    """Accumulate the gradients of one optimizer step; returns its mean loss per scored row."""
    losses, rows = [], 0
    for index in batch:
        rng = random.Random(f"{recipe.seed}:{epoch}:{index}")
        with _autocast(objective, recipe):
            loss, count = objective.loss(samples[index], features.of(index), rng)
        losses.append(loss)
        rows += count
    total = torch.stack(losses).sum() / max(rows, 1)
    total.backward()
    return float(total.detach())


def _evaluate(objective, samples, features, recipe: TrainRecipe) -> dict[str, float]:
    objective.module.eval()
    with _autocast(objective, recipe):
        metrics = objective.evaluate(samples, features)
    objective.module.train()
    return {f"heldout_{name}": value for name, value in metrics.items()}


def bf16_autocast_pays(device: torch.device) -> bool:
    """Whether bf16 autocast speeds a training step up: on GPUs and CPUs with bf16 dot products (AVX-512 BF16,
    AMX), yes; on an AVX2 CPU its conversions made a TokenSwift step ~15x slower than fp32."""
    if device.type != "cpu":
        return True
    cpuinfo = Path("/proc/cpuinfo")
    flags = cpuinfo.read_text() if cpuinfo.is_file() else ""
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _autocast(objective, recipe: TrainRecipe):
    device = next(objective.module.parameters()).device
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=recipe.autocast)


class _State:
    """`<out>/train-state.safetensors`: weights, Adam moments, and the step and log as metadata, replaced whole
    at every checkpoint (a stop while writing leaves the previous one). A run resumes only under its recipe and on
    its samples (`samples`: their fingerprint), whose order and count its steps follow."""

    def __init__(self, path: Path, module: torch.nn.Module, optimizer: torch.optim.Optimizer, recipe: TrainRecipe,
                 samples: str):  # fmt: skip
        self.path, self.module, self.optimizer, self.recipe, self.samples = path, module, optimizer, recipe, samples
        self.names = {id(p): name for name, p in module.named_parameters()}

    def exists(self) -> bool:
        return self.path.is_file()

    def save(self, step: int, log: list[dict]) -> None:
        tensors = {f"model.{name}": p.detach() for name, p in self.module.named_parameters()}
        for p, moments in self.optimizer.state.items():
            for key, value in moments.items():
                tensors[f"adam.{self.names[id(p)]}.{key}"] = torch.as_tensor(value).detach()
        info = {"step": step, "recipe": asdict(self.recipe), "samples": self.samples, "log": log}
        partial = self.path.with_suffix(".partial")
        save_file({k: v.contiguous() for k, v in tensors.items()}, partial, metadata={"state": json.dumps(info)})
        partial.replace(self.path)

    def load(self) -> tuple[int, list[dict]]:
        with safe_open(self.path, "pt") as handle:
            info = json.loads(handle.metadata()["state"])
        # a state written before a recipe field existed was trained with that field's default
        held = {**asdict(TrainRecipe()), **info["recipe"], "betas": tuple(info["recipe"]["betas"])}
        if held != asdict(self.recipe):
            changed = ", ".join(f"{k} {held.get(k)} -> {v}" for k, v in asdict(self.recipe).items() if held.get(k) != v)
            raise SpecchatError(f"{self.path.parent} was trained with another recipe ({changed}); use another --out")
        if info.get("samples", self.samples) != self.samples:  # a state written before it kept them: not checked
            raise SpecchatError(f"{self.path.parent} was trained on other samples (other data, or another "
                                "--max-train-samples); use another --out")  # fmt: skip
        tensors = load_file(self.path)
        with torch.no_grad():
            for name, p in self.module.named_parameters():
                p.copy_(tensors[f"model.{name}"])
                prefix = f"adam.{name}."
                moments = {key[len(prefix) :]: value for key, value in tensors.items()
                           if key.startswith(prefix) and "." not in key[len(prefix) :]}  # fmt: skip
                if moments:
                    self.optimizer.state[p] = moments
        return info["step"], info["log"]
