// The 512-bit kernels (AVX-512 VNNI, BW, VL): a pair's two 8-row tiles side by side, lanes 0-7 the first
// tile's rows and 8-15 the second's, every lane's integer and float steps those of the 256-bit kernels (avx2.h).
// Activation rows come in eights (ROWS).
#pragma once

#include "avx2.h"

#ifdef GGUF_VNNI
namespace gguf {

// 32 bytes of each of a pair's two tiles, one vector (the first tile's in the low half).
inline __m512i pair_bytes(const void* a, const void* b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(load256(a)), load256(b), 1);
}

// 8 fp16 of each of a pair's two tiles, as 16 floats.
inline __m512 pair_halves(const void* a, const void* b) {
  return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
                                                 _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1));
}

// Each activation row's 16 lanes, acc + offset, stored out: lane i to weight row i's column.
inline void store_pair_rows(const __m512* acc, const __m512* offset, int64_t n, const Quantized& x, int64_t first,
                            float* out) {
  for (int64_t r = 0; r < n; ++r) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, _mm512_add_ps(acc[r], offset[r]));
    for (int i = 0; i < 16; ++i) out[i * x.rows + first + r] = lanes[i];
  }
}

// A K-quant pair's group closed for activation row `row` of x: Q = the sub-blocks' int16 `weights` (mins or scales,
// [row][which of a pair], PAIRS pairs) times the row's `sums` of their values, then both float steps, each lane's:
// acc += float(P) (da d), offset += float(Q) (da neg).
template <int PAIRS>
inline void close_pair_group(const Quantized& x, int64_t row, int64_t g, const int16_t* sums, const __m512i* weights,
                             __m512 d, __m512 neg, __m512i p, __m512& acc, __m512& offset) {
  __m512i q = _mm512_setzero_si512();
  for (int pair = 0; pair < PAIRS; ++pair) {
    int32_t two;
    std::memcpy(&two, sums + 2 * pair, 4);
    q = _mm512_add_epi32(q, _mm512_madd_epi16(weights[pair], _mm512_set1_epi32(two)));
  }
  const __m512 da = _mm512_set1_ps(x.scale[row * (x.cols / 256) + g]);
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(da, d), acc);
  offset = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), _mm512_mul_ps(da, neg), offset);
}

// A Q4_K pair's group closed for an activation row: the integer sum of its sub-block mins times the row's sums,
// then both float steps of `tile_dots` (avx2.h), each lane's.
struct K4PairGroup {
  __m512 d, neg_min;
  __m512i mins[4];  // int16 pairs [row][which of the pair], per pair of sub-blocks

  K4PairGroup(const TileQ4K& ta, const TileQ4K& tb)
      : d(pair_halves(ta.d, tb.d)), neg_min(_mm512_sub_ps(_mm512_setzero_ps(), pair_halves(ta.dmin, tb.dmin))) {
    for (int pair = 0; pair < 4; ++pair)
      mins[pair] = _mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ta.mins[pair])))),
          _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tb.mins[pair]))), 1);
  }

  // Row `row` of x, group g, its sub-blocks' scaled sums p.
  void operator()(const Quantized& x, int64_t row, int64_t g, __m512i p, __m512& acc, __m512& offset) const {
    close_pair_group<4>(x, row, g, x.sums32.data() + row * x.cols / 32 + g * 8, mins, d, neg_min, p, acc, offset);
  }
};

// Vector v of sub-block j of a pair of Q4_K or Q5_K tiles: `low` holds values 8v .. 8v + 3 of each of the 16 rows,
// `high` values 8v + 4 .. 8v + 7; Q5_K's fifth bits added by a byte mask.
template <typename Tile>
inline void k4_pair_codes(const Tile& wa, const Tile& wb, int j, int v, __m512i& low, __m512i& high) {
  const __m512i m4 = _mm512_set1_epi8(15), sixteen = _mm512_set1_epi8(16);
  const __m512i codes = pair_bytes(k4_part(wa).codes[j] + 32 * v, k4_part(wb).codes[j] + 32 * v);
  low = _mm512_and_si512(codes, m4);
  high = _mm512_and_si512(_mm512_srli_epi16(codes, 4), m4);
  if constexpr (std::is_same_v<Tile, TileQ5K>) {  // bits 2v and 2v + 1 of each code lane's byte
    const __m512i fifth = pair_bytes(wa.fifth[j], wb.fifth[j]);
    const auto bits = [&](int k) { return _mm512_test_epi8_mask(fifth, _mm512_set1_epi8(static_cast<char>(1 << k))); };
    low = _mm512_mask_add_epi8(low, bits(2 * v), low, sixteen);
    high = _mm512_mask_add_epi8(high, bits(2 * v + 1), high, sixteen);
  }
}

// Sub-block j's scales of a pair of Q4_K tiles, int32 by row.
inline __m512i k4_pair_scales(const TileQ4K& ta, const TileQ4K& tb, int j) {
  uint64_t sa, sb;
  std::memcpy(&sa, ta.scales[j], 8);
  std::memcpy(&sb, tb.scales[j], 8);
  return _mm512_cvtepu8_epi32(_mm_set_epi64x(static_cast<int64_t>(sb), static_cast<int64_t>(sa)));
}

