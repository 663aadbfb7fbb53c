"""Which attention the target runs: `--attention auto | hybrid | sdpa | eager`.

"hybrid" registers `specchat.kernels`' attention function with transformers as "specchat_hybrid" (with
SDPA's mask builder, so prefill and generic masks behave as under "sdpa") and tells the engine to pass tree
masks as `[1, 1, n, n]` instead of dense `[1, 1, n, prefix + n]` ones. "auto" is hybrid where its Triton
kernels run (a CUDA model with triton installed) and the model has no sliding window, which they do not
implement; elsewhere SDPA, whose fused CPU kernel beats the torch reference of hybrid attention (decode at
4K context on the default model: 107 vs 117 ms per token).
"""

from __future__ import annotations

from specchat.errors import SpecchatError

HYBRID = "specchat_hybrid"
CHOICES = ("auto", "hybrid", "sdpa", "eager")


def check_attention(choice: str) -> None:
    if choice not in CHOICES:
        raise SpecchatError(f"unknown attention '{choice}'; use {', '.join(CHOICES)}")


def use_attention(model, choice: str) -> str:
    """Switch `model` to the attention named by `choice`; returns the transformers implementation name."""
    from specchat.kernels.hybrid import uses_triton  # torch: not for the CLI's option checks

    check_attention(choice)
    sliding = _sliding_window(model.config)
    if choice == "auto":
        choice = "hybrid" if uses_triton(model.device) and not sliding else "sdpa"
    if choice == "hybrid" and sliding:
        raise SpecchatError("this model uses sliding-window attention, which hybrid attention does not support")
    name = HYBRID if choice == "hybrid" else choice
    if name == HYBRID:
        _register()
    if model.config._attn_implementation != name:
        model.set_attn_implementation(name)
    return name


def uses_hybrid(model) -> bool:
    return model.config._attn_implementation == HYBRID


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    from specchat.kernels.transformers_attention import hybrid_attention_forward

    AttentionInterface.register(HYBRID, hybrid_attention_forward)
    AttentionMaskInterface.register(HYBRID, sdpa_mask)


def _sliding_window(config) -> bool:
    if "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        return True
    window = getattr(config, "sliding_window", None)
    return bool(window) and getattr(config, "use_sliding_window", True) and window < config.max_position_embeddings
