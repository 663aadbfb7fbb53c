"""A model's tokenizer from its `tokenizer.json` and `tokenizer_config.json`, on the `tokenizers` library alone: the
tokenizer of every GGUF model and of the embedded model, which then launch without importing transformers (about a
second). It answers the part of transformers' tokenizer interface specchat uses, with the same results."""

from __future__ import annotations

import json
from pathlib import Path

from specchat.chat_template_render import render_chat_template

# transformers' named special tokens, in its order (`all_special_ids` lists them so)
SPECIAL_ROLES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class Tokenizer:
    """Text <-> token ids, the vocabulary, the special tokens and the chat template of one model."""

    def __init__(self, backend, special: dict[str, str], extra_special: list[str], chat_template: str | None):
        self.backend = backend  # a tokenizers.Tokenizer
        self.special = special  # role ("bos_token", ...) -> token, for the roles the model has
        self.extra_special = extra_special
        self.chat_template = chat_template

    @classmethod
    def from_dir(cls, directory: str | Path) -> Tokenizer:
        """The tokenizer saved in `directory` by transformers' `save_pretrained`; its `add_bos_token` /
        `add_eos_token`, where the config sets them, rebuild the post-processor as transformers does on load."""
        from tokenizers import Tokenizer as Backend
        from tokenizers.processors import TemplateProcessing

        directory = Path(directory)
        config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
        try:
            backend = Backend.from_file(str(directory / "tokenizer.json"))
        except Exception as error:  # the library's parse errors are bare Exceptions
            raise ValueError(f"cannot read {directory / 'tokenizer.json'}: {error}") from None
        backend.no_truncation()  # as transformers encodes one text unless told otherwise
        backend.no_padding()
        special = {role: _content(config[role]) for role in SPECIAL_ROLES if config.get(role) is not None}
        extra = config.get("extra_special_tokens", config.get("additional_special_tokens")) or []
        if "add_bos_token" in config or "add_eos_token" in config:
            bos, eos = ([special[role]] if config.get(f"add_{role}") and role in special else []
                        for role in ("bos_token", "eos_token"))  # fmt: skip
            backend.post_processor = TemplateProcessing(
                single=[*(f"{t}:0" for t in bos), "$A:0", *(f"{t}:0" for t in eos)],
                special_tokens=[(token, backend.token_to_id(token)) for token in dict.fromkeys(bos + eos)])  # fmt: skip
        template_file = directory / "chat_template.jinja"
        template = template_file.read_text(encoding="utf-8") if template_file.is_file() else config.get("chat_template")
        return cls(backend, special, [_content(token) for token in extra], template)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        ids = [ids] if isinstance(ids, int) else list(ids)
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self.backend.get_vocab(with_added_tokens=True)

    def convert_ids_to_tokens(self, ids):
        if isinstance(ids, int):
            return self.backend.id_to_token(ids)
        return [self.backend.id_to_token(int(i)) for i in ids]

    def convert_tokens_to_ids(self, token: str) -> int | None:
        index = self.backend.token_to_id(token)
        return self.unk_token_id if index is None else index

    @property
    def added_tokens_decoder(self) -> dict:
        """Id -> tokenizers.AddedToken (`content`, `special`) of every token added to the vocabulary."""
        return dict(sorted(self.backend.get_added_tokens_decoder().items()))

    @property
    def all_special_ids(self) -> list[int]:
        tokens = dict.fromkeys([*self.special.values(), *self.extra_special])
        return [self.convert_tokens_to_ids(token) for token in tokens]

    def _id(self, role: str) -> int | None:
        return self.backend.token_to_id(self.special[role]) if role in self.special else None

    bos_token_id = property(lambda self: self._id("bos_token"))
    eos_token_id = property(lambda self: self._id("eos_token"))
    unk_token_id = property(lambda self: self._id("unk_token"))
    pad_token_id = property(lambda self: self._id("pad_token"))

    def apply_chat_template(self, conversation: list[dict], *, tools: list[dict] | None = None,
                            chat_template: str | None = None, add_generation_prompt: bool = False,
                            tokenize: bool = True):  # fmt: skip
        """The conversation through the chat template (`chat_template`, else the model's): its text, or with
        `tokenize` its ids (no special tokens added around it: the template writes them)."""
        template = chat_template or self.chat_template
        if template is None:
            raise ValueError("this tokenizer has no chat template")
        text = render_chat_template(template, conversation, tools=tools, add_generation_prompt=add_generation_prompt,
                                    special_tokens=self.special)  # fmt: skip
        return self.encode(text, add_special_tokens=False) if tokenize else text


def _content(token) -> str:
    """A special token as tokenizer_config.json names it: its text, or a serialized AddedToken's `content`."""
    return token["content"] if isinstance(token, dict) else token
