// Activation rows quantized to int8 per group, as llama.cpp quantizes them for these block types: every kernel's
// inner sums are then integers, exact in any order. fp32 activations go in two terms (`matmul`, `Quantized`): the
// rows, then what their codes miss, each quantized so, the two products summed: 16 bits of each value, where one
// int8 term flips a small model's near-ties (the embedded model's mean KL against fp32: 0.0030 in one, 0.00007 in two).
#pragma once

#ifdef __AVX2__
#include <immintrin.h>
#endif

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <new>
#include <type_traits>
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

// The largest |x[i]| of n values (n a multiple of 16), exact in any order; a NaN is passed over, as std::max does.
inline float max_magnitude(const float* x, int64_t n) {
  float lanes[16] = {};
#ifdef __AVX2__
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 low = _mm256_setzero_ps(), high = low;
  for (int64_t i = 0; i < n; i += 16) {  // max(a, b) is b where either is NaN: the running maximum goes second
    low = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i), magnitude), low);
    high = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i + 8), magnitude), high);
  }
  _mm256_storeu_ps(lanes, low), _mm256_storeu_ps(lanes + 8, high);
#else
  for (int64_t i = 0; i < n; i += 16)
    for (int l = 0; l < 16; ++l) lanes[l] = std::max(lanes[l], std::fabs(x[i + l]));
#endif
  return *std::max_element(lanes, lanes + 16);
}

// codes[i] = x[i] * inverse rounded to the nearest integer, ties to even (n a multiple of 32, |x[i] * inverse| <= 127).
inline void round_codes(const float* x, float inverse, int8_t* codes, int64_t n) {
  int64_t i = 0;
#ifdef __AVX2__
  const __m256 f = _mm256_set1_ps(inverse);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // the packs' 4-value runs back in order
  for (; i + 32 <= n; i += 32) {
    __m256i v[4];
    for (int k = 0; k < 4; ++k) v[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * k), f));
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i), _mm256_permutevar8x32_epi32(bytes, order));
  }
#endif
  for (; i < n; ++i) codes[i] = static_cast<int8_t>(std::nearbyint(x[i] * inverse));
}

// sums[j] = the sum of codes[16 j, 16 j + 16) for j < count.
inline void sums_of_16(const int8_t* codes, int16_t* sums, int64_t count) {
  int64_t j = 0;
#ifdef __AVX2__
  for (; j + 2 <= count; j += 2) {  // each code biased to unsigned (+128), summed eight at a time, the bias taken off
    const __m256i biased = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 16 * j)),
                                            _mm256_set1_epi8(-128));
    alignas(32) int64_t eights[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(eights), _mm256_sad_epu8(biased, _mm256_setzero_si256()));
    sums[j] = static_cast<int16_t>(eights[0] + eights[1] - 16 * 128);
    sums[j + 1] = static_cast<int16_t>(eights[2] + eights[3] - 16 * 128);
  }
#endif
  for (; j < count; ++j) {
    int sum = 0;
    for (int i = 0; i < 16; ++i) sum += codes[16 * j + i];
    sums[j] = static_cast<int16_t>(sum);
  }
}

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

  // x: fp32 rows, or bf16 ones widened a row at a time as they are read (exact: a shift a value), so that no fp32
  // copy of a pass's activations is written (a 512-row forward of the 1.5B: 784 MB). Rows split over the threads
  // from 32K values on (a prefill's 64-row pass, quantized on one thread while the other waited: ~5% of the 1.5B's
  // prefill); a decode step's row stays on its thread.
  template <typename In>
  Quantized(const In* x, int64_t rows_, int64_t cols_, int64_t group_, int64_t terms = 1, int64_t pad = 1)
      : rows(terms * rows_), cols(cols_), group(group_), q((rows + pad - 1) / pad * pad * cols_),
        scale(rows * cols_ / group_), sums(rows * cols_ / 16), sums32(rows * cols_ / 32) {
    static_assert(std::is_same_v<In, float> || std::is_same_v<In, c10::BFloat16>, "fp32 or bf16 rows");
    at::parallel_for(0, rows_, std::max<int64_t>(1, 32768 / cols), [&](int64_t begin, int64_t end) {
      std::vector<float> widened(std::is_same_v<In, float> ? 0 : cols);
      for (int64_t r = begin; r < end; ++r) {
        const In* row = x + r * cols;
        if constexpr (std::is_same_v<In, float>) {
          quantize_row(row, r, rows_, terms);
        } else {
          const auto* halves = reinterpret_cast<const uint16_t*>(row);
          auto* bits = reinterpret_cast<uint32_t*>(widened.data());
          for (int64_t i = 0; i < cols; ++i) bits[i] = static_cast<uint32_t>(halves[i]) << 16;
          quantize_row(widened.data(), r, rows_, terms);
        }
      }
    });
  }

 private:
  // Row r of the first term (and with two terms its rest, row `first_rows + r`): codes, scales and sums.
  void quantize_row(const float* x, int64_t r, int64_t first_rows, int64_t terms) {
    const int64_t n = group, per_row = cols / n;
    float rest[256];  // a group's rests: groups hold 32 or 256 values
    for (int64_t g = r * per_row; g < (r + 1) * per_row; ++g) {
      const float* in = x + (g - r * per_row) * n;
      quantize_group(in, g);
      if (terms == 1) continue;
      const float d = scale[g];
      const int8_t* codes = q.data() + g * n;
      for (int64_t i = 0; i < n; ++i) rest[i] = std::fma(-d, static_cast<float>(codes[i]), in[i]);
      quantize_group(rest, first_rows * per_row + g);
    }
    for (int64_t term = 0; term < terms; ++term) {
      const int64_t row = term * first_rows + r;
      sums_of_16(q.data() + row * cols, sums.data() + row * cols / 16, cols / 16);
      for (int64_t j = row * cols / 32; j < (row + 1) * cols / 32; ++j)
        sums32[j] = static_cast<int16_t>(sums[2 * j] + sums[2 * j + 1]);
    }
  }

  // Group g's `group` values: its scale and codes.
  void quantize_group(const float* in, int64_t g) {
    const float amax = max_magnitude(in, group);
    const float d = amax / 127.0f, inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
    scale[g] = d;
    round_codes(in, inverse, q.data() + g * group, group);
  }
};

}  // namespace gguf
