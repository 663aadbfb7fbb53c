// Activation rows quantized to int8 per group, as llama.cpp quantizes them for these block types: every kernel's
// inner sums are then integers, exact in any order.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace gguf {

// Rows of x quantized to int8 per group of `group` values: x = scale * q; sums of q per 16 values.
struct Quantized {
  int64_t rows = 0, cols = 0, group = 0;
  std::vector<int8_t> q;
  std::vector<float> scale;
  std::vector<int16_t> sums, sums32;  // sums of q per 16 and per 32 values

  Quantized(const float* x, int64_t rows_, int64_t cols_, int64_t group_)
      : rows(rows_), cols(cols_), group(group_), q(rows_ * cols_), scale(rows_ * cols_ / group_),
        sums(rows_ * cols_ / 16), sums32(rows_ * cols_ / 32) {
    for (int64_t g = 0; g < rows * cols / group; ++g) {
      const float* in = x + g * group;
      float amax = 0.0f;
      for (int64_t i = 0; i < group; ++i) amax = std::max(amax, std::fabs(in[i]));
      const float d = amax / 127.0f, inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
      scale[g] = d;
      int8_t* out = q.data() + g * group;
      for (int64_t i = 0; i < group; ++i) out[i] = static_cast<int8_t>(std::nearbyint(in[i] * inverse));
    }
    for (int64_t j = 0; j < rows * cols / 16; ++j) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += q[j * 16 + i];
      sums[j] = static_cast<int16_t>(sum);
    }
    for (int64_t j = 0; j < rows * cols / 32; ++j) sums32[j] = static_cast<int16_t>(sums[2 * j] + sums[2 * j + 1]);
  }
};

}  // namespace gguf
