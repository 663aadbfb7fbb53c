// Attention's two products on an int8 cache, both by AVX-512 VNNI's vpdpbusd.
//
// A key or value is quantized when it is written, symmetrically: x = s * c with c an integer in [-127, 127] and
// s = max|x| / 127, a key over each block of 32 dims (BLOCK) and a value over its whole row, so a row's codes
// and scales depend on that row alone and never change. A query is quantized like a key when it is scored. A
// score is then a sum over the blocks of an integer dot product (exact, in any order) times the two blocks'
// scales. A value row's scale goes into its softmax weight, and the weights of each 16 slots are quantized to
// unsigned bytes under one scale of their own (to two bytes, a coarse and a fine one, where the tile holds a
// large softmax weight), so a value sum is a sum over tiles of integer sums (exact, in any order) times scales.
//
// Key layout: tiles of 16 rows (slots 16t .. 16t + 15), a tile [DIM / 4][16][4] bytes: the four codes of dims
// 4c .. 4c + 3 of the 16 keys side by side, each code stored plus 128 (an unsigned byte). One vpdpbusd adds a
// query's four dims times those of 16 keys to 16 int32 lanes, lane i key i's, so a tile's scores need no lanes
// paired down. The bias is taken back by starting each block's sum at -128 times the sum of the query's codes
// there. Value layout: the same tiles of 16 slots, each four groups of 4 slots [DIM][4] bytes, so one vpdpbusd
// adds 4 slots' weighted codes to each of 16 dims. Scales lie in tiles too: [DIM / 32 + 1][16] fp32 per tile, the
// keys' block scales, then the values'.

#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#define INT8_DOTS_NATIVE 1
#elif defined(__AVX2__)
#include <immintrin.h>
#define INT8_DOTS_AVX2 1  // the same integer sums by vpmaddubsw / vpmaddwd, the same float steps after them
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
#elif defined(INT8_DOTS_AVX2)
  // Per query, keys 0-7 and 8-15 in two vectors. A block's integer sum is the same as VNNI's: the keys' codes
  // unbiased (xor 128) times the query's with its sign moved onto them, so vpmaddubsw's pairs stay within int16
  // (|sum| <= 2 * 127 * 127), then vpmaddwd adds each key's two pairs into its int32 lane.
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80)), ones = _mm256_set1_epi16(1);
  for (int j = 0; j < Q; ++j) {
    __m256 total[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int b = 0; b < DIM / BLOCK; ++b) {
      __m256i sum[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
      for (int c = b * CHUNKS; c < (b + 1) * CHUNKS; ++c) {
        const __m256i query = _mm256_set1_epi32(static_cast<int>(q[j][c]));
        const __m256i magnitude = _mm256_abs_epi8(query);
        for (int h = 0; h < 2; ++h) {
          const __m256i keys = _mm256_xor_si256(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + c * LANES * 4 + 32 * h)), bias);
          const __m256i pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(keys, query));
          sum[h] = _mm256_add_epi32(sum[h], _mm256_madd_epi16(pairs, ones));
        }
      }
      for (int h = 0; h < 2; ++h) {
        const __m256 both = _mm256_mul_ps(_mm256_loadu_ps(key_scales + b * LANES + 8 * h), _mm256_set1_ps(scale[j][b]));
        total[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[h]), both, total[h]);
      }
    }
    _mm256_storeu_ps(scores[j], total[0]);
    _mm256_storeu_ps(scores[j] + 8, total[1]);
  }
  (void)start;
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

// Byte offset of dim d of value `slot` in its head's tiled values: a tile of 16 slots is four groups of 4 slots,
// a group [DIM][4] bytes, the 4 slots' codes of dim d side by side.
inline int64_t value_offset(int64_t slot, int64_t d, int dim) {
  return (slot / LANES) * LANES * dim + ((slot % LANES) / 4) * 4 * dim + d * 4 + slot % 4;
}

// Write a value's codes into its tile.
inline void store_value(const int8_t* codes, int8_t* head_values, int64_t slot, int dim) {
  for (int d = 0; d < dim; ++d) head_values[value_offset(slot, d, dim)] = codes[d];
}