// A pair's two tiles side by side in 512-bit vectors (lanes 0-7 the first tile's rows, 8-15 the second's): half the
// instructions of two calls of `tile_dots<ROWS, true>`, and every lane's integer and float steps the same as there.
// Q5_K tiles (`Tile` TileQ5K) add their fifth bits by a byte mask. out[i * x.rows + r] for the 16 weight rows i.
template <int ROWS, typename Tile = TileQ4K>
void tile_pair_dots_vnni(const uint8_t* pair, const Quantized& x, int64_t first, float* out) {
  const int64_t cols = x.cols, groups = cols / 256;
  const auto* tiles = reinterpret_cast<const Tile*>(pair);
  __m512 acc[ROWS], offset[ROWS];
  for (int r = 0; r < ROWS; ++r) acc[r] = offset[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const Tile &wa = tiles[2 * g], &wb = tiles[2 * g + 1];
    const TileQ4K &ta = k4_part(wa), &tb = k4_part(wb);
    const Tile* ahead = tiles + 2 * (g + kPrefetchGroups * sizeof(TileQ4K) / sizeof(Tile) / 2);
    __m512i p[ROWS];
    for (int r = 0; r < ROWS; ++r) p[r] = _mm512_setzero_si512();
#pragma GCC unroll 1
    for (int j = 0; j < 8; ++j) {
      prefetch_part(ahead, 2 * sizeof(Tile), j, 8);
      __m512i dot[ROWS];  // int32: weight row i's sub-block sum in lane i
      for (int r = 0; r < ROWS; ++r) dot[r] = _mm512_setzero_si512();
      const int8_t* a = x.q.data() + first * cols + g * 256 + 32 * j;
      for (int v = 0; v < 4; ++v) {
        __m512i low, high;
        k4_pair_codes(wa, wb, j, v, low, high);
        for (int r = 0; r < ROWS; ++r) {
          int32_t front, back;
          std::memcpy(&front, a + r * cols + 8 * v, 4);
          std::memcpy(&back, a + r * cols + 8 * v + 4, 4);
          dot[r] = _mm512_dpbusd_epi32(dot[r], low, _mm512_set1_epi32(front));
          dot[r] = _mm512_dpbusd_epi32(dot[r], high, _mm512_set1_epi32(back));
        }
      }
      const __m512i scales = k4_pair_scales(ta, tb, j);
      for (int r = 0; r < ROWS; ++r) p[r] = _mm512_add_epi32(p[r], _mm512_mullo_epi32(dot[r], scales));
    }
    const K4PairGroup close(ta, tb);
    for (int r = 0; r < ROWS; ++r) close(x, first + r, g, p[r], acc[r], offset[r]);
  }
  store_pair_rows(acc, offset, ROWS, x, first, out);
}

// A pair of IQ4_XS tiles side by side in 512-bit vectors (lanes 0-7 the first tile's rows, 8-15 the second's), as
// `tile_pair_dots_vnni` reads Q4_K's: every lane's integer and float steps those of `iq4_tile_dots<ROWS, true>`.
template <int ROWS>
void iq4_pair_dots_vnni(const uint8_t* pair, const Quantized& x, int64_t first, float* out) {
  const int64_t cols = x.cols, groups = cols / 256;
  const auto* tiles = reinterpret_cast<const TileIQ4XS*>(pair);
  const __m512i m4 = _mm512_set1_epi8(15);
  const __m512i lookup = _mm512_add_epi8(_mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kIq4Values))),
                                         _mm512_set1_epi8(-128));  // v + 128, mod 256
  __m512 acc[ROWS], offset[ROWS];
  for (int r = 0; r < ROWS; ++r) acc[r] = offset[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const TileIQ4XS &ta = tiles[2 * g], &tb = tiles[2 * g + 1];
    const TileIQ4XS* ahead = tiles + 2 * (g + kPrefetchGroups * sizeof(TileQ4K) / sizeof(TileIQ4XS) / 2);
    __m512i p[ROWS];
    for (int r = 0; r < ROWS; ++r) p[r] = _mm512_setzero_si512();
#pragma GCC unroll 1
    for (int j = 0; j < 8; ++j) {
      prefetch_part(ahead, 2 * sizeof(TileIQ4XS), j, 8);
      __m512i dot[ROWS];  // int32: weight row i's sum of (v + 128) a in lane i
      for (int r = 0; r < ROWS; ++r) dot[r] = _mm512_setzero_si512();
      const int8_t* a = x.q.data() + first * cols + g * 256 + 32 * j;
      for (int v = 0; v < 4; ++v) {
        const __m512i codes = pair_bytes(ta.codes[j] + 32 * v, tb.codes[j] + 32 * v);
        const __m512i low = _mm512_shuffle_epi8(lookup, _mm512_and_si512(codes, m4));
        const __m512i high = _mm512_shuffle_epi8(lookup, _mm512_and_si512(_mm512_srli_epi16(codes, 4), m4));
        for (int r = 0; r < ROWS; ++r) {
          int32_t front, back;
          std::memcpy(&front, a + r * cols + 8 * v, 4);
          std::memcpy(&back, a + r * cols + 8 * v + 4, 4);
          dot[r] = _mm512_dpbusd_epi32(dot[r], low, _mm512_set1_epi32(front));
          dot[r] = _mm512_dpbusd_epi32(dot[r], high, _mm512_set1_epi32(back));
        }
      }
      const __m512i scales = _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(ta.scales[j])), _mm_loadl_epi64(reinterpret_cast<const __m128i*>(tb.scales[j]))));
      for (int r = 0; r < ROWS; ++r) {
        const int32_t sum = x.sums32[(first + r) * cols / 32 + g * 8 + j];
        p[r] = _mm512_add_epi32(p[r], _mm512_mullo_epi32(_mm512_sub_epi32(dot[r], _mm512_set1_epi32(128 * sum)), scales));
      }
    }
    const __m512 d = pair_halves(ta.d, tb.d);
    for (int r = 0; r < ROWS; ++r) {
      const __m512 da = _mm512_set1_ps(x.scale[(first + r) * groups + g]);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p[r]), _mm512_mul_ps(da, d), acc[r]);
    }
  }
  store_pair_rows(acc, offset, ROWS, x, first, out);
}

// `quad` in 512 bits. Each quad its own 4-byte load: one 16-byte copy of all four went through general registers
// (a 64-bit load, a shift, a broadcast from a register), and left the Q6_K pair kernel 13% slower.
inline __m512i quad512(const int8_t* a, int k) {
  int32_t four;
  std::memcpy(&four, a + 4 * k, 4);
  return _mm512_set1_epi32(four);
}

