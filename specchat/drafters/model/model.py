"""Standalone draft models (SpecExtend): a small Llama-family, Gemma 3 or Gemma 2 causal LM that shares the target's
tokenizer.

Three kinds of checkpoint load, each as a model whose layers `drafters/model/drafter.py` runs:

- **A Hugging Face model** (a repo id or a local directory, e.g. `double7/vicuna-68m` for vicuna-7b): its
  own embedding and LM head, loaded by transformers.
- **A GGUF file** (e.g. Qwen2.5-Coder-0.5B beside the 1.5B) on its own blocks, in specchat's own modules.
- **A student distilled here** (`specchat train model-drafter`): the target's first layers, retrained. Its
  embedding and LM head are the target's own, shared at run time and never stored (the default model's
  embedding alone is 57 MB in bf16, four times its two layers); the head may be restricted to a draft
  vocabulary. `config.json` is a Llama config with the key `specchat_student`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from specchat.architectures import parts
from specchat.architectures.rope import rope_parameters, stretch_with_yarn
from specchat.drafters.checkpoint import read_checkpoint, write_checkpoint
from specchat.errors import SpecchatError, first_line
from specchat.gguf_header import names_gguf_file
from specchat.ollama_models import ollama_gguf
from specchat.tokenizer import Tokenizer

# the decoders whose layers the drafter runs
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "granite", "smollm3", "gemma3_text", "gemma2")
STUDENT = "specchat_student"  # config.json: {"target": the target's name, "layers": the target layers it began as}
# ids a draft's vocabulary may have more or fewer than the target's, as llama.cpp bounds it: a family's sizes differ by
# padding or a few added tokens (Qwen2.5 0.5B's 151,936 against 7B's 152,064; Gemma 3 1B's 262,144 against 4B's 262,208)
MAX_VOCAB_DIFFERENCE = 128


@dataclass
class DraftModel:
    """The draft's decoder (a transformers `*ForCausalLM`, or from a GGUF file specchat's `CausalLM`; for a
    student, its embedding and head are the target's) and, for a student, its draft vocabulary (None: the whole
    vocabulary)."""

    model: nn.Module
    student: bool
    draft_vocab: torch.Tensor | None = None

    @property
    def config(self):
        return self.model.config

    def weight_bytes(self) -> int:
        """Its own weights: everything but a student's shared embedding and head."""
        decoder = parts(self.model)
        shared = {id(p) for m in (decoder.embed, decoder.head) for p in m.parameters()}
        own = [p for p in self.model.parameters() if not (self.student and id(p) in shared)]
        return sum(p.numel() * p.element_size() for p in own)


def student_from_target(target: nn.Module, layers: int) -> nn.Module:
    """A `layers`-layer student initialised from the target's first layers, final norm, embedding and LM head
    (shared modules, not copies: training freezes them). The target must be dense (not 4-bit)."""
    from transformers import AutoModelForCausalLM

    fields = {**target.config.to_dict(), "num_hidden_layers": layers}
    if fields.get("layer_types"):  # validated against num_hidden_layers as the config is built
        fields["layer_types"] = fields["layer_types"][:layers]
    config = target.config.__class__.from_dict(fields)
    with torch.device("meta"):
        student = AutoModelForCausalLM.from_config(config)
    source, decoder = parts(target), parts(student)
    decoder.share_embedding_and_head(source.embed, source.head)
    own = {name: tensor for name, tensor in target.state_dict().items() if decoder.in_first_layers(name, layers)}
    student.load_state_dict({name: tensor.detach().clone() for name, tensor in own.items()}, strict=False, assign=True)
    decoder.rebuild_rotary(target.device)
    return student


