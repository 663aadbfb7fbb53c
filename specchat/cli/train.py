"""`specchat train ...`: training data from a target, then a drafter trained on it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from specchat.checks import check_dtype, check_output_dir
from specchat.cli.common import (
    DeviceOption,
    DtypeOption,
    ModelOption,
    SeedOption,
    app,
    load,
)
from specchat.errors import SpecchatError

train_app = typer.Typer(help="Train drafters for a target: data (the target's own answers), then the drafter.")
app.add_typer(train_app, name="train")


@train_app.command("data")
def train_data(
    out: Annotated[Path, typer.Option("--out", help="Directory of jsonl shards (created; a rerun resumes).")],
    model: ModelOption = None,
    tokens: Annotated[int, typer.Option("--tokens", help="Answer tokens to reach in --out.")] = 300_000,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", help="Longest answer.")] = 320,
    heldout: Annotated[float, typer.Option("--heldout", help="Fraction of prompts held out.")] = 0.02,
    sampled: Annotated[float, typer.Option("--sampled", help="Fraction answered with the profile's sampling "
                                                          "settings; the rest greedy.")] = 0.5,  # fmt: skip
    text: Annotated[bool, typer.Option("--text", help="Teacher labels instead: the standard library's sources "
                                                      "shown as answers, labelled by the target's prefill when a "
                                                      "drafter trains (no generation: several times the tokens an "
                                                      "hour). --tokens counts text tokens.")] = False,
    books: Annotated[int, typer.Option("--books", help="The target's own sampled books instead, of this many "
                                                      "tokens each, at the writer's settings (nine story prompts, "
                                                      "a seed a book). --tokens counts book tokens.")] = 0,
    prompts: Annotated[Path | None, typer.Option("--prompts", help="Answer the prompts of this JSONL file instead "
                                                 "of the built-in ones: {\"prompt\": ...} or {\"turns\": [...]} "
                                                 "a line.")] = None,  # fmt: skip
    seed: SeedOption = None,
    dtype: DtypeOption = "auto",
    device: DeviceOption = "auto",
) -> None:
    """Self-distillation data: prompts from the Python standard library, the system's package documentation
    and open-chat prompts, answered by the target itself (the bench's prompts left out); with --text, existing
    text the target labels; with --books N, books the target writes; with --prompts FILE, your own prompts."""
    if tokens < 1 or max_new_tokens < 1:
        raise SpecchatError("--tokens and --max-new-tokens must be at least 1")
    if not (0 <= heldout < 1 and 0 <= sampled <= 1):
        raise SpecchatError("--heldout must be in [0, 1) and --sampled in [0, 1]")
    if books < 0 or (books and text):
        raise SpecchatError("--books takes a number of tokens a book, and not with --text")
    if prompts is not None and (books or text):
        raise SpecchatError("--prompts is answered by the target: not with --text or --books")
    check_dtype(dtype)
    check_output_dir(out)
    from specchat.training.book_data import build_book_data
    from specchat.training.data import DataRecipe, build_data
    from specchat.training.prompts import all_prompts, file_prompts
    from specchat.training.text_data import TEXT_TOKENS, build_text_data, stdlib_chunks

    asked = file_prompts(prompts) if prompts is not None else None  # a bad file refused before the model loads
    loaded = load(model, dtype, device)
    if text:
        recipe = DataRecipe(loaded.source.name, loaded.weights, loaded.dtype, seed or 0, TEXT_TOKENS, heldout, 0.0,
                            "text")
        done = build_text_data(loaded, out, recipe, tokens=tokens, chunks=stdlib_chunks(recipe.seed))
        print(f"{out}: {done.records} text records, {done.answer_tokens} text tokens")
        return
    if books:
        recipe = DataRecipe(loaded.source.name, loaded.weights, loaded.dtype, seed or 0, books, heldout, 1.0, "books")
        done = _with_bar(tokens, "records",
                         lambda show: build_book_data(loaded, out, recipe, tokens=tokens, progress=show))  # fmt: skip
        print(f"{out}: {done.answer_tokens} book tokens in {done.records} records (books in {out / 'books'})")
        return
    recipe = DataRecipe(loaded.source.name, loaded.weights, loaded.dtype, seed or 0, max_new_tokens, heldout, sampled,
                        prompts=prompts.name if prompts is not None else None)  # fmt: skip
    asked = asked if asked is not None else all_prompts(recipe.seed)
    done = _with_bar(tokens, "prompts",
                     lambda show: build_data(loaded, out, asked, recipe, tokens=tokens, progress=show))  # fmt: skip
    print(f"{out}: {done.records} prompts, {done.answer_tokens} answer tokens ({len(asked)} prompts available)")


def _with_bar(tokens: int, unit: str, build):
    """`build(show)` with a progress bar of the tokens it has written, `show` its callback."""
    from rich.progress import BarColumn, TextColumn, TimeRemainingColumn

    from specchat.logged_progress import LoggedProgress

    columns = (TextColumn("[bold]data"), BarColumn(), TextColumn("{task.completed:,.0f}/{task.total:,.0f} tokens"),
               TextColumn(f"{{task.fields[records]}} {unit} · {{task.fields[rate]:.0f}} tok/s"),
               TimeRemainingColumn())  # fmt: skip
    with LoggedProgress(*columns, transient=False) as bar:
        task = bar.add_task("data", total=tokens, records=0, rate=0.0)

        def show(now):
            bar.update(task, completed=min(now.answer_tokens, tokens), records=now.records, rate=now.tokens_per_second)

        return build(show)


DataOption = Annotated[list[Path], typer.Option(
    "--data", help="Directory of `specchat train data` (repeat it to train on several: answers and text).")]
MaxTrainOption = Annotated[list[int] | None, typer.Option(
    "--max-train-samples", help="Train on the first N samples of each --data directory (0: all), or repeated, of "
    "each in turn: a quicker run, whose features a longer one reuses.")]
MaxHeldoutOption = Annotated[list[int] | None, typer.Option(
    "--max-heldout-samples", help="Evaluate on the first N held-out samples of each --data directory (0: all), or "
    "repeated, of each in turn.")]
DraftOutOption = Annotated[Path, typer.Option("--out", help="Checkpoint directory (created; --resume goes on).")]
TargetOption = Annotated[str | None, typer.Option("--target", "--model", "-m", help="The target model.")]
VocabOption = Annotated[
    int, typer.Option("--vocab", help="Vocabulary the loss is taken over, most frequent answer tokens first (0: all).")
]
EpochsOption = Annotated[float, typer.Option("--epochs", help="Passes over the training samples.")]
BatchOption = Annotated[int, typer.Option("--batch", help="Samples per optimizer step (accumulated).")]
LrOption = Annotated[float, typer.Option("--lr", help="Peak learning rate (cosine, 10% warm-up).")]
CheckpointOption = Annotated[float, typer.Option("--checkpoint-minutes", help="Minutes between checkpoints.")]
ResumeOption = Annotated[bool, typer.Option("--resume", help="Go on with the run in --out.")]
PrecisionOption = Annotated[str, typer.Option(
    "--precision", help="bf16 (autocast), fp32, or auto: bf16 on a GPU or a CPU with bf16 instructions.")]
IntermediateOption = Annotated[int, typer.Option("--intermediate", help="The draft MLP's width (0: the target's).")]


@train_app.command("longspec")
def train_longspec(
    data: DataOption,
    out: DraftOutOption,
    max_train_samples: MaxTrainOption = None,
    max_heldout_samples: MaxHeldoutOption = None,
    target: TargetOption = None,
    epochs: EpochsOption = 3.0,
    batch: BatchOption = 16,
    lr: LrOption = 5e-4,
    vocab: Annotated[int, typer.Option(
        "--vocab", help="Vocabulary trained over, most frequent first (0: all); the shipped one is chosen by "
        "measured speed.")] = 0,
    intermediate: IntermediateOption = 0,
    checkpoint_minutes: CheckpointOption = 5.0,
    resume: ResumeOption = False,
    eval_prompts: Annotated[int, typer.Option("--eval-prompts", help="Held-out prompts decoded at the end.")] = 16,
    precision: PrecisionOption = "auto",
    seed: SeedOption = None,
    dtype: DtypeOption = "auto",
    device: DeviceOption = "auto",
) -> None:
    """A LongSpec draft layer for the target: anchor-offset positions, lag training, loss through the target's
    frozen LM head; then the draft vocabulary whose decoding is fastest here."""
    if eval_prompts < 1 or intermediate < 0:
        raise SpecchatError("--eval-prompts must be at least 1 and --intermediate at least 0")
    from specchat.drafters.longspec.train import train_longspec as run_training

    summary = _train_drafter(run_training, data, out, target, epochs, batch, lr, vocab, checkpoint_minutes, resume,
                             precision, seed, dtype, device, samples=(max_train_samples, max_heldout_samples),
                             eval_prompts=eval_prompts, intermediate=intermediate)  # fmt: skip
    for row in summary["vocab_measurements"]:
        print(f"  vocab {row['vocab']}: tau {row['tau']:.2f}, {row['tokens_per_second']:.1f} tok/s, "
              f"{row['speedup']:.2f}x AR")
    print(f"{out}: LongSpec drafter, draft vocabulary {summary['draft_vocab']}; use --drafter longspec:{out}")


@train_app.command("glide")
def train_glide(
    data: DataOption,
    out: DraftOutOption,
    max_train_samples: MaxTrainOption = None,
    max_heldout_samples: MaxHeldoutOption = None,
    target: TargetOption = None,
    epochs: EpochsOption = 3.0,
    batch: BatchOption = 16,
    lr: LrOption = 5e-4,
    vocab: Annotated[int, typer.Option("--vocab", help="The draft vocabulary: the most frequent answer tokens "
                                                       "(0: all).")] = 0,  # fmt: skip
    intermediate: IntermediateOption = 0,
    checkpoint_minutes: CheckpointOption = 5.0,
    resume: ResumeOption = False,
    precision: PrecisionOption = "auto",
    seed: SeedOption = None,
    dtype: DtypeOption = "auto",
    device: DeviceOption = "auto",
) -> None:
    """A one-layer GLIDE draft for the target: its embedding and LM head the target's (shared, not stored),
    cross-attention to the target's last layer under GLIDE's block-wise lag (blocks of 5)."""
    if intermediate < 0:
        raise SpecchatError("--intermediate must be at least 0")
    from specchat.drafters.glide.train import train_glide as run_training

    summary = _train_drafter(run_training, data, out, target, epochs, batch, lr, vocab, checkpoint_minutes, resume,
                             precision, seed, dtype, device, samples=(max_train_samples, max_heldout_samples),
                             intermediate=intermediate)  # fmt: skip
    last = summary["log"][-1] if summary["log"] else {}
    print(f"{out}: GLIDE drafter, held-out chain tau {last.get('heldout_chain_tau', float('nan')):.2f}; "
          f"use --drafter glide:{out}")  # fmt: skip


@train_app.command("tokenswift")
def train_tokenswift(
    data: DataOption,
    out: DraftOutOption,
    max_train_samples: MaxTrainOption = None,
    max_heldout_samples: MaxHeldoutOption = None,
    target: TargetOption = None,
    epochs: EpochsOption = 3.0,
    batch: BatchOption = 16,
    lr: Annotated[float, typer.Option("--lr", help="Peak learning rate (cosine after --warmup-steps).")] = 5e-3,
    warmup_steps: Annotated[int, typer.Option("--warmup-steps", help="Linear warm-up steps.")] = 50,
    vocab: VocabOption = 0,
    root_input: Annotated[bool, typer.Option("--root-input/--no-root-input",
                                             help="The heads also read the root token t+1 (EAGLE's input).")] = False,
    chain_input: Annotated[bool, typer.Option("--chain-input/--no-chain-input",
                                              help="Each later head also reads the token the head before it guessed "
                                                   "(implies --root-input).")] = False,
    init: Annotated[Path | None, typer.Option("--init", help="Start from these trained heads (their draft "
                                              "vocabulary kept unless --vocab is given; blocks they lack start as "
                                              "no-ops).")] = None,
    checkpoint_minutes: CheckpointOption = 5.0,
    resume: ResumeOption = False,
    precision: PrecisionOption = "auto",
    seed: SeedOption = None,
    dtype: DtypeOption = "auto",
    device: DeviceOption = "auto",
) -> None:
    """TokenSwift's three multi-token heads for the target: chained residual blocks on its last hidden state,
    guessing tokens t+2..t+4 through its frozen LM head (TokenSwift's recipe: LR 5e-3, 50 warm-up steps)."""
    if warmup_steps < 0:
        raise SpecchatError("--warmup-steps must be at least 0")
    if init is not None and not init.is_dir():
        raise SpecchatError(f"--init: {init} is not a directory of TokenSwift heads")
    from specchat.drafters.tokenswift.train import BETAS
    from specchat.drafters.tokenswift.train import train_tokenswift as run_training

    summary = _train_drafter(run_training, data, out, target, epochs, batch, lr, vocab, checkpoint_minutes, resume,
                             precision, seed, dtype, device, samples=(max_train_samples, max_heldout_samples),
                             root_input=root_input, chain_input=chain_input, init=init,
                             recipe_options={"betas": BETAS, "warmup_steps": warmup_steps})  # fmt: skip
    last = summary["log"][-1] if summary["log"] else {}
    accuracy = ", ".join(f"{last.get(f'heldout_head{i + 1}_top1', float('nan')):.2f}" for i in range(summary["gamma"]))
    print(f"{out}: TokenSwift heads, held-out top-1 {accuracy} (heads 1..{summary['gamma']}), "
          f"chain tau {last.get('heldout_chain_tau', float('nan')):.2f}")  # fmt: skip


@train_app.command("eagle3")
def train_eagle3(
    data: DataOption,
    out: DraftOutOption,
    max_train_samples: MaxTrainOption = None,
    max_heldout_samples: MaxHeldoutOption = None,
    target: TargetOption = None,
    epochs: EpochsOption = 1.0,
    batch: BatchOption = 4,
    lr: LrOption = 5e-4,
    vocab: VocabOption = 8192,
    intermediate: Annotated[int, typer.Option("--intermediate", help="The draft MLP's width.")] = 2048,
    steps: Annotated[int, typer.Option("--steps", help="Training-time test: steps the draft is unrolled over "
                                                       "its own outputs.")] = 3,  # fmt: skip
    checkpoint_minutes: CheckpointOption = 5.0,
    resume: ResumeOption = False,
    precision: PrecisionOption = "auto",
    seed: SeedOption = None,
    dtype: DtypeOption = "auto",
    device: DeviceOption = "auto",
) -> None:
    """An EAGLE-3 draft for the target: one layer over the target's low, middle and high layers' states and the
    next token, trained by training-time test (unrolled over its own outputs); saved in the released layout."""
    if intermediate < 1 or steps < 1:
        raise SpecchatError("--intermediate and --steps must be at least 1")
    from specchat.drafters.eagle3.train import train_eagle3 as run_training

    summary = _train_drafter(run_training, data, out, target, epochs, batch, lr, vocab, checkpoint_minutes, resume,
                             precision, seed, dtype, device, samples=(max_train_samples, max_heldout_samples),
                             intermediate=intermediate, steps=steps)  # fmt: skip
    last = summary["log"][-1] if summary["log"] else {}
    print(f"{out}: EAGLE-3 drafter, held-out chain tau {last.get('heldout_chain_tau', float('nan')):.2f}; "
          f"use --drafter eagle3:{out}")  # fmt: skip


@train_app.command("model-drafter")
def train_model_drafter(
    data: DataOption,
    out: DraftOutOption,
    max_train_samples: MaxTrainOption = None,
    max_heldout_samples: MaxHeldoutOption = None,
    target: TargetOption = None,
    layers: Annotated[int, typer.Option("--layers", help="The target's first layers the student starts as.")] = 2,
    epochs: EpochsOption = 3.0,
    batch: BatchOption = 16,
    lr: LrOption = 5e-4,
    vocab: VocabOption = 0,
    checkpoint_minutes: CheckpointOption = 5.0,
    resume: ResumeOption = False,
    precision: PrecisionOption = "auto",
    seed: SeedOption = None,
    dtype: Annotated[str, typer.Option(help="float32 | bfloat16: the target's dense weights the student starts "
                                            "as (not the embedded GGUF's 4-bit ones).")] = "float32",  # fmt: skip
    device: DeviceOption = "auto",
) -> None:
    """A standalone draft model for the target: its first --layers layers and final norm, distilled towards
    its greedy tokens over its own embedding and LM head (shared, frozen and not stored)."""
    from specchat.drafters.model.train import train_model_drafter as run_training

    summary = _train_drafter(run_training, data, out, target, epochs, batch, lr, vocab, checkpoint_minutes, resume,
                             precision, seed, dtype, device, samples=(max_train_samples, max_heldout_samples),
                             layers=layers)  # fmt: skip
    last = summary["log"][-1] if summary["log"] else {}
    print(f"{out}: {summary['layers']}-layer draft model ({summary['checkpoint_bytes'] / 1e6:.1f} MB), held-out chain "
          f"tau {last.get('heldout_chain_tau', float('nan')):.2f}; use --drafter model:{out}")  # fmt: skip


@train_app.command("ngram")
def train_ngram(
    data: Annotated[Path, typer.Option("--data", help="A `train data` directory: its training answers are read.")],
    out: Annotated[Path, typer.Option("--out", help="Checkpoint directory (created); use --drafter ngram:DIR.")],
) -> None:
    """Give n-gram lookup the target's own answers: where the context has no earlier occurrence of its last
    tokens, it proposes what the target wrote after them in other answers."""
    from specchat.drafters.ngram.train import build_answer_store

    check_output_dir(out)
    config = build_answer_store(data, out)
    print(f"{out}: {config['records']} answers of {config['model']}, {config['answer_tokens']} tokens; "
          f"use --drafter ngram:{out}")


@train_app.command("pack")
def train_pack(
    checkpoint: Annotated[Path, typer.Argument(help="A trained draft's checkpoint directory.")],
) -> None:
    """Store a trained draft's matrices in 4 bits, in groups of 32 as its linears run on a CPU: about a third
    of its bf16 size, for a checkpoint that ships. Loaders unpack it; it is not packed twice."""
    from specchat.drafters.checkpoint import pack_checkpoint

    before, after = pack_checkpoint(checkpoint)
    print(f"{checkpoint}: {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB")


def _limits(train: list[int] | None, heldout: list[int] | None, data: list[Path]) -> dict[str, int | list[int]]:
    """The samples of each split to read, where fewer than all (`TrainingSet.load`'s `limits`): one count for every
    directory, or one for each."""
    limits = {}
    for split, counts, flag in (("train", train, "--max-train-samples"), ("heldout", heldout, "--max-heldout-samples")):
        counts = counts or []
        if any(count < 0 for count in counts):
            raise SpecchatError(f"{flag} must be at least 0 (0: all)")
        if len(counts) not in (0, 1, len(data)):
            raise SpecchatError(f"{flag} is given {len(counts)} times: give it once, or once for each of the "
                                f"{len(data)} --data directories")  # fmt: skip
        if any(counts):
            limits[split] = counts[0] if len(counts) == 1 else counts
    return limits


def _train_drafter(run_training, data, out, target, epochs, batch, lr, vocab, checkpoint_minutes, resume, precision,
                   seed, dtype, device, samples: tuple, recipe_options: dict | None = None,
                   **options) -> dict:  # fmt: skip
    """Check the shared options, load the target and run `run_training` under a progress display; `samples`: the
    --max-train-samples and --max-heldout-samples given; `recipe_options` set recipe fields the shared options do
    not."""
    limits = _limits(*samples, data)
    if not all(0 < value < math.inf for value in (epochs, lr, checkpoint_minutes)) or batch < 1 or vocab < 0:
        raise SpecchatError("--epochs, --lr, --checkpoint-minutes must be positive numbers, --batch at least 1, "
                            "--vocab >= 0")  # fmt: skip
    if precision not in ("auto", "bf16", "fp32"):
        raise SpecchatError(f"--precision must be auto, bf16 or fp32, not {precision}")
    check_dtype(dtype)
    check_output_dir(out)
    for folder in data:
        if not (folder / "recipe.json").is_file():
            raise SpecchatError(f"{folder} holds no training data; make it with `specchat train data --out {folder}`")
    from rich.progress import BarColumn, TextColumn, TimeRemainingColumn

    from specchat.logged_progress import LoggedProgress
    from specchat.training.trainer import TrainRecipe, bf16_autocast_pays

    loaded = load(target, dtype, device)
    if precision == "auto":
        precision = "bf16" if bf16_autocast_pays(loaded.model.device) else "fp32"
    recipe = TrainRecipe(epochs=epochs, batch=batch, lr=lr, seed=seed or 0, autocast=precision == "bf16",
                         **(recipe_options or {}))  # fmt: skip
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
               TimeRemainingColumn())
    with LoggedProgress(*columns, transient=False) as bar:

        def stage(name: str, total: int):
            task = bar.add_task(name, total=total or None, info="")
            return lambda count: bar.update(task, advance=count,
                                            info=f"{bar.tasks[task].completed:,.0f}/{total:,} tokens")

        train_task = None

        def show(now):
            nonlocal train_task
            if train_task is None:
                train_task = bar.add_task("training", total=now.steps, info="")
            last = now.log[-1] if now.log else {}
            heldout = f" · held-out tau {last['heldout_chain_tau']:.2f}" if last else ""
            bar.update(train_task, completed=now.step,
                       info=f"step {now.step}/{now.steps} · loss {now.loss:.3f} · "
                            f"{now.tokens_per_second:.0f} tok/s{heldout}")  # fmt: skip

        return run_training(loaded, data, out, recipe, vocab=vocab, resume=resume,
                            checkpoint_minutes=checkpoint_minutes, stage=stage, progress=show, limits=limits,
                            **options)  # fmt: skip
