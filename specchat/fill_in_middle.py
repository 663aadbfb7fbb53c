"""Fill in the middle: a code model's prompt for the text between a prefix and a suffix (an editor's completion at
its cursor), in the order such models are trained on (prefix, suffix, then the middle they write), each part
opened by the model's own marker token. The markers are found by name in the tokenizer: Qwen 2.5 Coder's
`<|fim_prefix|>`, StarCoder's `<fim_prefix>`, DeepSeek Coder's `<｜fim▁begin｜>` and their kin. Other files given
for context go first, each after the model's file separator where it has one (Qwen's and StarCoder's repository
format), as llama-server lays out its `input_extra`."""

from __future__ import annotations

from dataclasses import dataclass

from specchat.errors import SpecchatError

MARKERS = (  # (before the prefix, before the suffix, before the middle), as each family names them
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
)
REPOSITORY = (("<|repo_name|>", "<|file_sep|>"), ("<repo_name>", "<file_sep>"))  # (before its name, before a file)
SNIPPET = "\n\n--- snippet ---\n\n"  # before each context file, for a model without a file separator


@dataclass(frozen=True)
class Infill:
    """Code to fill in at a cursor: the text before it and after it, other files for context (name, text), and the
    start of the middle already typed."""

    prefix: str
    suffix: str
    files: tuple[tuple[str, str], ...] = ()
    middle: str = ""


@dataclass(frozen=True)
class FimMarkers:
    """The ids that open a prefix, a suffix and the middle; a repository's name and a file, where the model has
    them."""

    prefix: int
    suffix: int
    middle: int
    repository: int | None = None
    file: int | None = None

    def prompt(self, tokenizer, infill: Infill) -> list[int]:
        """The ids after which the model writes the middle."""

        def encode(text: str) -> list[int]:
            return tokenizer.encode(text, add_special_tokens=False)

        context = []
        if infill.files and self.file is not None:
            context = [self.repository, *encode("project\n")] if self.repository is not None else []
            for name, text in infill.files:
                context += [self.file, *encode(f"{name}\n{text}")]
            context += [self.file, *encode("file\n")]  # the file being edited, unnamed
        elif infill.files:
            context = encode("".join(f"{SNIPPET}{text}" for _, text in infill.files))
        return [*context, self.prefix, *encode(infill.prefix), self.suffix, *encode(infill.suffix), self.middle,
                *encode(infill.middle)]  # fmt: skip


def infill_ids(tokenizer, infill: Infill, model: str = "this model") -> list[int]:
    """The ids after which `model` writes the middle of `infill` (a one-line error where it has no markers)."""
    markers = fim_markers(tokenizer)
    if markers is None:
        raise SpecchatError(f"{model} has no fill-in-the-middle tokens: filling in code needs a code model's "
                            "(Qwen2.5-Coder, StarCoder, DeepSeek Coder)")  # fmt: skip
    return markers.prompt(tokenizer, infill)


def fim_markers(tokenizer) -> FimMarkers | None:
    """The tokenizer's fill-in-the-middle markers, or None where it has none."""
    vocabulary = tokenizer.get_vocab()
    for names in MARKERS:
        if all(name in vocabulary for name in names):
            repository = next(((vocabulary[a], vocabulary[b]) for a, b in REPOSITORY
                               if a in vocabulary and b in vocabulary), (None, None))  # fmt: skip
            return FimMarkers(*(vocabulary[name] for name in names), *repository)
    return None