// Copy value `slot` into lane `lane` of a tile (a row's tail, gathered from wherever it lies).
inline void gather_value(const int8_t* head_values, int64_t slot, int8_t* tile, int lane, int dim) {
  for (int d = 0; d < dim; ++d) tile[value_offset(lane, d, dim)] = head_values[value_offset(slot, d, dim)];
}

// The largest of 16 floats that are >= 0 (0 if none is larger).
inline float largest(const float* x) {
#ifdef INT8_DOTS_NATIVE
  return std::max(0.0f, _mm512_reduce_max_ps(_mm512_loadu_ps(x)));
#else
  float top = 0.0f;
  for (int i = 0; i < LANES; ++i) top = std::max(top, x[i]);
  return top;
#endif
}

// A tile's 16 weights (softmax exponentials, each already times its value row's scale, all >= 0) as unsigned
// bytes under the scale s = max w / 255, which this returns (0 for a zero tile): c = round(w / s). With `fine`
// given, to 16 bits instead: c = floor(w / s) and fine = round((w / s - c) * 255), so w = s * (c + fine / 255)
// within s / 510 / 255.
inline float quantize_weights(const float* w, uint8_t* codes, uint8_t* fine) {
  const float top = largest(w);
  const float inverse = top > 0.0f ? 255.0f / top : 0.0f;
#ifdef INT8_DOTS_NATIVE
  const __m512 x = _mm512_loadu_ps(w);
  const __m512 scaled = _mm512_mul_ps(x, _mm512_set1_ps(inverse));
  const auto store = [](uint8_t* out, __m512 codes) {  // rounded to nearest even
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(codes)));
  };
  if (fine) {
    const __m512 whole = _mm512_roundscale_ps(scaled, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    store(codes, whole);
    store(fine, _mm512_mul_ps(_mm512_sub_ps(scaled, whole), _mm512_set1_ps(255.0f)));
  } else {
    store(codes, scaled);
  }
#else
  for (int i = 0; i < LANES; ++i) {
    const float scaled = w[i] * inverse;
    const float whole = fine ? std::floor(scaled) : std::nearbyint(scaled);
    codes[i] = static_cast<uint8_t>(whole);
    if (fine) fine[i] = static_cast<uint8_t>(std::nearbyint((scaled - whole) * 255.0f));
  }
#endif
  return top / 255.0f;
}

// acc[j][d] += (sum over the tile's 16 slots of weight code * value code at d) * the tile's weight scale, for
// `count` tiles in order and each of Q queries: the sum exact in int32 (vpdpbusd adds a group's 4 slots to each
// of 16 dims at once), then one fma a dim and tile, and where a tile's fine scale is not 0, the same again with
// its fine codes. weights[j] and fine[j] are 4 dwords a tile (its 16 codes), scales[j] and fine_scales[j] one
// float a tile, tiles [count][16 * DIM] as value_offset lays them out.
template <int DIM, int Q>
inline void add_value_tiles(const uint32_t* const (&weights)[Q], const float* const (&scales)[Q],
                            const uint32_t* const (&fine)[Q], const float* const (&fine_scales)[Q],
                            const int8_t* tiles, int64_t count, float* const (&acc)[Q]) {
#ifdef INT8_DOTS_NATIVE
  constexpr int kWidth = DIM % 64 == 0 ? 64 : 32, kVectors = kWidth / LANES;  // dims kept in registers at a time
  for (int h = 0; h < DIM; h += kWidth) {
    __m512 total[Q][kVectors];
    for (int j = 0; j < Q; ++j)
      for (int v = 0; v < kVectors; ++v) total[j][v] = _mm512_loadu_ps(acc[j] + h + LANES * v);
    for (int64_t t = 0; t < count; ++t) {
      const int8_t* tile = tiles + t * LANES * DIM + h * 4;
      __m512i sum[Q][kVectors];
      for (int j = 0; j < Q; ++j)
        for (int v = 0; v < kVectors; ++v) sum[j][v] = _mm512_setzero_si512();
      for (int g = 0; g < LANES / 4; ++g) {
        for (int j = 0; j < Q; ++j) {
          const __m512i weight = _mm512_set1_epi32(static_cast<int>(weights[j][4 * t + g]));
          for (int v = 0; v < kVectors; ++v) {
            sum[j][v] = _mm512_dpbusd_epi32(sum[j][v], weight, _mm512_loadu_si512(tile + (g * DIM + LANES * v) * 4));
          }
        }
      }
      for (int j = 0; j < Q; ++j) {
        const __m512 scale = _mm512_set1_ps(scales[j][t]);
        for (int v = 0; v < kVectors; ++v) {
          total[j][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[j][v]), scale, total[j][v]);
        }
        if (fine_scales[j][t] == 0.0f) continue;
        __m512i rest[kVectors];
        for (int v = 0; v < kVectors; ++v) rest[v] = _mm512_setzero_si512();
        for (int g = 0; g < LANES / 4; ++g) {
          const __m512i weight = _mm512_set1_epi32(static_cast<int>(fine[j][4 * t + g]));
          for (int v = 0; v < kVectors; ++v) {
            rest[v] = _mm512_dpbusd_epi32(rest[v], weight, _mm512_loadu_si512(tile + (g * DIM + LANES * v) * 4));
          }
        }
        const __m512 fine_scale = _mm512_set1_ps(fine_scales[j][t]);
        for (int v = 0; v < kVectors; ++v) {
          total[j][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(rest[v]), fine_scale, total[j][v]);
        }
      }
    }
    for (int j = 0; j < Q; ++j)
      for (int v = 0; v < kVectors; ++v) _mm512_storeu_ps(acc[j] + h + LANES * v, total[j][v]);
  }
