"""Which attention the target runs: `--attention auto | hybrid | canonical | sdpa | eager`.

"hybrid" and "canonical" register `specchat.kernels`' tree attention functions with transformers as
"specchat_hybrid" / "specchat_canonical" (with SDPA's mask builder, so prefill and generic masks behave as
under "sdpa") and tell the engine to pass tree masks as `[1, 1, n, n]` instead of dense
`[1, 1, n, prefix + n]` ones. "auto" is hybrid where its Triton kernels run (a CUDA model with triton
installed); on a CPU with bf16 / fp16 activations it is canonical, whose per-query summation order makes
speculative output bitwise equal to autoregressive output (fp32 CPU matmuls are not row-independent, so
canonical attention cannot promise that there); elsewhere SDPA. Neither tree kernel implements sliding
windows.
"""

from __future__ import annotations

from specchat.errors import SpecchatError

HYBRID = "specchat_hybrid"
CANONICAL = "specchat_canonical"
TREE_KERNELS = {"hybrid": HYBRID, "canonical": CANONICAL}  # choice -> registered name
CHOICES = ("auto", "hybrid", "canonical", "sdpa", "eager")


def check_attention(choice: str) -> None:
    if choice not in CHOICES:
        raise SpecchatError(f"unknown attention '{choice}'; use {', '.join(CHOICES)}")


def use_attention(model, choice: str) -> str:
    """Switch `model` to the attention named by `choice`; returns the transformers implementation name."""
    check_attention(choice)
    sliding = sliding_window(model.config)
    if choice == "auto":
        choice = _auto(model, sliding)
    if choice in TREE_KERNELS and sliding:
        raise SpecchatError(f"this model uses sliding-window attention, which {choice} attention does not support")
    name = TREE_KERNELS.get(choice, choice)
    if choice in TREE_KERNELS:
        _register()
    if model.config._attn_implementation != name:
        model.set_attn_implementation(name)
    return name


def uses_tree_masks(model) -> bool:
    """Whether the model's attention takes tree-only `[1, 1, n, n]` masks (it sees the prefix by itself)."""
    return model.config._attn_implementation in TREE_KERNELS.values()


def _auto(model, sliding: bool) -> str:
    import torch

    from specchat.kernels.hybrid import uses_triton  # torch: not for the CLI's option checks

    if sliding:
        return "sdpa"
    if uses_triton(model.device):
        return "hybrid"
    return "canonical" if model.device.type == "cpu" and model.dtype in (torch.bfloat16, torch.float16) else "sdpa"


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    from specchat.kernels.transformers_attention import canonical_attention_forward, hybrid_attention_forward

    for name, forward in ((HYBRID, hybrid_attention_forward), (CANONICAL, canonical_attention_forward)):
        AttentionInterface.register(name, forward)
        AttentionMaskInterface.register(name, sdpa_mask)


def sliding_window(config) -> bool:
    if "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        return True
    window = getattr(config, "sliding_window", None)
    return bool(window) and getattr(config, "use_sliding_window", True) and window < config.max_position_embeddings
