"""Tree attention for verification: `hybrid_tree_attention` is the entry point (docs/design.md, "Tree attention");
`reference` is the torch oracle and CPU path, `canonical_attention` the order-fixed CPU variant."""

from specchat.kernels.attention.hybrid import hybrid_tree_attention

__all__ = ["hybrid_tree_attention"]