#elif defined(INT8_DOTS_AVX2)
  // Per query and tile, 8 dims at a time: a group's 4 slots of dims d .. d + 3 widened to int16 and multiplied
  // by the 4 weight codes in pairs (vpmaddwd), the pairs then added (vphaddd), which leaves the dims in the
  // order 0, 1, 4, 5, 2, 3, 6, 7 of the 8 in int32 lanes: exact sums, put back in order once a tile.
  const __m256i order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
  const auto tile_sums = [&](const uint32_t* codes, const int8_t* tile, int d) {  // 8 dims' integer sums
    __m256i sum = _mm256_setzero_si256();
    for (int g = 0; g < LANES / 4; ++g) {
      const __m256i weights = _mm256_cvtepu8_epi16(_mm_set1_epi32(static_cast<int>(codes[g])));
      const __m256i values = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + (g * DIM + d) * 4));
      const __m256i low = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(values)), weights);
      const __m256i high = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(values, 1)), weights);
      sum = _mm256_add_epi32(sum, _mm256_hadd_epi32(low, high));
    }
    return _mm256_cvtepi32_ps(_mm256_permutevar8x32_epi32(sum, order));
  };
  for (int j = 0; j < Q; ++j) {
    for (int d = 0; d < DIM; d += 8) {
      __m256 total = _mm256_loadu_ps(acc[j] + d);
      for (int64_t t = 0; t < count; ++t) {
        const int8_t* tile = tiles + t * LANES * DIM;
        total = _mm256_fmadd_ps(tile_sums(weights[j] + 4 * t, tile, d), _mm256_set1_ps(scales[j][t]), total);
        if (fine_scales[j][t] != 0.0f) {
          total = _mm256_fmadd_ps(tile_sums(fine[j] + 4 * t, tile, d), _mm256_set1_ps(fine_scales[j][t]), total);
        }
      }
      _mm256_storeu_ps(acc[j] + d, total);
    }
  }
#else
  const auto add = [](const uint32_t* codes_of_tiles, float tile_scale, const int8_t* tile, float* sums) {
    uint8_t codes[LANES];
    std::memcpy(codes, codes_of_tiles, LANES);
    for (int d = 0; d < DIM; ++d) {
      int32_t sum = 0;
      for (int i = 0; i < LANES; ++i) sum += static_cast<int32_t>(codes[i]) * tile[value_offset(i, d, DIM)];
      sums[d] = std::fma(static_cast<float>(sum), tile_scale, sums[d]);
    }
  };
  for (int j = 0; j < Q; ++j) {
    for (int64_t t = 0; t < count; ++t) {
      const int8_t* tile = tiles + t * LANES * DIM;
      add(weights[j] + 4 * t, scales[j][t], tile, acc[j]);
      if (fine_scales[j][t] != 0.0f) add(fine[j] + 4 * t, fine_scales[j][t], tile, acc[j]);
    }
  }
#endif
}

}  // namespace int8_dots
