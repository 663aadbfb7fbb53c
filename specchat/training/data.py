"""Self-distillation data: the target answers the prompts itself, since what a drafter must predict is the
target's own output, and the answers are written as jsonl shards that a stopped run resumes.

A record is one turn: `prompt_ids` (the conversation so far, chat template applied, generation prompt
included), `answer_ids` (the target's tokens, EOS included when it stopped there), the messages as text,
its source, split (train / heldout, fixed by the prompt's id) and sampling (greedy, or the profile's
settings seeded by the prompt's id). Generation runs through the engine with the model's default drafter (the
one its profile measured fastest, n-gram without a profile): lossless, and every draw keyed by its place in the text,
so an answer is the target's own token for token whoever drafts it; only the hours differ.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from specchat.errors import SpecchatError
from specchat.training.prompts import Prompt

RECORDS_PER_SHARD = 500
SPLITS = ("train", "heldout")


@dataclass(frozen=True)
class DataRecipe:
    """What the data depends on: a directory holds the data of one recipe, and resumes only with it."""

    model: str
    weights: str
    dtype: str
    seed: int
    max_new_tokens: int
    heldout: float  # fraction of prompts held out
    sampled: float  # fraction of prompts answered with the profile's sampling settings (the rest greedy)
    kind: str = "answers"  # the target's own answers, "text" labelled by its prefill (`text_data.py`), "books"
    prompts: str | None = None  # the name of the --prompts file answered, else the built-in prompts


@dataclass
class DataProgress:
    records: int = 0
    answer_tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.answer_tokens / self.seconds if self.seconds else 0.0


def build_data(loaded, out: Path, prompts: list[Prompt], recipe: DataRecipe, *, tokens: int,
               progress: Callable[[DataProgress], None] = lambda _progress: None) -> DataProgress:  # fmt: skip
    """Answer `prompts` in order, skipping those already in `out`, until `out` holds `tokens` answer tokens."""
    from specchat.engine.prompt import encode_chat
    from specchat.engine.sampling_config import SamplingConfig
    from specchat.loading import decoding_defaults
    from specchat.session import Session

    done, total, writers = open_data(out, recipe)
    progress(total)
    engine = Session.over(loaded, max_len=2048).engine  # the model's default drafter: answers come faster
    defaults = decoding_defaults(loaded)
    start = time.perf_counter()
    for prompt in prompts:
        if total.answer_tokens >= tokens:
            break
        if prompt.id in done:
            continue
        seed = int(prompt.id[:8], 16)
        sampled = (seed % 1000) / 1000 < recipe.sampled
        sampling = SamplingConfig(**{**defaults, "seed": seed}) if sampled else SamplingConfig()
        split = split_of(prompt.id, recipe.heldout)
        messages, records = [], []
        for turn, text in enumerate(prompt.turns):
            messages.append({"role": "user", "content": text})
            prompt_ids = encode_chat(loaded.tokenizer, messages)
            if len(prompt_ids) + recipe.max_new_tokens > engine.capacity:
                break
            answer_ids, finish = [], None
            for event in engine.generate(prompt_ids, sampling=sampling, max_new_tokens=recipe.max_new_tokens):
                answer_ids += event.tokens
                finish = event.finish_reason
            answer = loaded.tokenizer.decode(answer_ids, skip_special_tokens=True)
            messages.append({"role": "assistant", "content": answer})
            records.append({"id": prompt.id, "turn": turn, "source": prompt.source, "split": split,
                            "sampling": dataclasses.asdict(sampling) if sampled else "greedy",
                            "finish": finish, "prompt_ids": prompt_ids, "answer_ids": answer_ids,
                            "messages": list(messages)})  # fmt: skip
        if not records:  # its first turn does not fit the context
            continue
        writers[split].write(records)  # all turns of a prompt at once: a stopped run redoes the prompt whole
        total.records += 1
        total.answer_tokens += sum(len(record["answer_ids"]) for record in records)
        total.seconds = time.perf_counter() - start
        progress(total)
    return total


def open_data(out: Path, recipe: DataRecipe) -> tuple[set[str], DataProgress, dict[str, _ShardWriter]]:
    """`out` checked for `recipe` (created if new): the ids it holds, its progress so far, and its writers."""
    _check_recipe(out, recipe)
    held = list(read_records(out))
    done = {record["id"] for record in held}
    total = DataProgress(records=len(done), answer_tokens=sum(len(record["answer_ids"]) for record in held))
    return done, total, {split: _ShardWriter(out, split) for split in SPLITS}


def read_records(out: Path, split: str | None = None) -> Iterator[dict]:
    """The records in `out`'s shards (of one split, or all), in shard order."""
    for name in (split,) if split else SPLITS:
        for path in _shards(out, name):
            with gzip.open(path, "rt") if path.suffix == ".gz" else path.open() as handle:
                for line in handle:
                    if line.endswith("\n"):  # a last line without one was cut by a stopped run
                        yield json.loads(line)


