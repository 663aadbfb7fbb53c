// The GGUF block types these kernels multiply, listed once: every table and switch over types is built from
// GGUF_BLOCK_TYPES, so a type is added by its line here, its case in `unpack_row` (unpack.h), its table entry's
// line in a kernels_*.cpp file and, for kernels of its own, its entry in traits.h. How the kernels compute, and why
// their results are exact per row: matmul.h.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Half.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define GGUF_AVX2 1
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
#define GGUF_VNNI 1  // AVX-512 VNNI: four byte products summed into an int32 lane in one step; pairs in 512 bits
#endif
#if defined(GGUF_VNNI) || defined(__AVXVNNI__)
#define GGUF_DPBUSD 1  // vpdpbusd on 256-bit vectors: AVX-512 VNNI's (VL) or AVX-VNNI's (Intel since Alder Lake)
#endif
#endif

#include "../amx_tiles.h"
#if defined(GGUF_VNNI) && defined(AMX_TILES) && defined(__AMX_INT8__)
#define GGUF_AMX 1  // AMX-INT8 (Xeon since Sapphire Rapids): a pair's rows times 16 activation rows a tile product
#endif

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

namespace gguf {

// name, ggml's type id (as GGUF files store it), values and bytes per block, whether the integer form's codes are
// signed (Q8_0, the IQ types, and Q4_0 / Q5_0 once centred) or unsigned.
#define GGUF_BLOCK_TYPES(X)      \
  X(Q4_0, 2, 32, 18, true)       \
  X(Q4_1, 3, 32, 20, false)      \
  X(Q5_0, 6, 32, 22, true)       \
  X(Q5_1, 7, 32, 24, false)      \
  X(Q8_0, 8, 32, 34, true)       \
  X(Q2_K, 10, 256, 84, false)    \
  X(Q3_K, 11, 256, 110, false)   \
  X(Q4_K, 12, 256, 144, false)   \
  X(Q5_K, 13, 256, 176, false)   \
  X(Q6_K, 14, 256, 210, false)   \
  X(IQ2_XXS, 16, 256, 66, true)  \
  X(IQ2_XS, 17, 256, 74, true)   \
  X(IQ3_XXS, 18, 256, 98, true)  \
  X(IQ1_S, 19, 256, 50, true)    \
  X(IQ4_NL, 20, 32, 18, true)    \
  X(IQ3_S, 21, 256, 110, true)   \
  X(IQ2_S, 22, 256, 82, true)    \
  X(IQ4_XS, 23, 256, 136, true)  \
  X(IQ1_M, 29, 256, 56, true)

enum Type : int64_t {
#define GGUF_TYPE_ID(name, id, values, bytes, is_signed) name = id,
  GGUF_BLOCK_TYPES(GGUF_TYPE_ID)
#undef GGUF_TYPE_ID
};

struct Layout {
  int64_t values, bytes;  // per block
  bool is_signed;
};

// f(std::integral_constant<int64_t, TYPE>{}) for the block type `type`; a type not in the list is refused.
template <typename F>
inline decltype(auto) visit_type(int64_t type, F f) {
  switch (type) {
#define GGUF_TYPE_CASE(name, id, values, bytes, is_signed) \
  case name: return f(std::integral_constant<int64_t, name>{});
    GGUF_BLOCK_TYPES(GGUF_TYPE_CASE)
#undef GGUF_TYPE_CASE
  }
  TORCH_CHECK(false, "no kernel for GGUF block type ", type);
}

template <int64_t TYPE> inline constexpr Layout kLayout{};
#define GGUF_TYPE_LAYOUT(name, id, values, bytes, is_signed) \
  template <> inline constexpr Layout kLayout<name>{values, bytes, is_signed};
GGUF_BLOCK_TYPES(GGUF_TYPE_LAYOUT)
#undef GGUF_TYPE_LAYOUT

inline Layout layout(int64_t type) {
  return visit_type(type, [](auto t) { return kLayout<t()>; });
}

constexpr int64_t kTileRows = 8;  // weight rows per tile (a pair holds two)

// Which code path computes the products: the fastest this build has; its 256-bit kernels (AVX2); every type
// through its rows' integer form (`unpack_row`, then AVX2 where the build has it: what a type without kernels of
// its own runs); the portable loops. All give bitwise the same results; tests pick each in turn.
enum class Path { Best, Avx2, Unpacked, Portable };

inline Path path_named(const std::string& name) {
  if (name == "best") return Path::Best;
  if (name == "avx2") return Path::Avx2;
  if (name == "unpacked") return Path::Unpacked;
  if (name == "portable") return Path::Portable;
  TORCH_CHECK(false, "no kernel path named '", name, "' (best, avx2, unpacked, portable)");
}

inline float half(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
#ifdef GGUF_AVX2
  return _cvtsh_ss(bits);  // F16C: exact, like the portable conversion
#else
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
#endif
}

}  // namespace gguf
