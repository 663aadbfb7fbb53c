// Row arithmetic the decoder's layers and its attention share: sums kept in 16 lanes, the exponentials (scalar,
// and the same bits 8 or 16 lanes at a time), eight values loaded and stored at a time, RMSNorm.
#pragma once

#include <ATen/core/Tensor.h>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace cpu_decoder {

constexpr int LANES = 16;  // partial sums kept side by side; a sum's order depends on the indices alone

template <typename T>
inline float load(T value) { return static_cast<float>(value); }

template <typename T>
inline T store(float value) { return static_cast<T>(value); }

inline float lane_total(float* lanes) {
  for (int width = LANES / 2; width > 0; width /= 2) {
    for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  }
  return lanes[0];
}

// exp(x) for x in [-87, 88], as x = n ln 2 + r: returns exp(r) - 1 and sets two_n = 2^n. Cephes' range reduction
// and polynomial, each step an explicit fma or a single rounding, so that the vector forms below (exp8_reduced,
// exp16_reduced) give the same bits lane by lane.
inline float exp_reduced(float x, float& two_n) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float n = std::nearbyint(x * 1.44269504088896341f);
  const float r = std::fma(n, 2.12194440e-4f, std::fma(-n, 0.693359375f, x));
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  std::memcpy(&two_n, &bits, sizeof(two_n));
  return std::fma(p * r, r, r);
}

inline float exp_approx(float x) {
  float two_n;
  const float q = exp_reduced(x, two_n);
  return (q + 1.0f) * two_n;
}

// exp(x) - 1, exact where exp(x) is near 1 (n = 0: the polynomial's own value)
inline float expm1_approx(float x) {
  float two_n;
  const float q = exp_reduced(x, two_n);
  return std::fma(q, two_n, two_n - 1.0f);
}

#if defined(__AVX2__) && defined(__FMA__)
inline __m256 exp8_reduced(__m256 x, __m256& two_n) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x));
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  two_n = _mm256_castsi256_ps(bits);
  return _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r);
}

inline __m256 exp8(__m256 x) {
  __m256 two_n;
  const __m256 q = exp8_reduced(x, two_n);
  return _mm256_mul_ps(_mm256_add_ps(q, _mm256_set1_ps(1.0f)), two_n);
}

inline __m256 expm1_8(__m256 x) {
  __m256 two_n;
  const __m256 q = exp8_reduced(x, two_n);
  return _mm256_fmadd_ps(q, two_n, _mm256_sub_ps(two_n, _mm256_set1_ps(1.0f)));
}

// Whether eight values of T load and store in one vector (`load8`, `store8`): fp32 and bf16; fp16 goes one by one.
template <typename T>
constexpr bool kVector8 = std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>;

// Eight values as fp32, as `load` reads each.
template <typename T>
inline __m256 load8(const T* p) {
  if constexpr (std::is_same_v<T, float>) return _mm256_loadu_ps(p);
  const __m256i halves = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(halves, 16));
}

// Eight fp32 stored as `store` stores each: bf16 rounded to nearest even, a NaN as c10's 0x7fc0.
template <typename T>
inline void store8(T* p, __m256 x) {
  if constexpr (std::is_same_v<T, float>) {
    _mm256_storeu_ps(p, x);
  } else {
    const __m256i bits = _mm256_castps_si256(x);
    const __m256i bias = _mm256_add_epi32(_mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1)),
                                          _mm256_set1_epi32(0x7fff));  // 0x7fff, or 0x8000 where the bf16 is odd
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    const __m256i rounded = _mm256_blendv_epi8(_mm256_srli_epi32(_mm256_add_epi32(bits, bias), 16),
                                               _mm256_set1_epi32(0x7fc0), nan);
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(rounded), _mm256_extracti128_si256(rounded, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
}
#endif

#if defined(__AVX512F__)
inline __m512 exp16_reduced(__m512 x, __m512& two_n) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x));
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
  two_n = _mm512_castsi512_ps(bits);
  return _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r);
}

inline __m512 exp16(__m512 x) {
  __m512 two_n;
  const __m512 q = exp16_reduced(x, two_n);
  return _mm512_mul_ps(_mm512_add_ps(q, _mm512_set1_ps(1.0f)), two_n);
}

inline __m512 expm1_16(__m512 x) {
  __m512 two_n;
  const __m512 q = exp16_reduced(x, two_n);
  return _mm512_fmadd_ps(q, two_n, _mm512_sub_ps(two_n, _mm512_set1_ps(1.0f)));
}
#endif

// out[r] = round(round(x[r] / rms(x[r])) * weight), Llama's RMSNorm with its two roundings; with an fp32 weight
// round(x[r] / rms(x[r]) * weight), Gemma's with one.
template <typename T, typename W>
void rms_norm(const T* x, const W* weight, T* out, int64_t rows, int64_t width, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * width;
    float lanes[LANES] = {};
    int64_t c = 0;
    for (; c + LANES <= width; c += LANES) {
      for (int l = 0; l < LANES; ++l) lanes[l] += load(row[c + l]) * load(row[c + l]);
    }
    for (int l = 0; c < width; ++c, ++l) lanes[l] += load(row[c]) * load(row[c]);
    const float inverse = 1.0f / std::sqrt(lane_total(lanes) / static_cast<float>(width) + eps);
    for (c = 0; c < width; ++c) {
      const float normed = load(row[c]) * inverse;
      if constexpr (std::is_same_v<W, float>) {
        out[r * width + c] = store<T>(normed * weight[c]);
      } else {
        out[r * width + c] = store<T>(load(store<T>(normed)) * load(weight[c]));
      }
    }
  }
}

// `rms_norm` by a weight tensor of either dtype.
template <typename T>
void rms_norm(const T* x, const at::Tensor& weight, T* out, int64_t rows, int64_t width, float eps) {
  if (weight.scalar_type() == at::kFloat) return rms_norm<T, float>(x, weight.data_ptr<float>(), out, rows, width, eps);
  rms_norm<T, T>(x, weight.data_ptr<T>(), out, rows, width, eps);
}

}  // namespace cpu_decoder
