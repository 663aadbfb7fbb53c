"""The compiled CPU decoder (`cpu_decoder.cpp`, built on first use for the machine's instruction set) and its GGUF
block kernels (`gguf/`)."""
