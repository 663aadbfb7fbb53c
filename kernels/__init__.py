"""Attention kernels for tree verification; they depend only on torch (and triton when present).

`hybrid_tree_attention` is the public entry point (docs/design.md, "Tree attention"); `reference` is the
torch oracle and CPU path.
"""

from specchat.kernels.hybrid import hybrid_tree_attention

__all__ = ["hybrid_tree_attention"]
