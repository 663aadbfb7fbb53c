// Attention's two products on a bf16 cache in AMX tiles (AMX-BF16's tdpbf16ps), where the CPU has them (Intel
// Xeon since Sapphire Rapids): one instruction multiplies 16 x 32 bf16 by 32 x 16 bf16 into 16 x 16 fp32 sums,
// some thirty times what a vdpbf16ps computes in the same time, so the attention of a tree's rows costs about
// what one row's does: reading the cache.
//
// Scores: 16 keys as they lie in the cache (A: a key a row, 32 of its dims a step) times the queries as dword
// pairs (B: [dim pair][query]) into [key][query], summed over a key's dims 32 at a time. Value sums: the softmax
// weights (A: [query][32 keys]) times the value rows interleaved in pairs as bf16_dots::interleave lays them (B:
// [key pair][16 dims]) into [query][dim], 32 keys a step in the order of the query's key sequence. A sum's bits
// depend on its own key, query or weight row and value column alone, never on a tile's other rows, so a tree
// row gets bitwise the decode step at its position when its steps start where the decode step's do (at
// multiples of 32 of the sequence) and are padded alike (zero weights on zero rows). tdpbf16ps rounds as the
// hardware does (bf16 denormals read as zero, fp32 denormals flushed, round to nearest even, its own order
// within a step): other bits than the vdpbf16ps path's, as accurate.
//
// The tiles are lent and configured as amx_tiles.h says.

#pragma once

#include "amx_tiles.h"

#include <cstdint>
#include <cstring>

#if defined(AMX_TILES) && defined(__AMX_BF16__)
#define BF16_TILES 1
#endif

namespace bf16_tiles {

constexpr int ROWS = 16;  // a tile's rows: keys (scores) or queries (value sums)
constexpr int STEP = 32;  // a step's keys (value sums) or dims (scores): one tile row of bf16

#ifdef BF16_TILES

// The queries (bf16 [n][DIM], n <= 16) as the scores' B tiles, one a step of 32 dims: pairs[p][j] holds query j's
// dims 2p and 2p + 1 in one dword (zero for j >= n), p = 16 s + r for step s and tile row r.
template <int DIM>
inline void query_pairs(const uint16_t* queries, int n, uint32_t* pairs) {
  std::memset(pairs, 0, sizeof(uint32_t) * DIM / 2 * ROWS);
  for (int j = 0; j < n; ++j) {
    uint32_t query[DIM / 2];
    std::memcpy(query, queries + j * DIM, sizeof(query));
    for (int p = 0; p < DIM / 2; ++p) pairs[p * ROWS + j] = query[p];
  }
}

// scores[i][j] = key i . query j for 16 keys (`stride` bf16 apart from `keys`) and the 16 queries of `pairs`
// (query_pairs), summed a step of 32 dims at a time.
template <int DIM>
inline void score_tile(const uint32_t* pairs, const uint16_t* keys, int64_t stride, float* scores) {
  _tile_zero(0);
  for (int s = 0; s < DIM / STEP; s += 2) {  // steps alternate between two pairs of tiles: loads overlap products
    _tile_loadd(1, keys + STEP * s, stride * 2);
    _tile_loadd(2, pairs + s * ROWS * ROWS, ROWS * 4);
    _tile_dpbf16ps(0, 1, 2);
    _tile_loadd(3, keys + STEP * (s + 1), stride * 2);
    _tile_loadd(4, pairs + (s + 1) * ROWS * ROWS, ROWS * 4);
    _tile_dpbf16ps(0, 3, 4);
  }
  _tile_stored(0, scores, ROWS * 4);
}

// acc[m][d] += weights[m][k] * values[k][d] for 16 queries m (weight rows `stride` bf16 apart, zero past a
// query's keys) and the 32 `steps` keys k of `pairs` (value rows interleaved in pairs, [16 steps][DIM] dwords),
// one step of 32 keys after another; acc [16][DIM] fp32.
template <int DIM>
inline void add_value_tiles(const uint16_t* weights, int64_t stride, const uint32_t* pairs, int steps, float* acc) {
  static_assert(DIM % 64 == 0, "a pass sums 64 dims in four tiles");
  for (int h = 0; h < DIM; h += 64) {
    _tile_loadd(0, acc + h, DIM * 4);
    _tile_loadd(1, acc + h + 16, DIM * 4);
    _tile_loadd(2, acc + h + 32, DIM * 4);
    _tile_loadd(3, acc + h + 48, DIM * 4);
    for (int s = 0; s < steps; ++s) {
      const uint32_t* step = pairs + s * ROWS * DIM + h;
      _tile_loadd(4, weights + STEP * s, stride * 2);
      _tile_loadd(5, step, DIM * 4);
      _tile_dpbf16ps(0, 4, 5);
      _tile_loadd(6, step + 16, DIM * 4);
      _tile_dpbf16ps(1, 4, 6);
      _tile_loadd(7, step + 32, DIM * 4);
      _tile_dpbf16ps(2, 4, 7);
      _tile_loadd(5, step + 48, DIM * 4);
      _tile_dpbf16ps(3, 4, 5);
    }
    _tile_stored(0, acc + h, DIM * 4);
    _tile_stored(1, acc + h + 16, DIM * 4);
    _tile_stored(2, acc + h + 32, DIM * 4);
    _tile_stored(3, acc + h + 48, DIM * 4);
  }
}

// out[j][i] = in[i][j] * scale for the first `n` rows j of out (`stride` apart), `filled` of each row's 16 stored.
inline void transpose16(const float* in, int n, int filled, float scale, float* out, int64_t stride) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(in + 16 * i);
  for (int i = 0; i < 16; i += 2) {  // 2 x 2 blocks of singles, then of pairs, then 4 x 4 lanes, then 8 x 8
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    for (int k = 0; k < 2; ++k) {
      r[i + k] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + k]), _mm512_castps_pd(t[i + k + 2])));
      r[i + k + 2] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + k]), _mm512_castps_pd(t[i + k + 2])));
    }
  }
  for (int i = 0; i < 16; i += 8) {
    for (int k = 0; k < 4; ++k) {
      t[i + k] = _mm512_shuffle_f32x4(r[i + k], r[i + k + 4], 0x88);
      t[i + k + 4] = _mm512_shuffle_f32x4(r[i + k], r[i + k + 4], 0xdd);
    }
  }
  for (int k = 0; k < 8; ++k) {
    r[k] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0x88);
    r[k + 8] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0xdd);
  }
  // r[k] now holds column `column[k]` of `in`
  static constexpr int column[16] = {0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15};
  const __mmask16 mask = static_cast<__mmask16>((1u << filled) - 1);
  const __m512 factor = _mm512_set1_ps(scale);
  for (int k = 0; k < 16; ++k) {
    if (column[k] < n) _mm512_mask_storeu_ps(out + column[k] * stride, mask, _mm512_mul_ps(r[k], factor));
  }
}

#endif

}  // namespace bf16_tiles
