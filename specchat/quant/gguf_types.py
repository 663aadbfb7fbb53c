"""GGUF tensor types: which ones specchat multiplies in their own blocks, and which it keeps dense.

One table: a block type's kernel lives in kernels/gguf_blocks.h under the same ggml type id, so adding a type
is one entry here and one unpacking case there.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BlockType:
    name: str
    values: int  # per block
    bytes: int  # per block

    def row_bytes(self, columns: int) -> int:
        return columns // self.values * self.bytes


BLOCK_TYPES = {  # ggml type id -> layout (kernels/gguf_blocks.h)
    2: BlockType("q4_0", 32, 18),
    3: BlockType("q4_1", 32, 20),
    6: BlockType("q5_0", 32, 22),
    7: BlockType("q5_1", 32, 24),
    8: BlockType("q8_0", 32, 34),
    12: BlockType("q4_k", 256, 144),
    13: BlockType("q5_k", 256, 176),
    14: BlockType("q6_k", 256, 210),
}
DENSE_TYPES = {0: "f32", 1: "f16", 30: "bf16"}  # norms, biases; matrices stored unquantized

# Every block type's matrices run repacked in tiles of 8 rows, or pairs of them (16 rows) where the build reads
# pairs (kernels/gguf_blocks.h, `tile`): each tile's codes are read once for all its rows' products, which makes
# prefill and tree verification faster. A tiled type is a type of its own to the kernels (100 or 200 plus its block
# type), held [rows / unit rows, bytes per unit].
Q4_K, Q6_K = 12, 14
UNTILED = {unit + kind: kind for kind in BLOCK_TYPES for unit in (100, 200)}  # tiled type -> its block type
UNIT_ROWS = {tiled: 8 if tiled < 200 else 16 for tiled in UNTILED}  # tiled type -> the weight rows of a unit


def held_rows(matrix, type_id: int) -> int:
    """The weight rows a held matrix ([rows, bytes] of blocks, or [rows / unit rows, bytes] of tiles) has."""
    return matrix.shape[0] * UNIT_ROWS.get(type_id, 1)


def check_type(type_id: int, tensor: str, path) -> None:
    """A one-line refusal for a tensor type with no kernel here."""
    if type_id in BLOCK_TYPES or type_id in DENSE_TYPES:
        return
    from gguf import GGMLQuantizationType

    try:
        name = GGMLQuantizationType(type_id).name
    except ValueError:
        name = f"type {type_id}"
    known = ", ".join(t.name.upper() for t in BLOCK_TYPES.values())
    raise ValueError(f"{path}: tensor '{tensor}' is {name}, which specchat cannot run (it runs {known}, F16, F32)")
