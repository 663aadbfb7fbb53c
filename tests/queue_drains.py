"""Where code running on a CPU would make a CUDA host wait for the device: a model of CUDA's synchronous copies.

On a GPU the host queues kernels and goes on; it waits for the queue to empty (a drain) when it reads a tensor's
values (`int(t)`, `t.tolist()`, a boolean mask's index: its size is data) and when it copies host data into a
tensor (`torch.tensor(list, device=...)`, a blocking copy of pageable memory). The device then idles while the host
prepares the next launches. `QueueDrains` counts, as a run on a CPU dispatches its ops, the transfers that follow
queued work: the drains the same code would cost on a GPU (an upper bound: host-only tensors count as device work).
Host data copied through `specchat.engine.host_data.to_device` is pinned and copied asynchronously there: no drain.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ops = torch.ops.aten
READS = {ops._local_scalar_dense.default, ops.item.default, ops.is_nonzero.default, ops.equal.default,
         ops.nonzero.default, ops.nonzero_numpy.default, ops.masked_select.default, ops.repeat_interleave.Tensor,
         ops._unique2.default, ops.unique_consecutive.default}  # fmt: skip
WRITES = {ops.lift_fresh.default}  # a tensor of host data (torch.tensor, as_tensor, new_tensor, list indices)
ASYNCHRONOUS = "engine/host_data.py:"  # where host data is copied without waiting
NO_KERNEL = {ops.view.default, ops._unsafe_view.default, ops.select.int, ops.slice.Tensor, ops.expand.default,
             ops.t.default, ops.transpose.int, ops.permute.default, ops.unsqueeze.default, ops.squeeze.dim,
             ops.as_strided.default, ops.detach.default, ops.detach_.default, ops.alias.default,
             ops.empty.memory_format, ops.split.Tensor, ops.unbind.int, ops.reshape.default, ops.resolve_conj.default,
             ops.resolve_neg.default}  # fmt: skip


class QueueDrains(TorchDispatchMode):
    """Counts drains (`drains`) and names what caused each (`causes`) while active; `Tensor.tolist` is a read too
    (it dispatches nothing on a CPU)."""

    def __init__(self):
        super().__init__()
        self.drains = 0
        self.causes: list[str] = []
        self._queued = True  # work may be queued before the count starts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in WRITES and _caller().startswith(ASYNCHRONOUS):
            pass
        elif func in READS or func in WRITES or (func is ops.index.Tensor and _boolean(args[1])):
            self._transfer(str(func))
        elif func not in NO_KERNEL:
            self._queued = True
        return func(*args, **(kwargs or {}))

    def _transfer(self, cause: str) -> None:
        if self._queued:
            self.drains += 1
            self.causes.append(f"{cause} at {_caller()}")
        self._queued = False

    def __enter__(self):
        self._restore = on_tolist(lambda: self._transfer("tolist"))
        return super().__enter__()

    def __exit__(self, *exc):
        self._restore()
        return super().__exit__(*exc)


def on_tolist(seen) -> Callable[[], None]:
    """Calls `seen()` at every `Tensor.tolist` (a read that dispatches nothing on a CPU) until the returned function
    restores it."""
    tolist = torch.Tensor.tolist

    def counted(tensor):
        seen()
        return tolist(tensor)

    torch.Tensor.tolist = counted
    return lambda: setattr(torch.Tensor, "tolist", tolist)


def _caller() -> str:
    """The innermost specchat line on the stack."""
    for frame in reversed(traceback.extract_stack()):
        if "/specchat/" in frame.filename:
            return f"{frame.filename.rsplit('/specchat/', 1)[1]}:{frame.lineno}"
    return "?"


def _boolean(indices) -> bool:
    return any(index is not None and index.dtype == torch.bool for index in indices)
