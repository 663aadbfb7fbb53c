// Attention's two products on an int8 cache (AVX-512 VNNI's vpdpbusd for the scores).
//
// A key or value is quantized when it is written, symmetrically: x = s * c with c an integer in [-127, 127] and
// s = max|x| / 127, a key over each block of 32 dims (BLOCK) and a value over its whole row, so a row's codes
// and scales depend on that row alone and never change. A query is quantized like a key when it is scored. A
// score is then a sum over the blocks of an integer dot product (exact, in any order) times the two blocks'
// scales; a value row's codes are exact in bf16, and its scale goes into its softmax weight, so value sums run
// in bf16 dot-product arithmetic as on a bf16 cache (bf16_dots.h).
//
// Key layout: tiles of 16 rows (slots 16t .. 16t + 15), a tile [DIM / 4][16][4] bytes: the four codes of dims
// 4c .. 4c + 3 of the 16 keys side by side, each code stored plus 128 (an unsigned byte). One vpdpbusd adds a
// query's four dims times those of 16 keys to 16 int32 lanes, lane i key i's, so a tile's scores need no lanes
// paired down. The bias is taken back by starting each block's sum at -128 times the sum of the query's codes
// there. Scales lie in tiles too: [DIM / 32 + 1][16] fp32 per tile, the keys' block scales, then the values'.

#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#define INT8_DOTS_NATIVE 1
#endif

namespace int8_dots {

constexpr int LANES = 16;  // keys in a tile
constexpr int BLOCK = 32;  // a key's (and a query's) dims under one scale

// Row codes c = round(x * 127 / max|x|) into `codes`; returns the scale max|x| / 127 (0 for a zero row).
inline float quantize(const float* x, int8_t* codes, int dim) {
  float top = 0.0f;
  for (int d = 0; d < dim; ++d) top = std::max(top, std::fabs(x[d]));
  const float inverse = top > 0.0f ? 127.0f / top : 0.0f;
  for (int d = 0; d < dim; ++d) codes[d] = static_cast<int8_t>(std::nearbyint(x[d] * inverse));
  return top / 127.0f;
}

// Byte offset of key `slot`'s dims 4c .. 4c + 3 in its head's tiled keys.
inline int64_t key_offset(int64_t slot, int64_t c, int dim) {
  return (slot / LANES) * LANES * dim + (c * LANES + slot % LANES) * 4;
}

// Write a key's codes into its tile, biased to unsigned.
inline void store_key(const int8_t* codes, uint8_t* head_keys, int64_t slot, int dim) {
  for (int c = 0; c < dim / 4; ++c) {
    uint8_t* out = head_keys + key_offset(slot, c, dim);
    for (int b = 0; b < 4; ++b) out[b] = static_cast<uint8_t>(codes[4 * c + b] + 128);
  }
}

// Copy key `slot` into lane `lane` of a tile (a tree row's ancestors, gathered from wherever they lie).
inline void gather_key(const uint8_t* head_keys, int64_t slot, uint8_t* tile, int lane, int dim) {
  for (int c = 0; c < dim / 4; ++c) {
    std::memcpy(tile + (c * LANES + lane) * 4, head_keys + key_offset(slot, c, dim), 4);
  }
}

// scores[j][i] = query j . key i for a tile of 16 keys: over each block b in order, the integer dot product of
// the two's codes there times (the key's scale * the query's), added by one fma each. A query is DIM / 4 dwords
// of codes, start[j][b] = -128 * the sum of its codes in block b and scale[j][b] its block scales (times the
// attention's); key_scales [DIM / 32][16] the tile's.
template <int DIM, int Q>
inline void scores16(const uint32_t* const (&q)[Q], const int32_t* const (&start)[Q], const float* const (&scale)[Q],
                     const uint8_t* tile, const float* key_scales, float* const (&scores)[Q]) {
  constexpr int CHUNKS = BLOCK / 4;  // dwords of a block
#ifdef INT8_DOTS_NATIVE
  __m512 total[Q];
  for (int j = 0; j < Q; ++j) total[j] = _mm512_setzero_ps();
  for (int b = 0; b < DIM / BLOCK; ++b) {
    __m512i sum[Q];
    for (int j = 0; j < Q; ++j) sum[j] = _mm512_set1_epi32(start[j][b]);
#pragma GCC unroll 8
    for (int c = b * CHUNKS; c < (b + 1) * CHUNKS; ++c) {
      const __m512i keys = _mm512_loadu_si512(tile + c * LANES * 4);
      for (int j = 0; j < Q; ++j) {
        sum[j] = _mm512_dpbusd_epi32(sum[j], keys, _mm512_set1_epi32(static_cast<int>(q[j][c])));
      }
    }
    const __m512 keys_scale = _mm512_loadu_ps(key_scales + b * LANES);
    for (int j = 0; j < Q; ++j) {
      const __m512 both = _mm512_mul_ps(keys_scale, _mm512_set1_ps(scale[j][b]));
      total[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[j]), both, total[j]);
    }
  }
  for (int j = 0; j < Q; ++j) _mm512_storeu_ps(scores[j], total[j]);
#else
  for (int j = 0; j < Q; ++j) {
    int8_t codes[DIM];
    std::memcpy(codes, q[j], DIM);
    for (int i = 0; i < LANES; ++i) {
      float total = 0.0f;
      for (int b = 0; b < DIM / BLOCK; ++b) {
        int32_t sum = start[j][b];
        for (int d = b * BLOCK; d < (b + 1) * BLOCK; ++d) {
          sum += static_cast<int32_t>(tile[((d / 4) * LANES + i) * 4 + d % 4]) * codes[d];
        }
        total = std::fma(static_cast<float>(sum), key_scales[b * LANES + i] * scale[j][b], total);
      }
      scores[j][i] = total;
    }
  }
#endif
}

// out[d] = (bf16 of a[d], bf16 of b[d]) as one dword, a in the low half: two value rows' codes (exact in bf16)
// as DIM pairs for bf16_dots::add_pairs.
template <int DIM>
inline void widen_pair(const int8_t* a, const int8_t* b, uint32_t* out) {
  int d = 0;
#ifdef INT8_DOTS_NATIVE
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  for (; d + LANES <= DIM; d += LANES) {
    const __m512 x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + d))));
    const __m512 y = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + d))));
    // (x >> 16) | (y & high): the top halves of two fp32 holding |code| <= 127, which are their bf16 exactly
    const __m512i pair = _mm512_ternarylogic_epi32(_mm512_srli_epi32(_mm512_castps_si512(x), 16),
                                                   _mm512_castps_si512(y), high, 0xf8);
    _mm512_storeu_si512(out + d, pair);
  }
#endif
  for (; d < DIM; ++d) {
    const float x = a[d], y = b[d];
    uint32_t xb, yb;
    std::memcpy(&xb, &x, 4);
    std::memcpy(&yb, &y, 4);
    out[d] = (xb >> 16) | (yb & 0xffff0000u);
  }
}

}  // namespace int8_dots
