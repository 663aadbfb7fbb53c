// Dot products summed in 16 lanes, paired down to one score per key in the pairs and order of adjacent lanes
// that the portable loops take: on AVX-512, sixteen keys' sums as they come (`LanePairs`); on AVX2, eight
// vectors of eight lanes at a time (`pairwise_sums8`).

#pragma once

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#if defined(__AVX2__)
// [t(v0), ..., t(v7)], t(v) = ((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7)): eight vectors' sums of adjacent
// lanes paired down.
inline __m256 pairwise_sums8(const __m256* v) {
  const __m256 low = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const __m256 high = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(low, high, 0x20), _mm256_permute2f128_ps(low, high, 0x31));
}
#endif

#if defined(__AVX512F__)
// Sixteen keys' sums paired down as they come: keys 2i and 2i + 1 as soon as both are summed, then pairs of
// those. After the sixteenth key, lane k of the last pairing is key k's score. The first two levels add even to
// odd lanes of their two operands within each 128-bit block (block j then holds four keys' sums of lanes
// 4j .. 4j + 3), the last two even to odd blocks, which leaves the keys in order: shuffles that stay within a
// block or move whole blocks, cheaper than permuting lanes across the register.

template <int Q>
struct LanePairs {
  __m512 pending[Q][4];  // pending[j][level]: query j's sum waiting for its pair at that level

  // Key i's sums (i = 0 .. 15, in order) for Q queries; the sixteenth stores each query's 16 scores.
  inline void add(int i, __m512 (&sum)[Q], float* const (&scores)[Q]) {
    for (int level = 0, k = i; level < 4; ++level, k >>= 1) {
      if ((k & 1) == 0) {
        for (int j = 0; j < Q; ++j) pending[j][level] = sum[j];
        return;
      }
      for (int j = 0; j < Q; ++j) sum[j] = pair(level, pending[j][level], sum[j]);
    }
    for (int j = 0; j < Q; ++j) _mm512_storeu_ps(scores[j], sum[j]);
  }

  static inline __m512 pair(int level, __m512 a, __m512 b) {
    if (level < 2) return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xdd));
  }
};
#endif
