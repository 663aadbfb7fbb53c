// Dense rows written as GGUF blocks: what `--quantize q4_k_m` / `q8_0` make of a checkpoint's matrices, so that they
// run on the kernels a GGUF file's own blocks run on.
//
// The searches are those of ggml's reference quantizers (no importance matrix), so a matrix quantized here is as
// close to its dense values as llama-quantize's: Q4_K and Q5_K fit each 32-value sub-block's scale and minimum by
// weighted least squares over 21 (16) trial steps, weights |x| plus the sub-block's RMS; Q6_K fits each 16-value
// sub-block's signed scale over 19 trial steps, weights x^2; the sub-blocks' scales are then rounded onto the
// group's 6-bit (Q6_K: 8-bit) grid and every code rounded again against the rounded scale. Q8_0 and Q5_0 (where a
// row is no whole number of 256-value groups, as llama.cpp falls back) take the largest value's scale.
#pragma once

#include "formats.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace gguf {
namespace quantize {

inline int nearest(float x) { return static_cast<int>(std::nearbyint(x)); }  // ties to even, as ggml rounds

inline uint16_t half_bits(float x) { return c10::Half(x).x; }
inline float as_half(float x) { return static_cast<float>(c10::Half(x)); }  // x rounded to fp16

// The scale and (negated) minimum that best fit a 32-value sub-block x as scale * l + min with integer l in 0..top, by
// weighted least squares over the trial steps (top + lowest + step * k) / (high - min), k = 0..steps; l into `codes`.
// As in ggml, each better fit's minimum becomes the origin of the next trials' codes: on a Gaussian matrix with
// outliers the sub-blocks then come out 0.8% closer to the dense values (RMS) than with the range's minimum kept,
// once their scales are rounded onto the group's grid. Sums run in 8 lanes, so the compiler vectorizes them.
inline float fit_scale_min(const float* x, const float* w, int top, float lowest, float step, int steps,
                           uint8_t* codes, float* negated_min) {
  constexpr int n = 32, lanes = 8;
  float min = x[0], high = x[0];
  for (int i = 0; i < n; ++i) min = std::min(min, x[i]), high = std::max(high, x[i]);
  min = std::min(min, 0.0f);
  if (high == min) {
    std::fill(codes, codes + n, 0);
    *negated_min = -min;
    return 0.0f;
  }
  float sum_w = 0, sum_x = 0;
  for (int i = 0; i < n; ++i) sum_w += w[i], sum_x += w[i] * x[i];
  float trial[n], best_codes[n];
  // the codes at `inverse` from the origin `min` into `trial`; their weighted sums of l, l^2 and x l
  const auto sums = [&](float inverse, float& sum_l, float& sum_l2, float& sum_xl) {
    float l1[lanes] = {}, l2[lanes] = {}, xl[lanes] = {};
    for (int i = 0; i < n; i += lanes)
      for (int j = 0; j < lanes; ++j) {
        const float l = std::min(std::max(std::nearbyint(inverse * (x[i + j] - min)), 0.0f), static_cast<float>(top));
        const float wl = w[i + j] * l;
        trial[i + j] = l;
        l1[j] += wl, l2[j] += wl * l, xl[j] += wl * x[i + j];
      }
    sum_l = sum_l2 = sum_xl = 0;
    for (int j = 0; j < lanes; ++j) sum_l += l1[j], sum_l2 += l2[j], sum_xl += xl[j];
  };
  const auto error = [&](float scale, float origin) {  // sum of w (scale l + origin - x)^2 over `trial`
    float e[lanes] = {};
    for (int i = 0; i < n; i += lanes)
      for (int j = 0; j < lanes; ++j) {
        const float diff = scale * trial[i + j] + origin - x[i + j];
        e[j] += w[i + j] * diff * diff;
      }
    float total = 0;
    for (int j = 0; j < lanes; ++j) total += e[j];
    return total;
  };
  float sum_l, sum_l2, sum_xl;
  float inverse = top / (high - min), scale = 1 / inverse;
  sums(inverse, sum_l, sum_l2, sum_xl);
  float best = error(scale, min);
  std::copy(trial, trial + n, best_codes);
  for (int k = 0; k <= steps; ++k) {
    sums((lowest + step * k + top) / (high - min), sum_l, sum_l2, sum_xl);
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det <= 0) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det, this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if (this_min > 0) this_min = 0, this_scale = sum_xl / sum_l2;
    const float this_error = error(this_scale, this_min);
    if (this_error < best) {
      std::copy(trial, trial + n, best_codes);
      best = this_error, scale = this_scale, min = this_min;
    }
  }
  for (int i = 0; i < n; ++i) codes[i] = static_cast<uint8_t>(best_codes[i]);
  *negated_min = -min;
  return scale;
}