def save_student(path: Path, student: nn.Module, *, target: str, draft_vocab: torch.Tensor | None = None,
                 dtype: torch.dtype = torch.bfloat16) -> None:  # fmt: skip
    """config.json and model.safetensors of the student's own tensors (layers and final norm) in `dtype`, with
    `draft_vocab` when reduced."""
    layers = student.config.num_hidden_layers
    own = parts(student).in_first_layers
    tensors = {name: t.to(dtype) for name, t in student.state_dict().items() if own(name, layers)}
    if draft_vocab is not None:
        tensors["draft_vocab"] = draft_vocab.long()
    config = {**student.config.to_dict(), STUDENT: {"target": target, "layers": list(range(layers))}}
    for name in ("torch_dtype", "dtype", "_name_or_path"):  # how this run loaded the target, not the student's
        config.pop(name, None)
    write_checkpoint(path, config, tensors)


def load_draft_model(source: str | Path, target: nn.Module, tokenizer=None) -> DraftModel:
    """The draft model at `source` (a checkpoint directory, a GGUF file, a model ollama has pulled or a Hugging Face
    repo id) beside `target`, on its device and in its dtype; one-line errors for what cannot be drafted with. A
    Hugging Face model's tokenizer must equal the target's `tokenizer` (when given); a student shares the target's
    embedding."""
    path = Path(source).expanduser()
    if path.is_dir() and (path / "config.json").is_file() and STUDENT in _read_config(path):
        return _load_student(path, target)
    named = names_gguf_file(path)
    pulled = None if path.is_dir() or named else ollama_gguf(str(source))
    gguf = named or pulled is not None
    if gguf:
        from specchat.loading import gguf_checkpoint, gguf_file

        path = gguf_file(pulled or path)
        source = gguf_checkpoint(path)  # its converted config and tokenizer
        draft = _load_gguf(path, source, target)
    else:
        if not path.is_dir():
            from specchat.hub_download import REPO_ID, download_checkpoint

            if not REPO_ID.match(str(source)):
                raise SpecchatError(f"could not load the draft model '{source}': no such directory, GGUF file, "
                                    "Hugging Face repo or model ollama has pulled")  # fmt: skip
            source = download_checkpoint(str(source))
        draft = _load_pretrained(str(source), target)
    if tokenizer is not None:
        check_tokenizers(_own_tokenizer(str(source), gguf), tokenizer, str(source))
    return draft


def _own_tokenizer(source: str, gguf: bool):
    """The draft model's tokenizer: a GGUF file's as converted (specchat's, as its target's), else transformers'."""
    try:
        if gguf:
            return Tokenizer.from_dir(source)
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as error:
        raise SpecchatError(f"could not load the draft model's tokenizer '{source}': {first_line(error)}") from None


def _load_student(path: Path, target: nn.Module) -> DraftModel:
    from transformers import AutoConfig, AutoModelForCausalLM

    data, tensors = read_checkpoint(path)
    draft_vocab = tensors.pop("draft_vocab", None)
    data = {k: v for k, v in data.items() if k != STUDENT}
    config = AutoConfig.for_model(**data)
    _check_shapes(config, target.config, path)
    stretch_with_yarn(config, target_stretch(config, target.config))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    source, decoder = parts(target), parts(model)
    decoder.share_embedding_and_head(source.embed, source.head)
    expected = {name for name in model.state_dict() if decoder.in_first_layers(name, config.num_hidden_layers)}
    if set(tensors) != expected:
        odd = sorted(set(tensors) ^ expected)[0]
        raise SpecchatError(f"{path}: the student's tensors do not match its config ({odd})")
    own = {k: v.to(device=target.device, dtype=target.dtype) for k, v in tensors.items()}
    model.load_state_dict(own, strict=False, assign=True)  # the shared modules stay the target's, untouched
    decoder.rebuild_rotary(target.device)
    return DraftModel(model.eval(), student=True, draft_vocab=draft_vocab)


def _load_gguf(path: Path, config_dir: str, target: nn.Module) -> DraftModel:
    from specchat.architectures.llama_model import ModelConfig
    from specchat.quant.gguf_model import load_gguf_model

    if target.device.type != "cpu":
        raise SpecchatError(f"GGUF draft models run on a CPU; the target is on {target.device}")
    try:
        stretch = target_stretch(ModelConfig.from_dir(config_dir), target.config)
        model = load_gguf_model(path, config_dir, target.dtype, yarn=stretch)
    except ValueError as error:
        raise SpecchatError(f"could not load the draft model '{path}': {first_line(error)}") from None
    return _checked(model, str(path), target)


