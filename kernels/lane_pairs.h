// Sixteen keys' dot products, each summed in 16 lanes, paired down to one score per key as the sums come: keys
// 2i and 2i + 1 as soon as both are summed, then pairs of those (the pairs and order of adjacent lanes that the
// portable loops take). After the sixteenth key, lane k of the last pairing is key k's score. AVX-512 only.

#pragma once

#if defined(__AVX512F__)
#include <immintrin.h>

template <int Q>
struct LanePairs {
  __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  __m512 pending[Q][4];  // pending[j][level]: query j's sum waiting for its pair at that level

  // Key i's sums (i = 0 .. 15, in order) for Q queries; the sixteenth stores each query's 16 scores.
  inline void add(int i, __m512 (&sum)[Q], float* const (&scores)[Q]) {
    for (int level = 0, k = i; level < 4; ++level, k >>= 1) {
      if ((k & 1) == 0) {
        for (int j = 0; j < Q; ++j) pending[j][level] = sum[j];
        return;
      }
      for (int j = 0; j < Q; ++j) sum[j] = pair(pending[j][level], sum[j]);
    }
    for (int j = 0; j < Q; ++j) _mm512_storeu_ps(scores[j], sum[j]);
  }

  inline __m512 pair(__m512 a, __m512 b) const {
    return _mm512_add_ps(_mm512_permutex2var_ps(a, even, b), _mm512_permutex2var_ps(a, odd, b));
  }
};
#endif