// The signed scale that best fits x[0..16) as scale * l with integer l in -32..31, weights x^2, over trial steps
// -(32 + k / 10) / the largest value, k = -9..9.
inline float fit_signed_scale(const float* x) {
  constexpr int n = 16, top = 32;
  float amax = 0, max = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), max = x[i];
  if (amax < 1e-15f) return 0.0f;
  const auto sums = [&](float inverse, float& sum_lx, float& sum_l2) {
    sum_lx = sum_l2 = 0;
    for (int i = 0; i < n; ++i) {
      const float l = static_cast<float>(std::clamp(nearest(inverse * x[i]), -top, top - 1)), w = x[i] * x[i];
      sum_lx += w * x[i] * l;
      sum_l2 += w * l * l;
    }
  };
  float sum_lx, sum_l2;
  sums(-top / max, sum_lx, sum_l2);
  float scale = sum_l2 > 0 ? sum_lx / sum_l2 : 0.0f, best = scale * sum_lx;
  for (int k = -9; k <= 9; ++k) {
    if (k == 0) continue;
    sums(-(top + 0.1f * k) / max, sum_lx, sum_l2);
    if (sum_l2 > 0 && sum_lx * sum_lx > best * sum_l2) scale = sum_lx / sum_l2, best = scale * sum_lx;
  }
  return scale;
}

// Q4_K (BITS 4: 144 bytes) or Q5_K (5: 176 bytes) of 256 values: d, dmin, 12 bytes of 6-bit scales and mins, (Q5_K:
// 32 bytes of fifth bits), 128 bytes of nibbles.
template <int BITS>
void k_block(const float* x, uint8_t* out) {
  constexpr int top = (1 << BITS) - 1;
  float scales[8], mins[8], w[32];
  uint8_t codes[256];
  for (int j = 0; j < 8; ++j) {
    const float* sub = x + 32 * j;
    float sum_x2 = 0;
    for (int i = 0; i < 32; ++i) sum_x2 += sub[i] * sub[i];
    const float rms = std::sqrt(sum_x2 / 32);
    for (int i = 0; i < 32; ++i) w[i] = rms + std::fabs(sub[i]);
    scales[j] = BITS == 4 ? fit_scale_min(sub, w, top, -1.0f, 0.1f, 20, codes + 32 * j, mins + j)
                          : fit_scale_min(sub, w, top, -0.5f, 0.1f, 15, codes + 32 * j, mins + j);
  }
  const float max_scale = *std::max_element(scales, scales + 8), max_min = *std::max_element(mins, mins + 8);
  const float to_scale = max_scale > 0 ? 63 / max_scale : 0.0f, to_min = max_min > 0 ? 63 / max_min : 0.0f;
  uint8_t ls[8], lm[8];
  for (int j = 0; j < 8; ++j) {
    ls[j] = static_cast<uint8_t>(std::min(63, nearest(to_scale * scales[j])));
    lm[j] = static_cast<uint8_t>(std::min(63, nearest(to_min * mins[j])));
  }
  const uint16_t d = half_bits(max_scale / 63), dmin = half_bits(max_min / 63);
  std::memcpy(out, &d, 2);
  std::memcpy(out + 2, &dmin, 2);
  uint8_t* packed = out + 4;  // sub-blocks 4-7 keep their top 2 bits in bytes 0-7 (ggml's get_scale_min_k4)
  for (int j = 0; j < 4; ++j) {
    packed[j] = static_cast<uint8_t>(ls[j] | (ls[j + 4] >> 4) << 6);
    packed[j + 4] = static_cast<uint8_t>(lm[j] | (lm[j + 4] >> 4) << 6);
    packed[j + 8] = static_cast<uint8_t>((ls[j + 4] & 15) | (lm[j + 4] & 15) << 4);
  }
  const float d_value = static_cast<float>(c10::Half(d, c10::Half::from_bits()));
  const float dmin_value = static_cast<float>(c10::Half(dmin, c10::Half::from_bits()));
  for (int j = 0; j < 8; ++j) {
    const float step = d_value * ls[j], offset = dmin_value * lm[j];
    if (step == 0) continue;  // the codes of the search stand
    for (int i = 0; i < 32; ++i)
      codes[32 * j + i] = static_cast<uint8_t>(std::clamp(nearest((x[32 * j + i] + offset) / step), 0, top));
  }
  uint8_t* nibbles = out + 16;
  if (BITS == 5) {  // bit j of byte l: the fifth bit of value 32 j + l
    uint8_t* high = out + 16;
    std::memset(high, 0, 32);
    for (int i = 0; i < 256; ++i) high[i % 32] |= static_cast<uint8_t>((codes[i] >> 4) << (i / 32));
    nibbles = out + 48;
  }
  for (int c = 0; c < 4; ++c)  // per 64 values: sub-block 2c's in the low nibbles, 2c + 1's in the high
    for (int l = 0; l < 32; ++l)
      nibbles[32 * c + l] = static_cast<uint8_t>((codes[64 * c + l] & 15) | (codes[64 * c + 32 + l] & 15) << 4);
}