def _load_pretrained(source: str, target: nn.Module) -> DraftModel:
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(source)
        stretch_with_yarn(config, target_stretch(config, target.config))
        model = AutoModelForCausalLM.from_pretrained(source, config=config, dtype=target.dtype,
                                                     attn_implementation="eager")  # fmt: skip
    except (OSError, ValueError) as error:
        raise SpecchatError(f"could not load the draft model '{source}': {first_line(error)}") from None
    return _checked(model.to(target.device), source, target)


def _checked(model: nn.Module, source: str, target: nn.Module) -> DraftModel:
    """A pretrained draft model, refused in one line where its family or vocabulary cannot draft. A vocabulary up to
    MAX_VOCAB_DIFFERENCE ids longer or shorter than the target's drafts over the ids both have (`check_tokenizers`
    makes sure they mean the same)."""
    if model.config.model_type not in FAMILIES:
        raise SpecchatError(f"the draft model '{source}' is a {model.config.model_type}; "
                            f"specchat drafts with {', '.join(FAMILIES)} models")
    mine, theirs = model.config.vocab_size, target.config.vocab_size
    if abs(mine - theirs) > MAX_VOCAB_DIFFERENCE:
        raise SpecchatError(f"the draft model '{source}' has a vocabulary of {mine} tokens; the target's has {theirs}")
    shared = None if mine == theirs else torch.arange(min(mine, theirs), device=target.device)
    return DraftModel(model.eval().requires_grad_(False), student=False, draft_vocab=shared)


def target_stretch(config, target_config) -> float | None:
    """The YaRN factor that stretches a plain-RoPE draft's window (`config`) to its target's where the target's is
    stretched by YaRN (`--yarn`, or its file's), so that past its own trained window the draft reads positions as
    the target does; None where there is nothing to stretch."""
    plain = rope_parameters(config).get("rope_type", "default") == "default"
    if rope_parameters(target_config).get("rope_type") != "yarn" or not plain:
        return None
    factor = target_config.max_position_embeddings / config.max_position_embeddings
    return factor if factor > 1 else None


def check_tokenizers(draft, target, name: str) -> None:
    """Refuse, in one line, a draft whose tokenizer differs from the target's: the ids both have must mean the same
    (one may list up to MAX_VOCAB_DIFFERENCE more, as a larger sibling's padding or added tokens)."""
    if abs(len(draft) - len(target)) > MAX_VOCAB_DIFFERENCE:
        raise SpecchatError(
            f"the draft model '{name}' has {len(draft)} tokens; the target's tokenizer has {len(target)}"
        )
    for role in ("bos_token_id", "eos_token_id", "unk_token_id"):
        if getattr(draft, role) != getattr(target, role):
            raise SpecchatError(
                f"the draft model '{name}' has {role.removesuffix('_id')} {getattr(draft, role)}; "
                f"the target's is {getattr(target, role)}"
            )
    shared = min(len(draft), len(target))
    mine, theirs = ({w: i for w, i in t.get_vocab().items() if i < shared} for t in (draft, target))
    if mine != theirs:
        word = next(w for w in {**mine, **theirs} if mine.get(w) != theirs.get(w))
        raise SpecchatError(f"the draft model '{name}' maps {word!r} to another id than the target")


def _read_config(path: Path) -> dict:
    import json

    try:
        return json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return {}


def _check_shapes(config, target_config, path: Path) -> None:
    """A student shares the target's embedding and head: same hidden size and vocabulary."""
    for name in ("hidden_size", "vocab_size"):
        if getattr(config, name) != getattr(target_config, name):
            raise SpecchatError(
                f"{path}: the student has {name} {getattr(config, name)}; the target has {getattr(target_config, name)}"
            )