// Sub-block j's codes of a pair of Q6_K, Q3_K or Q2_K tiles: codes[k] holds values 4k .. 4k + 3 of each of the 16 rows.
inline void k16_pair_codes(const TileQ6K& ta, const TileQ6K& tb, int j, __m512i (&codes)[4]) {
  const __m512i m4 = _mm512_set1_epi8(15), top = _mm512_set1_epi8(0x30);
  const __m512i low0 = pair_bytes(ta.low[j], tb.low[j]), low1 = pair_bytes(ta.low[j] + 32, tb.low[j] + 32);
  const __m512i high = pair_bytes(ta.high[j], tb.high[j]);
  codes[0] = _mm512_or_si512(_mm512_and_si512(low0, m4), _mm512_and_si512(_mm512_slli_epi16(high, 4), top));
  codes[1] = _mm512_or_si512(_mm512_and_si512(low1, m4), _mm512_and_si512(_mm512_slli_epi16(high, 2), top));
  codes[2] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(low0, 4), m4), _mm512_and_si512(high, top));
  codes[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(low1, 4), m4),
                             _mm512_and_si512(_mm512_srli_epi16(high, 2), top));
}
inline void k16_pair_codes(const TileQ3K& ta, const TileQ3K& tb, int j, __m512i (&codes)[4]) {
  const __m512i m2 = _mm512_set1_epi8(3), bit2 = _mm512_set1_epi8(4);
  const __m512i low = pair_bytes(ta.low[j], tb.low[j]), both = pair_bytes(ta.high[j / 2], tb.high[j / 2]);
  const __m512i high = j % 2 ? _mm512_srli_epi16(both, 4) : both;  // quarter k's third bit: bit k of each byte
  codes[0] = _mm512_or_si512(_mm512_and_si512(low, m2), _mm512_and_si512(_mm512_slli_epi16(high, 2), bit2));
  codes[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(low, 2), m2),
                             _mm512_and_si512(_mm512_slli_epi16(high, 1), bit2));
  codes[2] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(low, 4), m2), _mm512_and_si512(high, bit2));
  codes[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(low, 6), m2),
                             _mm512_and_si512(_mm512_srli_epi16(high, 1), bit2));
}

inline void k16_pair_codes(const TileQ2K& ta, const TileQ2K& tb, int j, __m512i (&codes)[4]) {
  const __m512i m2 = _mm512_set1_epi8(3), low = pair_bytes(ta.low[j], tb.low[j]);
  codes[0] = _mm512_and_si512(low, m2);
  codes[1] = _mm512_and_si512(_mm512_srli_epi16(low, 2), m2);
  codes[2] = _mm512_and_si512(_mm512_srli_epi16(low, 4), m2);
  codes[3] = _mm512_and_si512(_mm512_srli_epi16(low, 6), m2);
}

// A k16 pair's group (Q6_K, Q3_K or Q2_K tiles) closed for an activation row: the integer sum of its sub-blocks' M
// times the row's sums, then both float steps of `k16_tile_dots` (avx2.h), each lane's.
struct K16PairGroup {
  __m512 d, offset_factor;              // d and B by row
  __m512i scales16[8], mins16[8];       // S and M, int16 [row][which of the pair], per pair of sub-blocks

  template <typename Tile>
  K16PairGroup(const Tile& ta, const Tile& tb) : d(pair_halves(ta.d, tb.d)) {
    if constexpr (Tile::kMins)
      offset_factor = _mm512_sub_ps(_mm512_setzero_ps(), pair_halves(ta.dmin, tb.dmin));
    else
      offset_factor = _mm512_mul_ps(_mm512_set1_ps(-static_cast<float>(Tile::kCentre)), d);
    for (int pair = 0; pair < 8; ++pair) {
      const __m256i bytes = _mm256_inserti128_si256(
          _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ta.scales[pair]))),
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(tb.scales[pair])), 1);
      if constexpr (Tile::kMins) {
        const __m512i both = _mm512_cvtepu8_epi16(bytes);
        scales16[pair] = _mm512_and_si512(both, _mm512_set1_epi16(15));
        mins16[pair] = _mm512_srli_epi16(both, 4);
      } else {
        scales16[pair] = mins16[pair] = _mm512_cvtepi8_epi16(bytes);
      }
    }
  }

  // Sub-block j's scales, int32 by row.
  __m512i scales(int j) const {
    const __m512i pairs = scales16[j / 2];
    return j % 2 ? _mm512_srai_epi32(pairs, 16) : _mm512_srai_epi32(_mm512_slli_epi32(pairs, 16), 16);
  }

  // Row `row` of x, group g, its sub-blocks' scaled sums p.
  void operator()(const Quantized& x, int64_t row, int64_t g, __m512i p, __m512& acc, __m512& offset) const {
    close_pair_group<8>(x, row, g, x.sums.data() + row * x.cols / 16 + g * 16, mins16, d, offset_factor, p, acc,
                        offset);
  }
};

// A pair of Q6_K, Q3_K or Q2_K tiles side by side in 512-bit vectors (lanes 0-7 the first tile's rows, 8-15 the second's),
// as `tile_pair_dots_vnni` does for Q4_K: every lane's integer and float steps those of `k16_tile_dots<ROWS, true>`.
template <int ROWS, typename Tile>
void k16_tile_pair_dots_vnni(const uint8_t* pair, const Quantized& x, int64_t first, float* out) {
  const int64_t cols = x.cols, groups = cols / 256;
  const auto* tiles = reinterpret_cast<const Tile*>(pair);
  __m512 acc[ROWS], offset[ROWS];
  for (int r = 0; r < ROWS; ++r) acc[r] = offset[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const Tile &ta = tiles[2 * g], &tb = tiles[2 * g + 1];
    const Tile* ahead = tiles + 2 * (g + kPrefetchGroups / 2);
    const K16PairGroup group(ta, tb);
    __m512i p[ROWS];
    for (int r = 0; r < ROWS; ++r) p[r] = _mm512_setzero_si512();
#pragma GCC unroll 1
    for (int j = 0; j < 16; ++j) {
      if (j % 2 == 0) prefetch_part(ahead, 2 * sizeof(Tile), j / 2, 8);
      __m512i codes[4];
      k16_pair_codes(ta, tb, j, codes);
      const __m512i scales = group.scales(j);
      for (int r = 0; r < ROWS; ++r) {
        const int8_t* a = x.q.data() + (first + r) * cols + g * 256 + 16 * j;
        __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes[0], quad512(a, 0));
        dot = _mm512_dpbusd_epi32(dot, codes[1], quad512(a, 1));
        dot = _mm512_dpbusd_epi32(dot, codes[2], quad512(a, 2));
        dot = _mm512_dpbusd_epi32(dot, codes[3], quad512(a, 3));
        p[r] = _mm512_add_epi32(p[r], _mm512_mullo_epi32(dot, scales));
      }
    }
    for (int r = 0; r < ROWS; ++r) group(x, first + r, g, p[r], acc[r], offset[r]);
  }
  store_pair_rows(acc, offset, ROWS, x, first, out);
}

