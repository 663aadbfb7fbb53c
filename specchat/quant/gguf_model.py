"""A Llama-family (llama, qwen2, qwen3, mistral, smollm3, ...) or Gemma model that runs on a GGUF file's own quantized
weights.

The modules are specchat's own (`architectures.llama_model`, `gemma3_model`: transformers' tree, no forward); the dense
reference the blocks are measured against is transformers' model. Block-quantized matrices become `GGUFLinear`s
over the file's memory-mapped blocks (the token embedding a `GGUFEmbedding`, and the LM head, when tied to it, a
`GGUFLinear` over the same blocks): nothing is dequantized to a dense copy. F32 / F16 tensors (norms, biases) are
kept dense in the activation dtype.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from specchat.architectures import causal_lm
from specchat.architectures.llama_model import ModelConfig, ScaledEmbedding, Slot, dense_linear
from specchat.architectures.phi3 import FUSED_PROJECTIONS
from specchat.architectures.rope import stretch_with_yarn
from specchat.gguf_header import tensor_table
from specchat.quant.fused import Rows
from specchat.quant.gguf_linear import GGUFEmbedding, GGUFLinear
from specchat.quant.gguf_types import BLOCK_TYPES, check_type
from specchat.quant.mapped_pages import give_back

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm",  # qwen3's per-head norms
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_PHI3_NAMES = {**_LAYER_NAMES, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}  # fused, as in its repo
_GEMMA3_NAMES = {  # Gemma 3's (and 2's) norms: the MLP's input, and each half's output
    **_LAYER_NAMES,
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
# whose q/k rows llama.cpp's converter interleaves for its RoPE (LlamaModel's permute), undone as they load
PERMUTED_QK = ("llama", "mistral", "granite", "smollm3")


def load_gguf_model(gguf_path: Path, config_dir: str, dtype: torch.dtype, *, yarn: float | None = None) -> nn.Module:
    """The model of `gguf_path` (config and tokenizer already converted to `config_dir`) on the file's own
    weights: block-quantized matrices as `GGUFLinear`s over the memory-mapped blocks; with `yarn`, the window is
    stretched that many times (`stretch_with_yarn`)."""
    config = ModelConfig.from_dir(config_dir)
    stretch_with_yarn(config, yarn)
    model = causal_lm(config, dtype, name_or_path=config_dir)
    tensors = {tensor.name: tensor for tensor in gguf_tensors(gguf_path)}
    check_tensor_types(tensors.values(), gguf_path)
    for module_name, held, rows in _modules(tensors, model.config):
        parent, _, name = module_name.rpartition(".")
        if name in FUSED_PROJECTIONS:  # Phi-3's q/k/v and gate/up in one matrix: one layer, each projection a view
            _install_fused(model.get_submodule(parent), name, held, dtype)
        else:
            _install(model, module_name, held, dtype, rows=rows)
    if "output.weight" not in tensors:  # tied LM head: the embedding's blocks, multiplied as a linear layer
        _install(model, "lm_head", {"weight": tensors["token_embd.weight"]}, dtype)
    return _complete(model)


def dequantized_model(gguf_path: Path, config_dir: str, *, yarn: float | None = None) -> nn.Module:
    """The model of `gguf_path` with every weight dequantized to fp32 by gguf-py: the dense reference its own
    blocks are measured against, and the embedded model's fp32 weights; with `yarn`, its window stretched."""
    from accelerate import init_empty_weights
    from gguf import dequantize
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(config_dir)
    stretch_with_yarn(config, yarn)
    with init_empty_weights(include_buffers=False):
        eager = config.model_type == "gemma2"  # its soft-capped scores: transformers' eager attention only
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                                 attn_implementation="eager" if eager else "sdpa")  # fmt: skip
    state = {}
    for module_name, held, rows in _modules({t.name: t for t in gguf_tensors(gguf_path)}, model.config):
        for field, tensor in held.items():
            values = torch.from_numpy(dequantize(tensor.data, tensor.tensor_type)).float().reshape(tensor.shape[::-1])
            if config.model_type in ("gemma3_text", "gemma2") and module_name.endswith("norm"):
                values = values - 1  # the file holds Gemma's 1 + w, transformers w
            state[f"{module_name}.{field}"] = values if rows is None else values[rows]
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()  # a tied LM head: the embedding's weights
    return _complete(model).eval()


