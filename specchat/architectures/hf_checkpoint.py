"""A Hugging Face checkpoint (config.json and safetensors) in specchat's own modules (`causal_lm`), on a CPU, for the
models whose transformers modules the CPU decoder cannot read (`lean_forward.needs_own_modules`: Gemma 3's norms hold
w where it reads 1 + w, Phi-3's projections are fused, sliding windows). They then run on the CPU decoder as their
GGUF files do, on dense weights in the activations' dtype. A multimodal Gemma 3 checkpoint (4B and larger) loads its
text model; its vision tower stays on disk.

Names are transformers' (the own modules mirror its tree); what differs is placed here: Phi-3's fused matrices are
split into the projections they stack (`fuse_projections` stacks them again), Gemma's norms take their 1 + w, and
Gemma's embedding scales its rows on lookup, as transformers' does, its weight staying the tied LM head's.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from specchat.architectures import causal_lm
from specchat.architectures.llama_model import ModelConfig, ScaledEmbedding, Slot, dense_linear
from specchat.architectures.phi3 import FUSED_PROJECTIONS
from specchat.architectures.rope import stretch_with_yarn

# where a multimodal checkpoint keeps its text model's tensors, as transformers wrote them before 4.52 and since
TEXT_MODEL = {"language_model.model.": "model.", "language_model.lm_head.": "lm_head.",
              "model.language_model.": "model."}  # fmt: skip
MULTIMODAL_ONLY = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")


def text_config(config):
    """A multimodal config's text model's (Gemma 3 4B and larger), else `config`."""
    return config.text_config if config.model_type == "gemma3" else config


def load_checkpoint_model(location: str, config, dtype: torch.dtype, *, yarn: float | None = None) -> nn.Module:
    """The model in the directory `location` (`config` its transformers config) in specchat's own modules, its
    matrices dense in `dtype`; with `yarn`, its window stretched that many times. A ValueError names what is
    missing."""
    from transformers import GenerationConfig

    directory = Path(location)
    config = ModelConfig(text_config(config).to_dict())
    stretch_with_yarn(config, yarn)
    model = causal_lm(config, dtype, name_or_path=str(directory))
    modules: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in _tensors(directory):
        module, _, field = name.rpartition(".")
        modules.setdefault(module, {})[field] = tensor
    for module, fields in modules.items():
        parent, _, name = module.rpartition(".")
        if name in FUSED_PROJECTIONS:
            _split(model.get_submodule(parent), name, fields["weight"], dtype)
        else:
            _place(model, module, fields, dtype)
    if isinstance(model.lm_head, Slot):  # tied: the embedding's weight, unscaled
        model.lm_head = dense_linear(model.model.embed_tokens.weight, None, dtype)
    if (directory / "generation_config.json").is_file():  # its EOS ids and sampling defaults, read as transformers does
        model.generation_config = GenerationConfig.from_pretrained(directory)
    missing = [name for name, p in [*model.named_parameters(), *model.named_buffers()] if p.is_meta]
    if missing:
        raise ValueError(f"the checkpoint has no tensor for {', '.join(missing[:3])}")
    return model


def weight_files(location: str) -> list[Path]:
    """The safetensors files of the checkpoint in the directory `location`: its index's, or model.safetensors."""
    directory = Path(location)
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        return [directory / file for file in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    if (directory / "model.safetensors").is_file():
        return [directory / "model.safetensors"]
    raise ValueError(f"{directory} has no model.safetensors (specchat reads safetensors weights)")


def _tensors(directory: Path):
    """(name, tensor) of the text model's tensors, by transformers' names, from every safetensors file of the
    checkpoint."""
    from safetensors import safe_open

    for file in weight_files(str(directory)):
        with safe_open(file, framework="pt") as weights:
            for name in weights.keys():
                own = _text_name(name)
                if own is not None:
                    yield own, weights.get_tensor(name)


def _text_name(name: str) -> str | None:
    """`name` as the text model's module tree has it, or None for a tensor it does not hold (a vision tower's, a
    rotary table some checkpoints store)."""
    if name.startswith(MULTIMODAL_ONLY) or name.endswith("rotary_emb.inv_freq"):
        return None
    for prefix, own in TEXT_MODEL.items():
        if name.startswith(prefix):
            return own + name.removeprefix(prefix)
    return name


def _place(model: nn.Module, module: str, fields: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
    """The layer made of a module's tensors in the `Slot` at `module`, or a norm's weight there."""
    try:
        current = model.get_submodule(module)
    except AttributeError:
        kind = model.config.model_type
        raise ValueError(f"the checkpoint's tensor {module}.weight has no place in a {kind} model") from None
    weight = fields["weight"]
    if not isinstance(current, Slot):  # a norm: in the activations' dtype or its own (Gemma's fp32, holding 1 + w)
        weight = weight.float() + getattr(current, "checkpoint_offset", 0.0)
        current.weight = nn.Parameter(weight.to(getattr(current, "weight_dtype", dtype)), requires_grad=False)
    elif current.embedding:
        weight = weight.to(dtype)
        model.set_submodule(module, nn.Embedding.from_pretrained(weight) if current.scale == 1.0
                            else ScaledEmbedding(weight, current.scale, dtype, as_weight=True))  # fmt: skip
    else:
        model.set_submodule(module, dense_linear(weight, fields.get("bias"), dtype))


def _split(parent: nn.Module, name: str, weight: torch.Tensor, dtype: torch.dtype) -> None:
    """A fused matrix (Phi-3's `qkv_proj`, `gate_up_proj`) as the projections it stacks, in order."""
    start = 0
    for part in FUSED_PROJECTIONS[name]:
        end = start + getattr(parent, part).weight.shape[0]
        setattr(parent, part, dense_linear(weight[start:end], None, dtype))
        start = end
