"""The compiled CPU decoder (`decoder.cpp` and the files beside it, built on first use for the machine's instruction
set) and its GGUF block kernels (`gguf/`)."""
