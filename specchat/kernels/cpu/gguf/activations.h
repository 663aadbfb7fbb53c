// Activation rows quantized to int8 per group, as llama.cpp quantizes them for these block types: every kernel's
// inner sums are then integers, exact in any order. fp32 activations go in two terms (`matmul`, `Quantized`): the
// rows, then what their codes miss, each quantized so, the two products summed: 16 bits of each value, where one
// int8 term flips a small model's near-ties (the embedded model's mean KL against fp32: 0.0030 in one, 0.00007 in two).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <new>
#include <vector>

namespace gguf {

constexpr int64_t kRowChunk = 64;  // activation rows per pass over the weights

// Memory on 64-byte lines: a tile row that straddles two lines loads six times slower (AMX, amx.h).
template <typename T>
struct LineAligned {
  using value_type = T;
  LineAligned() = default;
  template <typename U>
  LineAligned(const LineAligned<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{64})); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t{64}); }
  bool operator==(const LineAligned&) const { return true; }
  bool operator!=(const LineAligned&) const { return false; }
};

// Rows of x quantized to int8 per group of `group` values: x = scale * q; sums of q per 16 and 32 values. With
// `terms` 2 the rows are followed by their rests (x minus scale times code, rounded once), quantized so as rows
// [rows, 2 rows): a row's two products summed hold 16 bits of each value. q's rows are padded with zero rows to a
// multiple of `pad` (16 where AMX tiles read 16 rows in place from any sixteenth, amx.h; elsewhere a decode step's
// one row would zero fifteen more).
struct Quantized {
  int64_t rows = 0, cols = 0, group = 0;
  std::vector<int8_t, LineAligned<int8_t>> q;
  std::vector<float> scale;
  std::vector<int16_t> sums, sums32;  // sums of q per 16 and per 32 values

  Quantized(const float* x, int64_t rows_, int64_t cols_, int64_t group_, int64_t terms = 1, int64_t pad = 1)
      : rows(terms * rows_), cols(cols_), group(group_), q((rows + pad - 1) / pad * pad * cols_),
        scale(rows * cols_ / group_), sums(rows * cols_ / 16), sums32(rows * cols_ / 32) {
    const int64_t groups = rows_ * cols / group;  // a term's
    float rest[256];  // a group's rests: groups hold 32 or 256 values
    for (int64_t g = 0; g < groups; ++g) {
      const float* in = x + g * group;
      quantize_group(in, g);
      if (terms == 1) continue;
      for (int64_t i = 0; i < group; ++i) rest[i] = std::fma(-scale[g], static_cast<float>(q[g * group + i]), in[i]);
      quantize_group(rest, groups + g);
    }
    for (int64_t j = 0; j < rows * cols / 16; ++j) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += q[j * 16 + i];
      sums[j] = static_cast<int16_t>(sum);
    }
    for (int64_t j = 0; j < rows * cols / 32; ++j) sums32[j] = static_cast<int16_t>(sums[2 * j] + sums[2 * j + 1]);
  }

 private:
  // Group g's `group` values: its scale and codes.
  void quantize_group(const float* in, int64_t g) {
    float lanes[16] = {};  // the maximum is exact in any order: kept by lanes, so the compiler vectorizes it
    for (int64_t i = 0; i < group; i += 16)
      for (int l = 0; l < 16; ++l) lanes[l] = std::max(lanes[l], std::fabs(in[i + l]));
    const float amax = *std::max_element(lanes, lanes + 16);
    const float d = amax / 127.0f, inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
    scale[g] = d;
    int8_t* out = q.data() + g * group;
    for (int64_t i = 0; i < group; ++i) out[i] = static_cast<int8_t>(std::nearbyint(in[i] * inverse));
  }
};

}  // namespace gguf