def _complete(model: nn.Module) -> nn.Module:
    """`model`, once no parameter or buffer is left on the meta device (a ValueError naming those left)."""
    missing = [name for name, p in [*model.named_parameters(), *model.named_buffers()] if p.is_meta]
    if missing:
        raise ValueError(f"the GGUF file has no tensor for {', '.join(missing[:3])}")
    return model


ModuleTensors = tuple[str, dict[str, "GGUFTensor"], torch.Tensor | None]


def _modules(tensors: dict[str, GGUFTensor], config) -> Iterator[ModuleTensors]:
    """Each module's name, its tensors by field ("weight", "bias"), and the row order that undoes the q/k row
    interleaving of llama.cpp's converter for llama and mistral (None elsewhere)."""
    modules: dict[str, dict[str, GGUFTensor]] = {}
    for name, tensor in tensors.items():
        if not name.startswith(("rope_freqs.", "rope_factors_")):  # RoPE scaling: the config's (gguf_config)
            module_name, field = _module_name(name, config.model_type)
            modules.setdefault(module_name, {})[field] = tensor
    for module_name, parts in modules.items():
        rows = None
        if config.model_type in PERMUTED_QK and module_name.endswith(("q_proj", "k_proj")):
            heads = config.num_attention_heads if module_name.endswith("q_proj") else config.num_key_value_heads
            rows = _unpermute_rotary_rows(parts["weight"].shape[-1], heads)
        yield module_name, parts, rows


def check_tensor_types(tensors: Iterable[GGUFTensor], path: Path) -> None:
    """A ValueError naming the first of the file's tensors whose type has no kernel here."""
    for tensor in tensors:
        check_type(int(tensor.tensor_type), tensor.name, path)


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of a GGUF file, its bytes mapped from disk (not read until used)."""

    name: str
    tensor_type: object  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # GGUF order: the row length first
    data: np.ndarray  # [rows, row length] for F32 / F16, [rows, bytes per row] for the others


def gguf_tensors(path: Path) -> list[GGUFTensor]:
    """The tensors of a GGUF file, their table read from its header (gguf_header.py, a fraction of a second)."""
    from gguf import GGMLQuantizationType

    try:
        table = tensor_table(path)
    except (ValueError, OSError) as error:
        raise ValueError(f"{path}: cannot be read as GGUF, the file is damaged or truncated ({error})") from None
    data = np.memmap(path, dtype=np.uint8, mode="c")  # copy-on-write: writable for torch, shared pages
    tensors = []
    for name, kind, shape, offset, n_bytes in table:
        if offset + n_bytes > data.size:
            raise ValueError(f"{path}: tensor '{name}' ends past the file's {data.size} bytes: the file is truncated "
                             "(an interrupted download or copy?)")  # fmt: skip
        kind = GGMLQuantizationType(kind)
        rows = int(np.prod(shape[1:]))
        raw = data[offset : offset + n_bytes]
        if kind in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            raw = raw.view(np.float32 if kind == GGMLQuantizationType.F32 else np.float16)
        tensors.append(GGUFTensor(name, kind, tuple(shape), raw.reshape(rows, -1) if len(shape) > 1 else raw))
    return tensors


def _module_name(gguf_name: str, architecture: str) -> tuple[str, str]:
    """The module a GGUF tensor belongs to, and which of its tensors it is ("weight" or "bias")."""
    parts = gguf_name.split(".")
    field = parts.pop() if parts[-1] in ("weight", "bias") else "weight"
    names = {"gemma3_text": _GEMMA3_NAMES, "gemma2": _GEMMA3_NAMES, "phi3": _PHI3_NAMES}.get(architecture, _LAYER_NAMES)
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in names:
        return f"model.layers.{parts[1]}.{names[parts[2]]}", field
    if len(parts) == 1 and parts[0] in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[parts[0]], field
    raise ValueError(f"unexpected tensor '{gguf_name}' in a {architecture} GGUF file")


def _unpermute_rotary_rows(rows: int, heads: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's converter, which interleaves each head's two rotary halves."""
    return torch.arange(rows).view(heads, -1, 2).transpose(1, 2).reshape(rows)


