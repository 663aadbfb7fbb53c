"""Draft checkpoints on disk: a directory with `config.json` and `model.safetensors`, never a pickle.

Released drafts name their tensors in slightly different ways (a training prefix, unused projections);
each model's loader says which prefixes to strip and which keys to skip, and every mismatch is one line
that names the checkpoint, the key and both shapes. Matrices may be stored packed in 4 bits
(`packed_weights.py`, `pack_checkpoint`); they are read back as floats, so loaders never see the difference.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specchat.drafters.packed_weights import is_packed, pack, unpack
from specchat.errors import SpecchatError

WEIGHTS = "model.safetensors"
HEADS = "heads.safetensors"  # TokenSwift's heads
PICKLES = (".bin", ".pth", ".pt", ".pkl", ".ckpt")


def read_checkpoint(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """The config and tensors of the checkpoint directory `path`."""
    path = Path(path).expanduser()
    if path.suffix in PICKLES or path.is_dir() and not (path / WEIGHTS).is_file() and _pickles(path):
        raise SpecchatError(f"{path}: specchat reads only safetensors checkpoints and never unpickles .bin/.pth files")
    if not path.is_dir():
        raise SpecchatError(f"{path}: no such checkpoint directory (it holds config.json and {WEIGHTS})")
    for name in ("config.json", WEIGHTS):
        if not (path / name).is_file():
            raise SpecchatError(f"{path}: the checkpoint has no {name}")
    try:
        config = json.loads((path / "config.json").read_text())
        tensors = unpack(load_file(path / WEIGHTS))
    except (ValueError, OSError) as error:
        raise SpecchatError(f"{path}: unreadable checkpoint ({error})") from None
    return config, tensors


def write_checkpoint(path: Path, config: dict, tensors: dict[str, torch.Tensor]) -> None:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=1))
    save_file({name: tensor.detach().contiguous().cpu() for name, tensor in tensors.items()}, path / WEIGHTS)


def pack_checkpoint(path: Path) -> tuple[int, int]:
    """Rewrite the weights of the draft checkpoint directory `path` packed in 4 bits; returns the file's bytes
    before and after. A checkpoint already packed is refused, not packed twice."""
    path = Path(path).expanduser()
    weights = next((path / name for name in (WEIGHTS, HEADS) if (path / name).is_file()), None)
    if weights is None:
        raise SpecchatError(f"{path}: no draft checkpoint here (it holds config.json and {WEIGHTS} or {HEADS})")
    try:
        tensors = load_file(weights)
    except (ValueError, OSError) as error:
        raise SpecchatError(f"{weights}: unreadable safetensors file ({error})") from None
    if is_packed(tensors):
        raise SpecchatError(f"{weights} is packed already")
    before = weights.stat().st_size
    partial = weights.with_suffix(".partial")
    save_file({name: tensor.contiguous() for name, tensor in pack(tensors).items()}, partial)
    partial.replace(weights)
    return before, weights.stat().st_size


def strip_prefix(tensors: dict[str, torch.Tensor], prefixes: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """Keys without the first of `prefixes` they start with (a training wrapper's name)."""
    stripped = {}
    for name, tensor in tensors.items():
        for prefix in prefixes:
            if name.startswith(prefix):
                name = name[len(prefix) :]
                break
        stripped[name] = tensor
    return stripped


def load_into(module: torch.nn.Module, tensors: dict[str, torch.Tensor], source: Path) -> None:
    """Copy `tensors` into `module`'s parameters by name; one-line errors for missing, unknown or misshapen keys. A
    module built on the meta device (no random start for weights about to be replaced) takes them in its own
    dtypes instead."""
    own = module.state_dict()
    missing = sorted(set(own) - set(tensors))
    unknown = sorted(set(tensors) - set(own))
    if missing:
        raise SpecchatError(f"{source}: the checkpoint lacks {missing[0]}" + _more(missing))
    if unknown:
        raise SpecchatError(f"{source}: unexpected tensor {unknown[0]}" + _more(unknown))
    for name, tensor in tensors.items():
        if tensor.shape != own[name].shape:
            raise SpecchatError(
                f"{source}: {name} is {list(tensor.shape)} in the checkpoint, {list(own[name].shape)} for this target"
            )
    if any(tensor.is_meta for tensor in own.values()):
        module.load_state_dict({name: tensor.to(own[name].dtype) for name, tensor in tensors.items()}, assign=True)
    else:
        module.load_state_dict(tensors)


def _pickles(path: Path) -> bool:
    return any(child.suffix in PICKLES for child in path.iterdir())


def _more(names: list[str]) -> str:
    return f" (and {len(names) - 1} more)" if len(names) > 1 else ""
