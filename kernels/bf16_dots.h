// Attention's two products on a bf16 cache in bf16 dot-product arithmetic (AVX-512 BF16's vdpbf16ps): scores
// as query . key with the query rounded to bf16, and value sums with the softmax weights rounded to bf16.
//
// One vdpbf16ps lane adds two products of bf16 pairs to an fp32 sum: the odd element's product first, then the
// even one's, each an exact product (8-bit by 8-bit mantissas) rounded once into the sum, with bf16 denormal
// inputs read as zero and denormal results flushed to zero. That is 32 multiplies an instruction against 16 for
// an fp32 fma, and the keys and values are read as they lie in the cache, not converted first. Builds without
// the instruction run the same arithmetic a lane at a time (`dot_step`), so every build gives the same bits.
//
// Layouts: a query and a key are DIM bf16; lane l of a key's sum holds dims 32c + 2l (even) and 32c + 2l + 1
// (odd) for c = 0, 1, ...; the 16 lanes are then paired down (adjacent lanes, as lane_total pairs them). Value
// rows go in pairs (rows 2m and 2m + 1 of a row sequence) interleaved into DIM dwords, dim d's dword holding
// row 2m's bf16 in its low half and row 2m + 1's in its high half; a weight pair is one dword laid out alike.

#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>
#define BF16_DOTS_NATIVE 1
#endif

#include "lane_pairs.h"

namespace bf16_dots {

constexpr int LANES = 16;

// Round to nearest even, as vcvtneps2bf16 does (NaN stays NaN).
inline uint16_t round_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

inline void round_bf16(const float* x, uint16_t* out, int64_t count) {
  int64_t i = 0;
#ifdef BF16_DOTS_NATIVE
  for (; i + LANES <= count; i += LANES) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i)));
  }
#endif
  for (; i < count; ++i) out[i] = round_bf16(x[i]);
}

