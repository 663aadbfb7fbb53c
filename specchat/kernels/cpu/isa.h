// The code path a build's kernels take, named by the instructions it was compiled for: `isa()` of the decoder's
// module and of the GGUF kernels' own.
#pragma once

#include "bf16_dots.h"
#include "gguf/formats.h"

#include <string>

inline std::string isa() {
#if defined(GGUF_VNNI) && defined(BF16_DOTS_NATIVE)
  return amx::ready() ? "avx512 (vnni, bf16, amx)" : "avx512 (vnni, bf16)";
#elif defined(GGUF_VNNI)
  return "avx512 (vnni)";
#elif defined(GGUF_DPBUSD)
  return "avx2 (avx-vnni)";
#elif defined(GGUF_AVX2)
  return "avx2";
#else
  return "portable";
#endif
}
