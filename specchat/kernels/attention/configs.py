"""Block configurations of the Triton kernels, per GPU architecture and head size.

sm80 (A100) has 164 KiB of shared memory per SM and wants 2 pipeline stages at head_dim 128; sm90 (H100)
has 228 KiB and hides HBM latency better with 3-4 stages. Values follow those budgets: a BLOCK_N x BLOCK_D
tile of K and of V per stage must fit next to the queries. Under TRITON_INTERPRET=1 (CPU) big blocks keep
the interpreter's Python loop short, and dots run in fp32 because the interpreter multiplies bf16 bits as
integers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton.language as tl


@dataclass(frozen=True)
class BlockConfig:
    block_m: int  # query rows per program
    block_n: int  # keys per inner-loop iteration
    num_warps: int
    num_stages: int


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def dot_dtype(dtype: torch.dtype):
    """Operand type of `tl.dot`: the input's own (tensor cores, fp32 accumulation) except in the interpreter."""
    if interpreting() or dtype == torch.float32:
        return tl.float32
    return tl.bfloat16 if dtype == torch.bfloat16 else tl.float16


def _arch(device: torch.device) -> int:
    if interpreting() or device.type != "cuda":
        return 0
    major, _ = torch.cuda.get_device_capability(device)
    return 90 if major >= 9 else 80


def tree_config(device: torch.device, head_dim: int) -> BlockConfig:
    """Tree part: at most ~128 queries and keys, so one or two key blocks; latency matters, not throughput."""
    arch = _arch(device)
    if arch == 0:
        return BlockConfig(32, 32, 1, 1)
    stages = 3 if arch == 90 else 2
    return BlockConfig(32, 64 if head_dim <= 64 else 32, 4, stages)


def prefix_config(device: torch.device, head_dim: int, rows: int) -> BlockConfig:
    """Prefix part: `rows` = group * n query rows against a long KV split; bandwidth-bound for small `rows`."""
    arch = _arch(device)
    if arch == 0:
        return BlockConfig(16 if rows <= 16 else 32, 64, 1, 1)
    block_m = 16 if rows <= 16 else 32 if rows <= 32 else 64
    if arch == 90:
        return BlockConfig(block_m, 64 if head_dim > 64 else 128, 4, 4 if block_m <= 32 else 3)
    return BlockConfig(block_m, 64, 4, 3 if block_m <= 32 else 2)