// The bf16 as fp32, denormals read as zero.
inline float widen(uint16_t h) {
  if ((h & 0x7f80u) == 0) h &= 0x8000u;
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

// sum + a * b rounded once, a denormal result flushed to zero: one of vdpbf16ps' two steps.
inline float dot_step(float sum, uint16_t a, uint16_t b) {
  const float r = std::fma(widen(a), widen(b), sum);
  return std::fpclassify(r) == FP_SUBNORMAL ? std::copysign(0.0f, r) : r;
}

// One vdpbf16ps lane: sum + the odd pair's product, then + the even pair's.
inline float dot_pair(float sum, uint32_t a, uint32_t b) {
  sum = dot_step(sum, static_cast<uint16_t>(a >> 16), static_cast<uint16_t>(b >> 16));
  return dot_step(sum, static_cast<uint16_t>(a), static_cast<uint16_t>(b));
}

// scores[j][i] = q[j] . tile[i] for a tile of 16 keys [16][DIM] bf16, for each of Q queries (bf16 [DIM]).
template <int DIM, int Q>
inline void dots16(const uint16_t* const (&q)[Q], const uint16_t* tile, float* const (&scores)[Q]) {
  static_assert(DIM % 32 == 0, "a key is whole 32-value vectors");
#ifdef BF16_DOTS_NATIVE
  constexpr int kVectors = DIM / 32;
  LanePairs<Q> pairs;
  __m512bh query[Q][kVectors];
  for (int j = 0; j < Q; ++j)
    for (int c = 0; c < kVectors; ++c) query[j][c] = (__m512bh)_mm512_loadu_si512(q[j] + 32 * c);
#pragma GCC unroll 16
  for (int i = 0; i < LANES; ++i) {
    __m512 sum[Q];
    for (int j = 0; j < Q; ++j) sum[j] = _mm512_setzero_ps();
    for (int c = 0; c < kVectors; ++c) {
      const __m512bh key = (__m512bh)_mm512_loadu_si512(tile + i * DIM + 32 * c);
      for (int j = 0; j < Q; ++j) sum[j] = _mm512_dpbf16_ps(sum[j], query[j][c], key);
    }
    pairs.add(i, sum, scores);
  }
#else
  for (int j = 0; j < Q; ++j) {
    for (int i = 0; i < LANES; ++i) {
      float lanes[LANES] = {};
      uint32_t qs[DIM / 2], ks[DIM / 2];
      std::memcpy(qs, q[j], sizeof(qs));
      std::memcpy(ks, tile + i * DIM, sizeof(ks));
      for (int c = 0; c < DIM / 2; c += LANES)
        for (int l = 0; l < LANES; ++l) lanes[l] = dot_pair(lanes[l], qs[c + l], ks[c + l]);
      for (int n = LANES; n > 1; n /= 2)
        for (int k = 0; k < n / 2; ++k) lanes[k] = lanes[2 * k] + lanes[2 * k + 1];
      scores[j][i] = lanes[0];
    }
  }
#endif
}

// out[d] = (a[d], b[d]) as one dword, a in the low half: two value rows of DIM bf16 as DIM pairs.
template <int DIM>
inline void interleave(const uint16_t* a, const uint16_t* b, uint32_t* out) {
  int d = 0;
#ifdef BF16_DOTS_NATIVE
  int16_t order[32];  // a's value i, then b's (index 32 + i), for i = 0 .. 15
  for (int i = 0; i < 16; ++i) order[2 * i] = static_cast<int16_t>(i), order[2 * i + 1] = static_cast<int16_t>(32 + i);
  const __m512i low = _mm512_loadu_si512(order), high = _mm512_add_epi16(low, _mm512_set1_epi16(16));
  for (; d + 32 <= DIM; d += 32) {
    const __m512i x = _mm512_loadu_si512(a + d), y = _mm512_loadu_si512(b + d);
    _mm512_storeu_si512(out + d, _mm512_permutex2var_epi16(x, low, y));
    _mm512_storeu_si512(out + d + 16, _mm512_permutex2var_epi16(x, high, y));
  }
#endif
  for (; d < DIM; ++d) out[d] = static_cast<uint32_t>(a[d]) | (static_cast<uint32_t>(b[d]) << 16);
}

// acc[q][d] += the dot pair of weights[q][m] and pairs[m][d], for m = 0 .. count - 1 in order and each of Q
// queries: AVX-512 keeps 128 columns of every query's `acc` in registers while the pairs stream by.
template <int DIM, int Q>
inline void add_pairs(const uint32_t* const (&weights)[Q], const uint32_t* pairs, int64_t count,
                      float* const (&acc)[Q]) {
#ifdef BF16_DOTS_NATIVE
  constexpr int kWidth = DIM < 128 ? DIM : 128, kVectors = kWidth / 16;
  for (int h = 0; h < DIM; h += kWidth) {
    __m512 sums[Q][kVectors];
    for (int q = 0; q < Q; ++q)
      for (int j = 0; j < kVectors; ++j) sums[q][j] = _mm512_loadu_ps(acc[q] + h + 16 * j);
    for (int64_t m = 0; m < count; ++m) {
      const uint32_t* pair = pairs + m * DIM + h;
      __m512bh weight[Q];
      for (int q = 0; q < Q; ++q) weight[q] = (__m512bh)_mm512_set1_epi32(static_cast<int>(weights[q][m]));
      for (int j = 0; j < kVectors; ++j) {
        const __m512bh v = (__m512bh)_mm512_loadu_si512(pair + 16 * j);
        for (int q = 0; q < Q; ++q) sums[q][j] = _mm512_dpbf16_ps(sums[q][j], weight[q], v);
      }
    }
    for (int q = 0; q < Q; ++q)
      for (int j = 0; j < kVectors; ++j) _mm512_storeu_ps(acc[q] + h + 16 * j, sums[q][j]);
  }
#else
  for (int q = 0; q < Q; ++q)
    for (int64_t m = 0; m < count; ++m)
      for (int d = 0; d < DIM; ++d) acc[q][d] = dot_pair(acc[q][d], weights[q][m], pairs[m * DIM + d]);
#endif
}

}  // namespace bf16_dots