// A pair's two legacy tiles side by side in 512-bit vectors (lanes 0-7 the first tile's rows, 8-15 the second's),
// as `tile_pair_dots_vnni` reads Q4_K: every lane's integer and float steps those of `legacy_tile_dots`. Through
// 256 bits a tile at a time, a forward's Q4_0 matrices of the 1.5B took 1.5x one row's time at 4 rows.
template <typename Tile, int ROWS>
void legacy_pair_dots_vnni(const uint8_t* pair, const Quantized& x, int64_t first, float* out) {
  using L = Legacy<Tile>;
  constexpr int64_t ahead = kPrefetchGroups * sizeof(TileQ4K) / sizeof(Tile);
  const int64_t cols = x.cols, groups = cols / 32;
  const auto* tiles = reinterpret_cast<const Tile*>(pair);
  const __m512i m4 = _mm512_set1_epi8(15), sixteen = _mm512_set1_epi8(16);
  __m512 acc[ROWS];
  for (int r = 0; r < ROWS; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const Tile &ta = tiles[2 * g], &tb = tiles[2 * g + 1];
    prefetch(tiles + 2 * g + ahead, 2 * sizeof(Tile));
    __m512i p[ROWS], high_p[ROWS];  // two chains a row, as in `legacy_tile_dots`
    for (int r = 0; r < ROWS; ++r) p[r] = high_p[r] = _mm512_setzero_si512();
    __m512i fifth = _mm512_setzero_si512();
    if constexpr (L::five) fifth = pair_bytes(ta.fifth, tb.fifth);
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      const __m512i codes = pair_bytes(ta.codes[v], tb.codes[v]);
      __m512i low = _mm512_and_si512(codes, m4), high = _mm512_and_si512(_mm512_srli_epi16(codes, 4), m4);
      if constexpr (L::five) {  // bits 2v and 2v + 1 of each code lane's byte
        const auto bits = [&](int k) { return _mm512_test_epi8_mask(fifth, _mm512_set1_epi8(static_cast<char>(1 << k))); };
        low = _mm512_mask_add_epi8(low, bits(2 * v), low, sixteen);
        high = _mm512_mask_add_epi8(high, bits(2 * v + 1), high, sixteen);
      }
      if constexpr (L::table) {  // IQ4_NL: v + 128
        const __m512i table = _mm512_add_epi8(
            _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kIq4Values))), _mm512_set1_epi8(-128));
        low = _mm512_shuffle_epi8(table, low);
        high = _mm512_shuffle_epi8(table, high);
      }
      for (int r = 0; r < ROWS; ++r) {
        int32_t front, back;
        std::memcpy(&front, x.q.data() + (first + r) * cols + g * 32 + 8 * v, 4);
        std::memcpy(&back, x.q.data() + (first + r) * cols + g * 32 + 8 * v + 4, 4);
        p[r] = _mm512_dpbusd_epi32(p[r], low, _mm512_set1_epi32(front));
        high_p[r] = _mm512_dpbusd_epi32(high_p[r], high, _mm512_set1_epi32(back));
      }
    }
    const __m512 d = pair_halves(ta.d, tb.d);
    for (int r = 0; r < ROWS; ++r) {
      const int32_t s = x.sums32[(first + r) * groups + g];
      __m512i sum = _mm512_add_epi32(p[r], high_p[r]);
      if constexpr (L::bias != 0) sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(L::bias * s));
      const __m512 da = _mm512_set1_ps(x.scale[(first + r) * groups + g]);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(da, d), acc[r]);
      if constexpr (L::min)
        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(static_cast<float>(s)), _mm512_mul_ps(da, pair_halves(ta.m, tb.m)), acc[r]);
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, _mm512_add_ps(acc[r], _mm512_setzero_ps()));
    for (int i = 0; i < 16; ++i) out[i * x.rows + first + r] = lanes[i];
  }
}

// ---- The IQ types (IQ1_S ... IQ3_S) read from their blocks -----------------------------------------------------------
// A block's values are codebook entries (unpack.h) of 8 or 4 positive bytes, 64 values a vector: vpdpbusd takes them
// as its unsigned operand and the activations, negated where a value's sign is set, as its signed one. A block's
// entry indices are put together in vectors of 16-bit words (entry e in word e % 32 of vector e / 32), and a grid
// turns them into entries: gathered from memory (`GatheredGrid`) or, where the build has vpermb and the grid fits 16
// registers (IQ2_XXS, IQ2_XS, IQ3_XXS, IQ3_S), looked up by permutes (`RegisterGrid`). Dword lane j of a vector holds
// values 4j .. 4j + 3 of its 64; each weight row's lanes are summed into its P and the float step of tiles.h taken.

// One block: its values' magnitudes, their signs (bit v of signs[k] for value 64 k + v), the 16-value sub-blocks'
// scales S (lane j for sub-block j) and A.
struct IqBlock {
  __m512i magnitudes[4];
  uint64_t signs[4];
  __m512i scales;
  float a;
};

// Word e: e (a block's 32 entries, one a word).
inline __m512i word_numbers() {
  return _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16,
                          15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
}

// The words of `index` (32 entries) that vector m of their values takes, zero-extended to its lanes: entry 8 m + j
// in qword j (WIDTH 8, m < 4), entry 16 m + j in dword j (WIDTH 4, m < 2).
template <int WIDTH>
inline __m512i entry_lanes(__m512i index, int m) {
  const __m512i from = _mm512_add_epi16(_mm512_srli_epi16(word_numbers(), WIDTH == 8 ? 2 : 1), _mm512_set1_epi16(static_cast<int16_t>(64 / WIDTH * m)));
  return _mm512_maskz_permutexvar_epi16(WIDTH == 8 ? 0x11111111 : 0x55555555, from, index);
}

// A grid of WIDTH-value entries read from memory by gathers: a load an entry.
template <int WIDTH>
struct GatheredGrid {
  const int8_t* values;  // [entries * WIDTH]