def _install(model, name: str, parts: dict, dtype, *, rows=None) -> None:
    """Put the layer made from a module's GGUF tensors in the `Slot` at `name` (or a norm's weight there), rows
    reordered by `rows`."""
    tensor, bias = parts["weight"], parts.get("bias")
    kind = tensor.tensor_type
    raw = torch.from_numpy(tensor.data)  # [rows, bytes or values per row], mapped from the file
    if rows is not None:
        raw = raw[rows]
    if bias is not None:
        bias = torch.from_numpy(bias.data).float()
        bias = bias if rows is None else bias[rows]
    current = model.get_submodule(name)
    matrix = isinstance(current, Slot)
    embedding = matrix and current.embedding
    if int(kind) in BLOCK_TYPES:
        columns = tensor.shape[0]
        module = GGUFEmbedding(raw, int(kind), columns, dtype=dtype, scale=current.scale) if embedding \
            else GGUFLinear(raw, int(kind), columns, dtype=dtype, bias=bias)  # fmt: skip
        if not embedding and module.unit_rows[0] > 1:  # repacked in tiles: read from its copy from now on
            give_back(tensor.data)
    else:  # F32 / F16 / BF16: norms, biases, unquantized matrices, mapped from the file where already in `dtype`
        weight = _dense(tensor, raw)
        if embedding:  # its rows scaled (and converted) as they are looked up, in fp32 and rounded once, as a
            # GGUFEmbedding's: the table stays the file's mapped memory
            module = nn.Embedding.from_pretrained(weight) if current.scale == 1.0 and weight.dtype == dtype \
                else ScaledEmbedding(weight, current.scale, dtype)  # fmt: skip
        elif matrix:
            module = dense_linear(weight, bias, dtype)
        else:  # a norm: in the activations' dtype, or the one it asks for (Gemma's fp32)
            current.weight = nn.Parameter(weight.to(getattr(current, "weight_dtype", dtype)), requires_grad=False)
            return
    model.set_submodule(name, module)


def _install_fused(parent: nn.Module, name: str, parts: dict, dtype) -> None:
    """A fused matrix (`FUSED_PROJECTIONS[name]`, its projections' rows stacked in that order) as one layer, each
    projection's `Slot` replaced by a `Rows` view of it: what `fuse_projections` makes of separate ones."""
    holder = nn.Module()
    rows = sum(getattr(parent, part).weight.shape[0] for part in FUSED_PROJECTIONS[name])
    holder.register_module("fused", Slot(rows, getattr(parent, FUSED_PROJECTIONS[name][0]).weight.shape[1]))
    _install(holder, "fused", parts, dtype)
    start = 0
    for part in FUSED_PROJECTIONS[name]:
        end = start + getattr(parent, part).weight.shape[0]
        setattr(parent, part, Rows(holder.fused, start, end))
        start = end


def _dense(tensor, raw: torch.Tensor) -> torch.Tensor:
    """An unquantized tensor as the file holds it (F32, F16 or BF16), its mapped memory: converted once, by its user."""
    from gguf import GGMLQuantizationType as Q

    return raw.view(torch.bfloat16) if tensor.tensor_type == Q.BF16 else raw
