// The GGUF block kernels alone as a Python module, without the decoder: what the tests build for the instruction sets
// this machine does not run by default, to hold their kernels to its own at a fraction of a decoder's compile time.
#include "gguf/python.h"
#include "isa.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("isa", &isa, "The instruction set this build's kernels use.");
  gguf::define_functions(m);
}
