"""GGUF tensor types: which ones specchat multiplies in their own blocks, and which it keeps dense.

One table: a block type's kernels live in kernels/cpu/gguf/ under the same ggml type id. Adding a type is one
entry here, its line in GGUF_BLOCK_TYPES (kernels/cpu/gguf/formats.h), its case in `unpack_row`
(kernels/cpu/gguf/unpack.h) and its table entry's line in one of kernels/cpu/gguf/kernels_*.cpp: it then runs on
every path through its rows' integer form. Tiles and kernels of its own are an entry in kernels/cpu/gguf/traits.h.
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


BLOCK_TYPES = {  # ggml type id -> layout (kernels/cpu/gguf/formats.h)
    2: BlockType("q4_0", 32, 18),
    3: BlockType("q4_1", 32, 20),
    6: BlockType("q5_0", 32, 22),
    7: BlockType("q5_1", 32, 24),
    8: BlockType("q8_0", 32, 34),
    10: BlockType("q2_k", 256, 84),
    11: BlockType("q3_k", 256, 110),
    12: BlockType("q4_k", 256, 144),
    13: BlockType("q5_k", 256, 176),
    14: BlockType("q6_k", 256, 210),
    16: BlockType("iq2_xxs", 256, 66),
    17: BlockType("iq2_xs", 256, 74),
    18: BlockType("iq3_xxs", 256, 98),
    19: BlockType("iq1_s", 256, 50),
    20: BlockType("iq4_nl", 32, 18),
    21: BlockType("iq3_s", 256, 110),
    22: BlockType("iq2_s", 256, 82),
    23: BlockType("iq4_xs", 256, 136),
    29: BlockType("iq1_m", 256, 56),
}
DENSE_TYPES = {0: "f32", 1: "f16", 30: "bf16"}  # norms, biases; matrices stored unquantized
Q4_1, Q5_0, Q8_0, Q4_K, Q6_K = 3, 6, 8, 12, 14

# A matrix is held in units of rows: the file's blocks a row at a time (1), or repacked in tiles of 8 rows or pairs
# of them (16) where the build reads pairs (kernels/cpu/gguf/matmul.h, `tile`): each tile's codes are read once for all
# its rows' products, which makes prefill and tree verification faster. Held: [rows / unit rows, bytes per unit].


def held_rows(matrix, unit_rows: int) -> int:
    """The weight rows a held matrix has."""
    return matrix.shape[0] * unit_rows


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