def _shards(out: Path, split: str) -> list[Path]:
    """`split`'s shards in order: the full ones sealed as `.jsonl.gz` (a third of the bytes: the answers are kept
    in the repository), the last one plain while it grows. A plain shard whose sealed copy exists is one a stop
    left behind after sealing it."""
    paths = [*out.glob(f"{split}-*.jsonl"), *out.glob(f"{split}-*.jsonl.gz")]
    names = {path.name for path in paths}
    return sorted((path for path in paths if f"{path.name}.gz" not in names), key=lambda path: path.name)


def split_of(record_id: str, heldout: float) -> str:
    """train or heldout, fixed by a record's id (a hex digest): a resumed or grown run keeps every split."""
    return "heldout" if (int(record_id[8:16], 16) % 10_000) / 10_000 < heldout else "train"


class _ShardWriter:
    """Appends records to `{split}-NNNNN.jsonl`, RECORDS_PER_SHARD a shard, and seals each full shard as
    `.jsonl.gz`; repairs a line cut by a stop."""

    def __init__(self, out: Path, split: str):
        self.out, self.split = out, split
        shards = _shards(out, split)
        self.index = len(shards) - 1 if shards else 0
        self.count = 0
        if shards and shards[-1].suffix == ".gz":
            self.count = RECORDS_PER_SHARD
        elif shards:
            _drop_cut_line(shards[-1])
            self.count = sum(1 for _ in shards[-1].open())

    def write(self, records: list[dict]) -> None:
        if self.count >= RECORDS_PER_SHARD:
            _seal(self._path())
            self.index, self.count = self.index + 1, 0
        with self._path().open("a") as handle:
            handle.write("".join(json.dumps(record) + "\n" for record in records))
        self.count += len(records)

    def _path(self) -> Path:
        return self.out / f"{self.split}-{self.index:05d}.jsonl"


def _seal(path: Path) -> None:
    """`path` as `path.gz` (the same bytes for the same records: no timestamp), then without the plain copy."""
    if not path.exists():  # sealed already, by a run stopped before it could start the next shard
        return
    partial = path.with_name(f"{path.name}.gz.partial")
    partial.write_bytes(gzip.compress(path.read_bytes(), compresslevel=9, mtime=0))
    partial.replace(path.with_name(f"{path.name}.gz"))
    path.unlink()


def _drop_cut_line(path: Path) -> None:
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])


def _check_recipe(out: Path, recipe: DataRecipe) -> None:
    """Create `out` for `recipe`, or refuse it when it holds data of another recipe."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "recipe.json"
    wanted = dataclasses.asdict(recipe)
    if path.exists():
        held = {"kind": "answers", "prompts": None, **json.loads(path.read_text())}  # older recipes lack these
        if held != wanted:
            changed = ", ".join(f"{key} {held.get(key)} -> {value}" for key, value in wanted.items()
                                if held.get(key) != value)  # fmt: skip
            raise SpecchatError(f"{out} holds data of another recipe ({changed}); use another --out")
        return
    path.write_text(json.dumps(wanted, indent=1) + "\n")
