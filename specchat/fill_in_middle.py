"""Fill in the middle: a code model's prompt for the text between a prefix and a suffix (an editor's completion at
its cursor), in the order such models are trained on (prefix, suffix, then the middle they write), each part
opened by the model's own marker token. The markers are found by name in the tokenizer: Qwen 2.5 Coder's
`<|fim_prefix|>`, StarCoder's `<fim_prefix>`, DeepSeek Coder's `<｜fim▁begin｜>` and their kin."""

from __future__ import annotations

from dataclasses import dataclass

MARKERS = (  # (before the prefix, before the suffix, before the middle), as each family names them
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
)


@dataclass(frozen=True)
class FimMarkers:
    """The ids that open a prefix, a suffix and the middle."""

    prefix: int
    suffix: int
    middle: int

    def prompt(self, tokenizer, prefix: str, suffix: str) -> list[int]:
        """The ids of the text between `prefix` and `suffix`, still to be written."""
        encode = tokenizer.encode
        return [self.prefix, *encode(prefix, add_special_tokens=False), self.suffix,
                *encode(suffix, add_special_tokens=False), self.middle]  # fmt: skip


def fim_markers(tokenizer) -> FimMarkers | None:
    """The tokenizer's fill-in-the-middle markers, or None where it has none."""
    vocabulary = tokenizer.get_vocab()
    for names in MARKERS:
        if all(name in vocabulary for name in names):
            return FimMarkers(*(vocabulary[name] for name in names))
    return None
