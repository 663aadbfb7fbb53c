"""Which attention verifies trees: `--attention auto | canonical | hybrid`.

"canonical" is the compiled CPU decoder's (`lean_forward`): every row sums in an order its position alone fixes,
so a verified tree row is bitwise the decode step at its position; it runs Llama-family models and Gemma 3 on a
CPU (Gemma's sliding windows included), in specchat's own modules where transformers' do not fit it. "hybrid" is
the torch decoder's (`torch_decoder`): the long prefix without a mask and the small tree part masked, merged by
log-sum-exp, as Triton kernels on a GPU that sum each row in the order its position fixes (in torch on a CPU); it
runs the Llama family without sliding windows.
"auto" is canonical where the CPU decoder runs the model with products that compute each row on its own (bf16 /
fp16 activations, quantized matrices, and fp32 on x86, where its own dense product runs them), or in any where the
torch decoder cannot, else hybrid.

The choice is kept on the model (`use_attention`), whose forward the engine then builds (`target_forward`).
"""

from __future__ import annotations

from specchat.errors import SpecchatError

CHOICES = ("auto", "canonical", "hybrid")


def check_attention(choice: str) -> None:
    if choice not in CHOICES:
        raise SpecchatError(f"unknown attention '{choice}'; use {', '.join(CHOICES)}")


def use_attention(model, choice: str) -> None:
    """Verify `model`'s trees with the attention `choice` names (a one-line error where it cannot run)."""
    check_attention(choice)
    from specchat.engine.lean_forward import FAMILIES, HEAD_DIMS, serves  # torch: not for the CLI
    from specchat.engine.torch_decoder import refusal

    if choice == "canonical" and not serves(model):
        raise SpecchatError(f"canonical attention runs {', '.join(FAMILIES)} models of head_dim "
                            f"{', '.join(map(str, HEAD_DIMS))} on a CPU")  # fmt: skip
    if (choice == "hybrid" or not serves(model)) and (reason := refusal(model.config)):
        raise SpecchatError(reason)
    model.specchat_attention = choice


def attention_of(model) -> str:
    """The attention chosen for `model` (auto when none was)."""
    return getattr(model, "specchat_attention", "auto")


def sliding_window(config) -> bool:
    if "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        return True
    window = getattr(config, "sliding_window", None)
    return bool(window) and getattr(config, "use_sliding_window", True) and window < config.max_position_embeddings
