"""specchat's kernels; they depend only on torch, triton (when present) and C++.

- `attention/`: tree attention (hybrid: the prefix unmasked and the tree masked, merged by log-sum-exp, as Triton
  kernels and in torch; canonical: each row summed in an order its position fixes), and the torch oracle;
- `cpu/`: the compiled CPU decoder (its layers `decoder.cpp`, its attention `attention_*.cpp`, its Python module
  `cpu_decoder.cpp`) and its GGUF block kernels (`gguf/`, one file per ISA);
- `layer_kernels.py`: the torch decoder's fused layer steps on a GPU (RMSNorm, RoPE with the KV write,
  SiLU-and-multiply).
"""
