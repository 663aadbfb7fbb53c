"""A text's keys and values in a file, read back by a later run (llama.cpp's `--prompt-cache`): a long document
asked about again, or a conversation going on, is read from disk instead of prefilled again, which on a CPU is the
difference between seconds and minutes.

The file is safetensors: the text's ids (the last prompt and its answer) and every layer's `TreeCache.copy`, with
the identity of what computed them (`identity`: the model, its weights and config, the activations' dtype, the
cache's format, the forward and its build). A later prompt takes the longest prefix it shares with the file's,
and only where reuse is exact (`Engine.exact_reuse`): the keys and values read back are then bitwise what
prefilling that prefix again would write, so the answer is the one a run without the file gives.
"""

from __future__ import annotations

import hashlib
import json
import os
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from specchat.architectures import parts
from specchat.checks import PROMPT_CACHE_KIND, safetensors_metadata


def identity(engine) -> str:
    """What the cached keys and values depend on, bit for bit (threads do not: each row's sums are its own)."""
    from specchat.kernels.cpu.cpu_decoder import cpu_decoder, source_version
    from specchat.quant.formats import weight_format

    model = engine.model
    fields = json.dumps(vars(model.config), sort_keys=True, default=str)
    config = hashlib.sha256(fields.encode()).hexdigest()[:16]
    frequencies = [rotary.inv_freq for rotary in parts(model).rotaries if hasattr(rotary, "inv_freq")]
    rope = hashlib.sha256(b"".join(t.cpu().numpy().tobytes() for t in frequencies)).hexdigest()[:16]  # as fitted
    return json.dumps({
        "model": model.name_or_path, "config": config, "weights": weight_format(model), "dtype": str(model.dtype),
        "kv_cache": engine.cache.kv_cache, "forward": f"CPU decoder {cpu_decoder().isa()} {source_version()}",
        "rope": rope,
    }, sort_keys=True)  # fmt: skip


def read_prompt_cache(engine, path: Path, prompt_ids: list[int]) -> int:
    """Hold in `engine` the longest prefix of `prompt_ids` that the file at `path` caches (the last prompt token
    is always run, for its logits), where it is longer than what the engine's own cache shares with the prompt; how
    many tokens the engine then holds of it. The file is not read when there is none, or it is another model's.
    Raises OSError for a file that cannot be read (cut short)."""
    held = engine.cache.reach(_shared(engine.ids[: engine.cache.length], prompt_ids))
    if not path.exists() or not engine.exact_reuse or safetensors_metadata(path).get("identity") != identity(engine):
        return held
    with _as_os_error(), safe_open(path, "pt") as file:
        cached = file.get_tensor("ids").tolist()
        shared = _shared(cached, prompt_ids)
        if shared <= held:
            return held
        parts = sorted({key for key in file.keys() if key != "ids"}, key=lambda key: tuple(map(int, key.split("."))))
        layers: list[list[torch.Tensor]] = [[] for _ in range(len(engine.cache.layers))]
        for key in parts:
            layers[int(key.split(".")[0])].append(file.get_tensor(key))
        dtype = getattr(torch, file.metadata()["dtype"].removeprefix("torch."))
    if not engine.cache.restorable(layers, shared):  # a sliding window's layers hold the file's last positions only
        return held
    engine.hold_prefix(cached[:shared], [tuple(parts) for parts in layers], dtype)
    return shared


def _shared(ids: list[int], prompt_ids: list[int]) -> int:
    """How many leading tokens `ids` share with the prompt but its last."""
    return next((i for i, (a, b) in enumerate(zip(ids, prompt_ids[:-1])) if a != b), min(len(ids), len(prompt_ids) - 1))


def write_prompt_cache(engine, path: Path) -> bool:
    """Write the text the engine's cache holds (the last prompt and its answer: a next turn's prompt holds both) to
    `path`, replacing the file in one step: a stop midway leaves the old file whole. False, and nothing written,
    where reuse is not exact or the cache is empty. Raises OSError where it cannot be written (a full disk)."""
    if not (engine.exact_reuse and engine.cache.length):
        return False
    ids = engine.ids[: engine.cache.length]
    tensors = {"ids": torch.tensor(ids, dtype=torch.int32)}
    for index, layer in enumerate(engine.cache.copy(len(ids))):
        tensors |= {f"{index}.{part}": tensor.contiguous() for part, tensor in enumerate(layer)}
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")  # two runs on one file never share it
    metadata = {"kind": PROMPT_CACHE_KIND, "identity": identity(engine), "dtype": str(engine.cache.dtype)}
    try:
        with _as_os_error():
            save_file(tensors, partial, metadata=metadata)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return True



@contextmanager
def _as_os_error():
    """safetensors reports its I/O errors (a file cut short, a full disk) as its own: here they are OSErrors."""
    try:
        yield
    except SafetensorError as error:
        raise OSError(str(error)) from None