  // A block's four vectors of values from its entries' indices (8 / WIDTH vectors of 32).
  void entries(const __m512i* index, __m512i (&out)[4]) const {
    for (int v = 0; v < 8 / WIDTH; ++v)
      for (int m = 0; m < WIDTH / 2; ++m) {
        const __m512i lanes = entry_lanes<WIDTH>(index[v], m);
        if constexpr (WIDTH == 8) out[WIDTH / 2 * v + m] = _mm512_i64gather_epi64(lanes, values, 8);
        else out[WIDTH / 2 * v + m] = _mm512_i32gather_epi32(lanes, values, 4);
      }
  }
};

#ifdef __AVX512VBMI__
// A grid of 32 VECTORS entries held in registers for a row's blocks (`PackedGrid`, 16 bits an entry): 32 entries'
// codes looked up by VECTORS / 2 two-table permutes and a tree of blends on the indices' high bits, then each
// entry's WIDTH values from its code's fields by vpmultishiftqb and vpermb.
template <int VECTORS, int WIDTH>
struct RegisterGrid {
  __m512i codes[VECTORS];
  __m512i values;  // byte j: value j mod 2^bits (vpermb reads six bits of a byte: a field and its neighbour's)

  explicit RegisterGrid(const PackedGrid& grid) {
    TORCH_CHECK(grid.codes.size() == 32 * VECTORS, "the IQ types' codebooks were not handed to the CPU decoder (iq_grids)");
    for (int t = 0; t < VECTORS; ++t) codes[t] = _mm512_loadu_si512(grid.codes.data() + 32 * t);
    alignas(64) int8_t bytes[64];
    for (int j = 0; j < 64; ++j) bytes[j] = grid.values[j % (1 << 16 / WIDTH)];
    values = _mm512_load_si512(bytes);
  }

  // The codes of the 32 entries whose indices are `index`'s words.
  __m512i lookup(__m512i index) const {
    __m512i found[VECTORS / 2];
    for (int t = 0; t < VECTORS / 2; ++t) found[t] = _mm512_permutex2var_epi16(codes[2 * t], index, codes[2 * t + 1]);
    for (int n = VECTORS / 2, bit = 6; n > 1; n /= 2, ++bit) {
      const __mmask32 upper = _mm512_test_epi16_mask(index, _mm512_set1_epi16(static_cast<int16_t>(1 << bit)));
      for (int t = 0; t < n / 2; ++t) found[t] = _mm512_mask_blend_epi16(upper, found[2 * t], found[2 * t + 1]);
    }
    return found[0];
  }

  void entries(const __m512i* index, __m512i (&out)[4]) const {
    const __m512i fields = _mm512_set1_epi64(WIDTH == 8 ? 0x0E0C0A0806040200 : 0x2C2824200C080400);  // their first bits
    for (int v = 0; v < 8 / WIDTH; ++v) {
      const __m512i found = lookup(index[v]);
      for (int m = 0; m < WIDTH / 2; ++m)
        out[WIDTH / 2 * v + m] = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(fields, entry_lanes<WIDTH>(found, m)), values);
    }
  }
};
#endif

// The grid an IQ type's blocks are read with, for a row's blocks.
template <int64_t TYPE>
inline auto block_grid() {
#ifdef __AVX512VBMI__
  if constexpr (TYPE == IQ2_XXS) return RegisterGrid<8, 8>(iq_grids().iq2xxs_packed);
  else if constexpr (TYPE == IQ2_XS) return RegisterGrid<16, 8>(iq_grids().iq2xs_packed);
  else if constexpr (TYPE == IQ3_XXS) return RegisterGrid<8, 4>(iq_grids().iq3xxs_packed);
  else if constexpr (TYPE == IQ3_S) return RegisterGrid<16, 4>(iq_grids().iq3s_packed);
  else
#endif
    return GatheredGrid<kIqWidth<TYPE>>{iq_grid<TYPE>()};
}

// S = 2 s + 1 of 32-value sub-blocks from the top nibbles of eight words, as 16-value sub-blocks' (lane j: j / 2's).
inline __m512i top_nibble_scales(__m256i words) {
  const __m512i s = _mm512_castsi256_si512(_mm256_srli_epi32(words, 28));
  const __m512i pair = _mm512_permutexvar_epi32(_mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0), s);
  return _mm512_add_epi32(_mm512_slli_epi32(pair, 1), _mm512_set1_epi32(1));
}

// S from 4-bit s per 16 values, the nibbles of `bytes` (IQ2_XS, IQ2_S).
inline __m512i nibble_scales16(const uint8_t* bytes) {
  const __m512i s = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes)));  // 8 bytes used
  const __m512i pair = _mm512_permutexvar_epi32(_mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0), s);
  const __m512i shift = _mm512_set_epi32(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0);
  const __m512i nibble = _mm512_and_si512(_mm512_srlv_epi32(pair, shift), _mm512_set1_epi32(15));
  return _mm512_add_epi32(_mm512_slli_epi32(nibble, 1), _mm512_set1_epi32(1));
}

// Words of 7 sign bits with an eighth that makes their count even, as bytes (IQ2_XS: bits 9-15 of an entry's word).
inline __m256i even_sign_words(__m512i seven) {
  __m512i parity = _mm512_xor_si512(seven, _mm512_srli_epi16(seven, 4));
  parity = _mm512_xor_si512(parity, _mm512_srli_epi16(parity, 2));
  parity = _mm512_xor_si512(parity, _mm512_srli_epi16(parity, 1));
  return _mm512_cvtepi16_epi8(_mm512_or_si512(seven, _mm512_slli_epi16(_mm512_and_si512(parity, _mm512_set1_epi16(1)), 7)));
}

