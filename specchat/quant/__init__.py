"""Weight-only quantized layers for CPU inference: 4-bit and 8-bit group-wise weights, bf16 or fp32 activations.

A decode step of a small model on a CPU is bound by the bytes of its weights, so the embedded GGUF runs on its
own 4-bit codes (`gguf_model.py`) and any transformers model can be quantized on load (`quantize.py`).
Every matmul goes through one torch kernel (`int4_linear.py`), whose rows do not depend on how many rows share
a call: speculative verification then commits exactly what autoregressive decoding would.
"""
