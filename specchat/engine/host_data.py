"""Host data onto the device without waiting for the device, and device results onto the host in one wait.

On a CUDA device a tensor made from host data (`torch.tensor(values, device="cuda")`) is a blocking copy from
pageable memory: the host waits for every kernel queued before it, and the device then idles while the host
prepares the next launches. A copy from pinned memory is asynchronous: it runs in stream order, and the caching
host allocator keeps the pinned block until it has. The engine's per-step inputs (a tree's tokens, positions and
mask, the rows it keeps, a drafter's newly committed ids) go this way, so a step waits for the device only where
the host must read what it computed, and there it reads everything it needs in one wait (`to_host`): each
`tolist()` of a CUDA tensor is a synchronisation of its own.
"""

from __future__ import annotations

import torch


def to_device(values, device: torch.device | str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`values` (a list, or a tensor on the host) as a tensor on `device`, copied asynchronously to a CUDA device."""
    tensor = torch.as_tensor(values, dtype=dtype)
    if torch.device(device).type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def to_host(*tensors: torch.Tensor) -> list:
    """Each tensor's values (`tolist()`), read after one wait for the device: on CUDA each is copied asynchronously
    into pinned memory and the stream synchronised once."""
    if not tensors or tensors[0].device.type != "cuda":
        return [tensor.tolist() for tensor in tensors]
    pinned = [torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True) for tensor in tensors]
    for host, tensor in zip(pinned, tensors):
        host.copy_(tensor, non_blocking=True)
    torch.cuda.current_stream(tensors[0].device).synchronize()
    return [host.tolist() for host in pinned]