// IQ1_S and IQ1_M: entries of -1, 0, 1 (11-bit indices), each value's code 8 g + delta (delta +-1, per 32 values in
// IQ1_S, per entry in IQ1_M) split into magnitude and sign; the deltas' signs in a mask (bit e: entry e's is -1).
template <int64_t TYPE, typename Grid>
inline void iq1_block(const uint8_t* b, const Grid& grid, IqBlock& out) {
  const __m512i low = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + (TYPE == IQ1_S ? 2 : 0))));
  __m512i high;     // word e: entry e's three high index bits
  uint32_t minus;   // bit e: entry e's delta is -1
  __m512i s;        // dword j: the 3-bit s of sub-block j, among other bits
  if constexpr (TYPE == IQ1_S) {  // a word per 32 values: 3 index bits an entry, s at 12, the delta's sign at 15
    const __m512i words = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 34)));
    const __m512i quarter = _mm512_srli_epi16(word_numbers(), 2);
    const __m512i own = _mm512_permutexvar_epi16(quarter, words);  // word e: word e / 4
    const __m512i shift = _mm512_set1_epi64(0x0009000600030000);  // word e: 3 (e % 4)
    high = _mm512_and_si512(_mm512_srlv_epi16(own, shift), _mm512_set1_epi16(7));
    minus = _mm512_movepi16_mask(own);
    s = _mm512_srli_epi32(own, 12);  // dword j: words 2 j and 2 j + 1, both word j / 2
    out.a = half(b) / 8;
  } else {  // a nibble per entry (3 index bits, the delta's sign); s per 16 values, 3 bits each in four words
    const __m128i nibbles = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 32));
    const __m128i mask = _mm_set1_epi8(15);
    const __m128i even = _mm_and_si128(nibbles, mask), odd = _mm_and_si128(_mm_srli_epi16(nibbles, 4), mask);
    const __m256i own = _mm256_set_m128i(_mm_unpackhi_epi8(even, odd), _mm_unpacklo_epi8(even, odd));  // byte e: entry e
    high = _mm512_cvtepu8_epi16(_mm256_and_si256(own, _mm256_set1_epi8(7)));
    minus = _mm256_movepi8_mask(_mm256_slli_epi16(own, 4));
    const __m512i words = _mm512_cvtepu16_epi32(_mm256_castsi128_si256(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 48))));
    const __m512i quarter = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    s = _mm512_srlv_epi32(_mm512_permutexvar_epi32(quarter, words), _mm512_set4_epi32(9, 6, 3, 0));
    out.a = iq1_m_scale(b) / 8;
  }
  out.scales = _mm512_add_epi32(_mm512_slli_epi32(_mm512_and_si512(s, _mm512_set1_epi32(7)), 1), _mm512_set1_epi32(1));
  const __m512i index = _mm512_or_si512(low, _mm512_slli_epi16(high, 8));
  __m512i g[4];
  grid.entries(&index, g);
  for (int k = 0; k < 4; ++k) {  // entries 8 k .. 8 k + 7
    const __m512i g2 = _mm512_add_epi8(g[k], g[k]), g4 = _mm512_add_epi8(g2, g2);
    const __m512i deltas = _mm512_mask_blend_epi64(static_cast<__mmask8>(minus >> 8 * k), _mm512_set1_epi8(1), _mm512_set1_epi8(-1));
    const __m512i codes = _mm512_add_epi8(_mm512_add_epi8(g4, g4), deltas);
    out.signs[k] = _mm512_movepi8_mask(codes);
    out.magnitudes[k] = _mm512_abs_epi8(codes);
  }
}

// The other types: indices in bytes (IQ3 with a ninth bit, IQ2_S a ninth and tenth), or in words with the signs.
template <int64_t TYPE, typename Grid>
inline void iq_block(const uint8_t* b, const Grid& grid, IqBlock& out) {
  __m512i index[2];  // entry e's index in word e % 32 of index[e / 32]
  if constexpr (TYPE == IQ3_XXS || TYPE == IQ3_S) {  // 64 entries of 4 values, their indices bytes
    for (int h = 0; h < 2; ++h) {
      index[h] = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2 + 32 * h)));
      if constexpr (TYPE == IQ3_S)  // their ninth bits
        index[h] = _mm512_mask_add_epi16(index[h], word32(b + 66 + 4 * h), index[h], _mm512_set1_epi16(256));
    }
    if constexpr (TYPE == IQ3_XXS) {  // a word per 32 values: four signs' 7 bits and s
      const __m256i words = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 66));
      even_sign_bytes(words, out.signs);
      out.scales = top_nibble_scales(words);
      out.a = half(b) / 4;
    } else {
      std::memcpy(out.signs, b + 74, 32);
      alignas(64) int32_t scales[16];
      for (int ib = 0; ib < 8; ++ib) scales[2 * ib] = scales[2 * ib + 1] = 2 * ((b[106 + ib / 2] >> 4 * (ib % 2)) & 15) + 1;
      out.scales = _mm512_load_si512(scales);
      out.a = half(b);
    }
  } else {  // IQ2: 32 entries of 8 values
    if constexpr (TYPE == IQ2_XXS) {  // per 32 values a word of four index bytes, then a word of signs and s
      const __m512i halves = _mm512_permutexvar_epi32(  // the index words, then the others
          _mm512_set_epi32(15, 13, 11, 9, 7, 5, 3, 1, 14, 12, 10, 8, 6, 4, 2, 0), _mm512_loadu_si512(b + 2));
      index[0] = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(halves));
      const __m256i second = _mm512_extracti64x4_epi64(halves, 1);
      even_sign_bytes(second, out.signs);
      out.scales = top_nibble_scales(second);
    } else if constexpr (TYPE == IQ2_XS) {  // a word an entry: a 9-bit index, 7 sign bits
      const __m512i words = _mm512_loadu_si512(b + 2);
      index[0] = _mm512_and_si512(words, _mm512_set1_epi16(511));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.signs), even_sign_words(_mm512_srli_epi16(words, 9)));
      out.scales = nibble_scales16(b + 66);
    } else {  // IQ2_S: 8-bit indices, their two high bits four to a byte (eight to a word), a sign byte an entry
      const __m512i words = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 66)));
      const __m512i eighth = _mm512_srli_epi16(word_numbers(), 3);
      const __m512i shift = _mm512_set_epi16(14, 12, 10, 8, 6, 4, 2, 0, 14, 12, 10, 8, 6, 4, 2, 0,
                                             14, 12, 10, 8, 6, 4, 2, 0, 14, 12, 10, 8, 6, 4, 2, 0);
      const __m512i high = _mm512_and_si512(_mm512_srlv_epi16(_mm512_permutexvar_epi16(eighth, words), shift), _mm512_set1_epi16(3));
      index[0] = _mm512_or_si512(_mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2))),
                                 _mm512_slli_epi16(high, 8));
      std::memcpy(out.signs, b + 34, 32);
      out.scales = nibble_scales16(b + 74);
    }
    out.a = half(b) / 8;
  }
  grid.entries(index, out.magnitudes);
}