// Q6_K of 256 values (210 bytes): 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales, d.
inline void q6_k_block(const float* x, uint8_t* out) {
  float scales[16];
  float max_scale = 0, largest = 0;
  for (int j = 0; j < 16; ++j) {
    scales[j] = fit_signed_scale(x + 16 * j);
    if (std::fabs(scales[j]) > largest) largest = std::fabs(scales[j]), max_scale = scales[j];
  }
  std::memset(out, 0, 210);
  if (largest < 1e-15f) return;
  const float inverse = -128 / max_scale;
  const uint16_t d = half_bits(1 / inverse);
  std::memcpy(out + 208, &d, 2);
  const float d_value = static_cast<float>(c10::Half(d, c10::Half::from_bits()));
  int8_t* sc = reinterpret_cast<int8_t*>(out + 192);
  uint8_t codes[256] = {};
  for (int j = 0; j < 16; ++j) {
    sc[j] = static_cast<int8_t>(std::min(127, nearest(inverse * scales[j])));
    const float step = d_value * sc[j];
    if (step == 0) {
      std::fill(codes + 16 * j, codes + 16 * j + 16, 32);
      continue;
    }
    for (int i = 0; i < 16; ++i) codes[16 * j + i] = static_cast<uint8_t>(std::clamp(nearest(x[16 * j + i] / step), -32, 31) + 32);
  }
  for (int h = 0; h < 2; ++h) {  // each 128 values: quarters q at l, l + 32, l + 64, l + 96
    uint8_t *low = out + 64 * h, *high = out + 128 + 32 * h;
    const uint8_t* q = codes + 128 * h;
    for (int l = 0; l < 32; ++l) {
      low[l] = static_cast<uint8_t>((q[l] & 15) | (q[l + 64] & 15) << 4);
      low[l + 32] = static_cast<uint8_t>((q[l + 32] & 15) | (q[l + 96] & 15) << 4);
      high[l] = static_cast<uint8_t>(q[l] >> 4 | (q[l + 32] >> 4) << 2 | (q[l + 64] >> 4) << 4 | (q[l + 96] >> 4) << 6);
    }
  }
}

// Q8_0 of 32 values (34 bytes): d, 32 int8 codes.
inline void q8_0_block(const float* x, uint8_t* out) {
  float amax = 0;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127, inverse = d ? 1 / d : 0.0f;
  const uint16_t bits = half_bits(d);
  std::memcpy(out, &bits, 2);
  for (int i = 0; i < 32; ++i) out[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(nearest(x[i] * inverse)));
}

// Q5_0 of 32 values (22 bytes): d, 32 fifth bits, 16 bytes of nibbles (values l and l + 16).
inline void q5_0_block(const float* x, uint8_t* out) {
  float amax = 0, max = 0;
  for (int i = 0; i < 32; ++i)
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), max = x[i];
  const float d = max / -16, inverse = d ? 1 / d : 0.0f;
  const uint16_t bits = half_bits(d);
  std::memcpy(out, &bits, 2);
  uint32_t fifth = 0;
  for (int l = 0; l < 16; ++l) {
    const int a = std::min(31, static_cast<int>(x[l] * inverse + 16.5f));
    const int b = std::min(31, static_cast<int>(x[l + 16] * inverse + 16.5f));
    out[6 + l] = static_cast<uint8_t>((a & 15) | (b & 15) << 4);
    fifth |= static_cast<uint32_t>(a >> 4) << l | static_cast<uint32_t>(b >> 4) << (l + 16);
  }
  std::memcpy(out + 2, &fifth, 4);
}

// weight [rows, cols] (any float dtype) -> blocks of `type` [rows, bytes per row] uint8, rows in parallel.
inline at::Tensor rows(const at::Tensor& weight, int64_t type) {
  TORCH_CHECK(weight.dim() == 2, "weight must be [rows, cols]");
  const Layout l = layout(type);
  const int64_t rows = weight.size(0), cols = weight.size(1), blocks = cols / l.values;
  TORCH_CHECK(cols % l.values == 0, "a row of ", cols, " values is no whole number of ", l.values, "-value blocks");
  void (*block)(const float*, uint8_t*) = nullptr;
  switch (type) {
    case Q4_K: block = k_block<4>; break;
    case Q5_K: block = k_block<5>; break;
    case Q6_K: block = q6_k_block; break;
    case Q8_0: block = q8_0_block; break;
    case Q5_0: block = q5_0_block; break;
    default: TORCH_CHECK(false, "no quantizer for GGUF block type ", type);
  }
  at::Tensor out = at::empty({rows, blocks * l.bytes}, at::TensorOptions().dtype(at::kByte));
  uint8_t* data = out.data_ptr<uint8_t>();
  constexpr int64_t chunk = 64;  // rows made float32 at a time: no float copy of a whole large matrix
  at::parallel_for(0, rows, chunk, [&](int64_t begin, int64_t end) {
    for (int64_t first = begin; first < end; first += chunk) {
      const int64_t last = std::min(end, first + chunk);
      const at::Tensor values = weight.slice(0, first, last).to(at::kFloat).contiguous();
      const float* x = values.data_ptr<float>();
      uint8_t* row_out = data + first * blocks * l.bytes;
      for (int64_t b = 0; b < (last - first) * blocks; ++b) block(x + b * l.values, row_out + b * l.bytes);
    }
  });
  return out;
}

}  // namespace quantize
}  // namespace gguf
