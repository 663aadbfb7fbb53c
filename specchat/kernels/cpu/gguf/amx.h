// The AMX-INT8 kernel (Intel Xeon since Sapphire Rapids): a pair's 16 Q4_K or Q5_K weight rows times all the
// activation rows of a pass, 16 at a time, in tiles. tdpbsud multiplies 16 x 64 int8 by 64 x 16 uint8 into 16 x 16
// int32 sums, 16 times a 512-bit vpdpbusd's products, so from a dozen rows on the tiles outrun the 512-bit kernels
// (prefill's 64-row passes and large trees; below, those kernels already keep pace with the memory).
//
// A: 16 activation rows' 64 values, read in place (Quantized pads its rows to sixteens, on 64-byte lines). B: the
// pair's codes of the same values as the 512-bit kernels hold them in a vector (four values of each weight row a
// tile row), so C is [activation row][weight row]. Each sub-block of 32 values carries a 6-bit scale per weight
// row; taken into B (`K4GroupTiles`), a group's whole sum builds up in the tiles. The sums are integers, exact in
// any order, and the float steps are the 512-bit kernels' own (`K4PairGroup`): every result is bitwise theirs, and
// the one-row kernels'. Q6_K has no tile kernel: its int8 scales times 6-bit codes pass a byte, and each 16-value
// sub-block's sums leaving the tiles to be scaled ran barely faster than vpdpbusd (0.87x at 16 rows).
#pragma once

#include "avx512.h"

#ifdef GGUF_AMX
namespace gguf {

constexpr int kAmxRows = 16;  // activation rows a tile holds

// Q4_K's and Q5_K's sub-block scales S (6 bits) split S = 8 hi + lo (3 bits each), so that a code times either
// part fits a byte (31 x 7 = 217): B tiles of codes times hi and codes times lo, for a group's 256 values, give
// the group's whole sum P = sum_j S_j (u . a)_j = 8 C_hi + C_lo in two C tiles, with no sub-block's sums leaving
// the tiles. tdpbsud multiplies signed activations by these unsigned products.
struct K4GroupTiles {
  uint8_t b[2][4][16][64];  // [hi, lo][64 values][tile row: 4 values of each of 16 weight rows]

  // A pair's group's codes times their scales' parts, while the pair's group `ahead` is prefetched.
  template <typename Tile>
  void fill(const Tile& wa, const Tile& wb, const Tile* ahead) {
    const TileQ4K &ta = k4_part(wa), &tb = k4_part(wb);
    for (int j = 0; j < 8; ++j) {
      prefetch_part(ahead, 2 * sizeof(Tile), j, 8);
      // each dword a row's part in both 16-bit halves: one vpmullw multiplies the row's 4 bytes (no carry: < 256)
      const __m512i scales = k4_pair_scales(ta, tb, j), both = _mm512_or_si512(scales, _mm512_slli_epi32(scales, 16));
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(both, 3), _mm512_set1_epi16(7));
      const __m512i lo = _mm512_and_si512(both, _mm512_set1_epi16(7));
      for (int v = 0; v < 4; ++v) {
        __m512i low, high;
        k4_pair_codes(wa, wb, j, v, low, high);
        const int row = 8 * (j % 2) + 2 * v;
        _mm512_store_si512(b[0][j / 2][row], _mm512_mullo_epi16(low, hi));
        _mm512_store_si512(b[0][j / 2][row + 1], _mm512_mullo_epi16(high, hi));
        _mm512_store_si512(b[1][j / 2][row], _mm512_mullo_epi16(low, lo));
        _mm512_store_si512(b[1][j / 2][row + 1], _mm512_mullo_epi16(high, lo));
      }
    }
  }

  // P for 16 activation rows of a group (their values at `a`, rows `stride` apart): p[r] for r < n.
  void products(const int8_t* a, int64_t stride, int64_t n, __m512i* p) const {
    alignas(64) int32_t sums[2][kAmxRows][16];
    _tile_zero(3);
    _tile_zero(4);
    for (int k = 0; k < 4; ++k) {
      _tile_loadd(0, a + 64 * k, stride);
      _tile_loadd(1, b[0][k], 64);
      _tile_loadd(2, b[1][k], 64);
      _tile_dpbsud(3, 0, 1);
      _tile_dpbsud(4, 0, 2);
    }
    _tile_stored(3, sums[0], 64);
    _tile_stored(4, sums[1], 64);
    for (int64_t r = 0; r < n; ++r)
      p[r] = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(sums[0][r]), 3), _mm512_load_si512(sums[1][r]));
  }
};

// A pair of Q4_K or Q5_K tiles times every activation row of x: out[i * x.rows + r] for the 16 weight rows i.
template <typename Tile>
void tile_pair_dots_amx(const uint8_t* pair, const Quantized& x, float* out) {
  const int64_t cols = x.cols, groups = cols / 256, rows = x.rows;
  TORCH_CHECK(rows <= kRowChunk, "a pass takes at most ", kRowChunk, " activation rows");
  const auto* tiles = reinterpret_cast<const Tile*>(pair);
  alignas(64) K4GroupTiles group;
  __m512 acc[kRowChunk], offset[kRowChunk];
  __m512i p[kRowChunk];
  for (int64_t r = 0; r < rows; ++r) acc[r] = offset[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const Tile &wa = tiles[2 * g], &wb = tiles[2 * g + 1];
    group.fill(wa, wb, tiles + 2 * (g + kPrefetchGroups * sizeof(TileQ4K) / sizeof(Tile) / 2));
    for (int64_t first = 0; first < rows; first += kAmxRows)
      group.products(x.q.data() + first * cols + g * 256, cols, std::min<int64_t>(kAmxRows, rows - first), p + first);
    const K4PairGroup close(k4_part(wa), k4_part(wb));
    for (int64_t r = 0; r < rows; ++r) close(x, r, g, p[r], acc[r], offset[r]);
  }
  store_pair_rows(acc, offset, rows, x, 0, out);
}

}  // namespace gguf
#endif  // GGUF_AMX