// Whether a type's magnitudes times its S fit a byte (IQ1: 9 * 15): each byte scaled in place, no carry to the next.
template <int64_t TYPE>
inline constexpr bool kScaledMagnitudes = TYPE == IQ1_S || TYPE == IQ1_M;

// Group g of a weight row's IQ blocks decoded, at `block`.
template <int64_t TYPE, typename Grid>
inline void iq_decode_block(const uint8_t* block, const Grid& grid, IqBlock& out) {
  if constexpr (TYPE == IQ1_S || TYPE == IQ1_M) iq1_block<TYPE>(block, grid, out);
  else iq_block<TYPE>(block, grid, out);
}

// The P lanes of a decoded block and ROWS activation rows from `first` over group g (its magnitudes scaled in place
// where `kScaledMagnitudes`).
template <int64_t TYPE, int ROWS>
inline void iq_block_sums(IqBlock& block, const Quantized& x, int64_t first, int64_t g, __m512i (&p)[ROWS]) {
  const __m512i quarter = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  __m512i scales[4];  // lane j of vector k: the scale of sub-block 4 k + j / 4
  for (int k = 0; k < 4; ++k) {
    scales[k] = _mm512_permutexvar_epi32(_mm512_add_epi32(quarter, _mm512_set1_epi32(4 * k)), block.scales);
    // IQ1's magnitudes (at most 9) times S (at most 15) fit a byte: scaled once here, not in every row's sums
    if constexpr (kScaledMagnitudes<TYPE>) block.magnitudes[k] = _mm512_mullo_epi32(block.magnitudes[k], scales[k]);
  }
  __m512i paired[2];  // S of vectors 2 m and 2 m + 1 in each dword's words
  if constexpr (!kScaledMagnitudes<TYPE>)
    for (int m = 0; m < 2; ++m) paired[m] = _mm512_or_si512(scales[2 * m], _mm512_slli_epi32(scales[2 * m + 1], 16));
  for (int r = 0; r < ROWS; ++r) {
    const int8_t* a = x.q.data() + (first + r) * x.cols + g * 256;
    __m512i dots[4];
    p[r] = _mm512_setzero_si512();
    for (int k = 0; k < 4; ++k) {
      __m512i values = _mm512_loadu_si512(a + 64 * k);
      values = _mm512_mask_sub_epi8(values, block.signs[k], _mm512_setzero_si512(), values);
      if constexpr (kScaledMagnitudes<TYPE>) {
        p[r] = _mm512_dpbusd_epi32(p[r], block.magnitudes[k], values);
      } else {
        dots[k] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), block.magnitudes[k], values);
      }
    }
    if constexpr (!kScaledMagnitudes<TYPE>)
      for (int k = 0; k < 4; k += 2) {  // two vectors' sums (at most 4 * 62 * 127) as the words of one, times
        // their S in one vpdpwssd: not two vpmulld and adds (0-5% faster at 1 to 64 rows on a Zen 5)
        const __m512i both = _mm512_mask_blend_epi16(0xAAAAAAAA, dots[k], _mm512_slli_epi32(dots[k + 1], 16));
        p[r] = _mm512_dpwssd_epi32(p[r], both, paired[k / 2]);
      }
  }
}

// The 16 lanes of P folded to 8.
inline __m256i fold_lanes(__m512i p) { return _mm256_add_epi32(_mm512_castsi512_si256(p), _mm512_extracti64x4_epi64(p, 1)); }

// ROWS activation rows from `first` times a unit of HALVES IQ tiles: each block decoded once for them, each weight
// row's P summed, then its float step taken (tiles.h): out[i * x.rows + r]. A block's codebook lookups serve all ROWS
// rows, so a tree's rows cost little more than one.
template <int64_t TYPE, int ROWS, int HALVES>
void iq_tile_dots(const uint8_t* unit, const Quantized& x, int64_t first, float* out) {
  const auto grid = block_grid<TYPE>();
  walk_tile_groups<TileIQ<TYPE>, ROWS, HALVES>(unit, x, first, out, [&](const TileIQ<TYPE>& t, int64_t g,
                                                   __m256 (&acc)[ROWS], __m256 (&)[ROWS], const TileIQ<TYPE>* ahead) {
    __m256i lanes[ROWS][8];
    alignas(32) float a[8];
    for (int i = 0; i < 8; ++i) {
      prefetch_part(ahead, sizeof(TileIQ<TYPE>), i, 8);
      IqBlock block;
      iq_decode_block<TYPE>(t.blocks[i], grid, block);
      __m512i p[ROWS];
      iq_block_sums<TYPE, ROWS>(block, x, first, g, p);
      for (int r = 0; r < ROWS; ++r) lanes[r][i] = fold_lanes(p[r]);
      a[i] = block.a;
    }
    close_iq_tile_group<ROWS>(lanes, a, x, first, g, acc);
  });
}

// ---- A pair of IQ tiles times many activation rows: decoded once, then a GEMM ------------------------------------
// Decoding a block costs about as much as its products with eight activation rows, so a pass over many rows (a
// prompt) decodes a pair's 16 rows once into int8 codes laid out as a Q8_0 pair's (`TileQ8_0`: vector n holds
// values 4 n .. 4 n + 3 of the 16 rows, plus 128), with their S and A: an activation row's four values, broadcast,
// multiply all 16 rows in one vpdpbusd. The 128 sum(a) those products carry is taken back once a group, S times the
// sub-blocks' sums of a in vpdpwssd. Each row's integer P and float step are those of `iq_tile_dots`, so the same
// bits.

// A group of a decoded pair: its codes, S per sub-block (lane i: row i's), S of pairs of sub-blocks as the words
// of each lane (vpdpwssd's operand, with a pair of the activations' int16 sums), A.
struct IqPairGroup {
  __m512i codes[64];
  __m512i scales[16];  // per sub-block of the type's (the first 256 / kIqScaleValues)
  __m512i paired[8];   // the first 128 / kIqScaleValues
  __m512 a;
};

// 16 vectors of 16 dwords transposed: dword j of v[i] to dword i of v[j].
inline void transpose16(__m512i (&v)[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(v[i], v[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(v[i], v[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // v[i + k], 128-bit block b: dword 4 b + k of rows i .. i + 3
    v[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    v[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    v[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    v[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    const __m512i u0 = _mm512_shuffle_i32x4(v[k], v[4 + k], 0x44), u1 = _mm512_shuffle_i32x4(v[k], v[4 + k], 0xEE);
    const __m512i u2 = _mm512_shuffle_i32x4(v[8 + k], v[12 + k], 0x44), u3 = _mm512_shuffle_i32x4(v[8 + k], v[12 + k], 0xEE);
    t[k] = _mm512_shuffle_i32x4(u0, u2, 0x88);
    t[4 + k] = _mm512_shuffle_i32x4(u0, u2, 0xDD);
    t[8 + k] = _mm512_shuffle_i32x4(u1, u3, 0x88);
    t[12 + k] = _mm512_shuffle_i32x4(u1, u3, 0xDD);
  }
  for (int i = 0; i < 16; ++i) v[i] = t[i];
}

// A pair of IQ tiles decoded, a group at a time.
template <int64_t TYPE>
void decode_iq_pair(const uint8_t* pair, int64_t groups, IqPairGroup* out) {
  constexpr int width = kIqScaleValues<TYPE> / 16;  // 16-value sub-blocks a sub-block
  const auto grid = block_grid<TYPE>();
  const auto* tiles = reinterpret_cast<const TileIQ<TYPE>*>(pair);
  for (int64_t g = 0; g < groups; ++g) {
    prefetch(tiles + 2 * (g + 2), 2 * sizeof(TileIQ<TYPE>));
    __m512i codes[4][16], scales[16];
    alignas(64) float a[16];
    for (int i = 0; i < 16; ++i) {
      IqBlock block;
      iq_decode_block<TYPE>(tiles[2 * g + i / 8].blocks[i % 8], grid, block);
      for (int k = 0; k < 4; ++k) {
        const __m512i m = block.magnitudes[k];
        codes[k][i] = _mm512_xor_si512(_mm512_mask_sub_epi8(m, block.signs[k], _mm512_setzero_si512(), m), _mm512_set1_epi8(-128));
      }
      scales[i] = block.scales;
      a[i] = block.a;
    }
    IqPairGroup& group = out[g];
    for (int k = 0; k < 4; ++k) {
      transpose16(codes[k]);
      for (int n = 0; n < 16; ++n) group.codes[16 * k + n] = codes[k][n];
    }
    transpose16(scales);
    for (int j = 0; j < 16 / width; ++j) group.scales[j] = scales[width * j];
    for (int j = 0; j < 8 / width; ++j)
      group.paired[j] = _mm512_or_si512(scales[2 * width * j], _mm512_slli_epi32(scales[2 * width * j + width], 16));
    group.a = _mm512_load_ps(a);
  }
}

// ROWS activation rows from `first` times a decoded pair: out[i * x.rows + r]. Each weight vector serves the ROWS
// rows' chains of vpdpbusd side by side.
template <int64_t TYPE, int ROWS>
void iq_decoded_pair_dots(const IqPairGroup* decoded, const Quantized& x, int64_t first, float* out) {
  constexpr int width = kIqScaleValues<TYPE>, vectors = width / 4;
  const int64_t cols = x.cols, groups = cols / 256;
  const int16_t* sums = width == 16 ? x.sums.data() : x.sums32.data();
  __m512 acc[ROWS];
  for (int r = 0; r < ROWS; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const IqPairGroup& group = decoded[g];
    __m512i p[ROWS], taken[ROWS];  // taken: S times the sub-blocks' sums of a
    for (int r = 0; r < ROWS; ++r) p[r] = taken[r] = _mm512_setzero_si512();
    for (int j = 0; j < 256 / width; ++j) {
      __m512i dot[ROWS];
      for (int r = 0; r < ROWS; ++r) dot[r] = _mm512_setzero_si512();
      for (int k = 0; k < vectors; ++k) {
        const __m512i w = group.codes[vectors * j + k];
        for (int r = 0; r < ROWS; ++r) {
          int32_t four;
          std::memcpy(&four, x.q.data() + (first + r) * cols + g * 256 + width * j + 4 * k, 4);
          dot[r] = _mm512_dpbusd_epi32(dot[r], w, _mm512_set1_epi32(four));
        }
      }
      for (int r = 0; r < ROWS; ++r) p[r] = _mm512_add_epi32(p[r], _mm512_mullo_epi32(dot[r], group.scales[j]));
    }
    for (int j = 0; j < 128 / width; ++j)
      for (int r = 0; r < ROWS; ++r) {
        int32_t two;  // the sums of sub-blocks 2 j and 2 j + 1
        std::memcpy(&two, sums + ((first + r) * cols + g * 256) / width + 2 * j, 4);
        taken[r] = _mm512_dpwssd_epi32(taken[r], group.paired[j], _mm512_set1_epi32(two));
      }
    for (int r = 0; r < ROWS; ++r) {
      const __m512i integer = _mm512_sub_epi32(p[r], _mm512_slli_epi32(taken[r], 7));
      const __m512 da = _mm512_mul_ps(_mm512_set1_ps(x.scale[(first + r) * groups + g]), group.a);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(integer), da, acc[r]);
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, _mm512_add_ps(acc[r], _mm512_setzero_ps()));
    for (int i = 0; i < 16; ++i) out[i * x.rows + first + r] = lanes[i];
  }
}

// Every activation row times a pair of IQ tiles: decoded once from kIqGemmFromRows rows, else block by block.
template <int64_t TYPE>
void iq_pair_dots(const uint8_t* pair, const Quantized& x, float* out) {
  if (x.rows < kIqGemmFromRows)
    return by_eights(x.rows, [&](auto rows, int64_t r) { iq_tile_dots<TYPE, rows(), 2>(pair, x, r, out); });
  thread_local std::vector<IqPairGroup> decoded;
  const int64_t groups = x.cols / 256;
  decoded.resize(groups);
  decode_iq_pair<TYPE>(pair, groups, decoded.data());
  by_eights(x.rows, [&](auto rows, int64_t r) { iq_decoded_pair_dots<TYPE, rows()>(decoded.data(), x, r, out); });
}

}  // namespace gguf
#endif  // GGUF_VNNI
