// The AMX-INT8 kernels (Intel Xeon since Sapphire Rapids): a pair's 16 K-quant weight rows times all the
// activation rows of a pass, 16 at a time, in tiles. tdpbsud multiplies 16 x 64 int8 by 64 x 16 uint8 into 16 x 16
// int32 sums, 16 times a 512-bit vpdpbusd's products, so from a dozen rows on the tiles outrun the 512-bit kernels
// (prefill's 64-row passes and large trees; below, those kernels already keep pace with the memory).
//
// A: 16 activation rows' 64 values, read in place (Quantized pads its rows to sixteens, on 64-byte lines). B: the
// pair's codes of the same values as the 512-bit kernels hold them in a vector (four values of each weight row a
// tile row), so C is [activation row][weight row]. Each sub-block carries a scale per weight row; were its sums
// scaled outside the tiles, each would leave them through memory (a round trip that costs what the products
// save). Instead the scales go into B, split into parts whose products with a code fit a byte
// (`K4GroupTiles`, `K16GroupTiles`), and a group's whole sum builds up in a few C tiles. The sums are integers,
// exact in any order, and the float steps are the 512-bit kernels' own (`K4PairGroup`, `K16PairGroup`): every
// result is bitwise theirs, and the one-row kernels'.
#pragma once

#include "avx512.h"

#ifdef GGUF_AMX
namespace gguf {

constexpr int kAmxRows = 16;  // activation rows a tile holds

// From this many activation rows a pair's rows go through AMX tiles, where the process may use them. Measured on
// the 1.5B's matrices (a Xeon, 2 threads) against the 512-bit kernels: 0.90x their time at 12 rows, 0.84x at 16,
// 0.69x at 64; Q4_K's through tiles from 2 rows took 1.14x at 8 (docs/benchmarks.md).
constexpr int64_t kAmxFromRows = 12;
inline bool through_amx(int64_t rows, Path path) { return path == Path::Best && rows >= kAmxFromRows && amx::ready(); }

// Q4_K's and Q5_K's sub-block scales S (6 bits) split S = 8 hi + lo (3 bits each), so that a code times either
// part fits a byte (31 x 7 = 217): B tiles of codes times hi and codes times lo, for a group's 256 values, give
// the group's whole sum P = sum_j S_j (u . a)_j = 8 C_hi + C_lo in two C tiles, with no sub-block's sums leaving
// the tiles. tdpbsud multiplies signed activations by these unsigned products.
template <typename Tile>  // TileQ4K or TileQ5K
struct K4GroupTiles {
  static constexpr int64_t kAheadGroups = kPrefetchGroups * sizeof(TileQ4K) / sizeof(Tile) / 2;  // as 512 bits
  uint8_t b[2][4][16][64];  // [hi, lo][64 values][tile row: 4 values of each of 16 weight rows]

  // A pair's group's codes times their scales' parts, while the pair's group `ahead` is prefetched; the group's
  // close.
  K4PairGroup fill(const Tile& wa, const Tile& wb, const Tile* ahead) {
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
    return {ta, tb};
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

// The k16 tiles' sub-block scales are signed (Q6_K, Q3_K) and their codes up to 6 bits, so a code times a scale
// needs two bytes. The scales go in unsigned, S + 128 = sum_t 4^t s_t in base 4 (a code times a digit: at most 63 x
// 3 = 189, a byte), and P = sum_j S_j (u . a)_j = sum_t 4^t C_t - 128 C_u from five C tiles: four of the digits' B
// tiles and one of the bare codes.
template <typename Tile>
struct K16GroupTiles {
  static constexpr int64_t kAheadGroups = kPrefetchGroups / 2;  // as 512 bits
  uint8_t b[5][4][16][64];  // [digit 0-3, the codes][64 values][tile row: 4 values of each of 16 weight rows]

  // A pair's group's codes times the digits of their scales, while the pair's group `ahead` is prefetched; the
  // group's close.
  K16PairGroup fill(const Tile& ta, const Tile& tb, const Tile* ahead) {
    const K16PairGroup group(ta, tb);
    for (int j = 0; j < 16; ++j) {
      if (j % 2 == 0) prefetch_part(ahead, 2 * sizeof(Tile), j / 2, 8);
      // each dword a row's digit in both 16-bit halves: one vpmullw multiplies the row's 4 bytes (no carry: < 256)
      const __m512i biased = _mm512_add_epi32(group.scales(j), _mm512_set1_epi32(128));
      const __m512i both = _mm512_or_si512(biased, _mm512_slli_epi32(biased, 16)), three = _mm512_set1_epi16(3);
      const __m512i digits[4] = {_mm512_and_si512(both, three), _mm512_and_si512(_mm512_srli_epi16(both, 2), three),
                                 _mm512_and_si512(_mm512_srli_epi16(both, 4), three), _mm512_srli_epi16(both, 6)};
      __m512i codes[4];
      k16_pair_codes(ta, tb, j, codes);
      for (int k = 0; k < 4; ++k) {
        const int row = 4 * (j % 4) + k;
        for (int t = 0; t < 4; ++t) _mm512_store_si512(b[t][j / 4][row], _mm512_mullo_epi16(codes[k], digits[t]));
        _mm512_store_si512(b[4][j / 4][row], codes[k]);
      }
    }
    return group;
  }

  // P for 16 activation rows of a group (their values at `a`, rows `stride` apart): p[r] for r < n.
  void products(const int8_t* a, int64_t stride, int64_t n, __m512i* p) const {
    alignas(64) int32_t sums[5][kAmxRows][16];
    _tile_zero(3);
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
    for (int k = 0; k < 4; ++k) {
      _tile_loadd(0, a + 64 * k, stride);
      _tile_loadd(1, b[0][k], 64);
      _tile_dpbsud(3, 0, 1);
      _tile_loadd(2, b[1][k], 64);
      _tile_dpbsud(4, 0, 2);
      _tile_loadd(1, b[2][k], 64);
      _tile_dpbsud(5, 0, 1);
      _tile_loadd(2, b[3][k], 64);
      _tile_dpbsud(6, 0, 2);
      _tile_loadd(1, b[4][k], 64);
      _tile_dpbsud(7, 0, 1);
    }
    _tile_stored(3, sums[0], 64);
    _tile_stored(4, sums[1], 64);
    _tile_stored(5, sums[2], 64);
    _tile_stored(6, sums[3], 64);
    _tile_stored(7, sums[4], 64);
    for (int64_t r = 0; r < n; ++r) {
      __m512i sum = _mm512_load_si512(sums[3][r]);
      for (int t = 2; t >= 0; --t) sum = _mm512_add_epi32(_mm512_slli_epi32(sum, 2), _mm512_load_si512(sums[t][r]));
      p[r] = _mm512_sub_epi32(sum, _mm512_slli_epi32(_mm512_load_si512(sums[4][r]), 7));
    }
  }
};

// A pair of K-quant tiles times every activation row of x, through the B tiles of `GroupTiles`
// (K4GroupTiles<Tile> or K16GroupTiles<Tile>): out[i * x.rows + r] for the 16 weight rows i.
template <typename Tile, typename GroupTiles>
void tile_pair_dots_amx(const uint8_t* pair, const Quantized& x, float* out) {
  const int64_t cols = x.cols, groups = cols / 256, rows = x.rows;
  TORCH_CHECK(rows <= kRowChunk, "a pass takes at most ", kRowChunk, " activation rows");
  const auto* tiles = reinterpret_cast<const Tile*>(pair);
  alignas(64) GroupTiles filled;
  __m512 acc[kRowChunk], offset[kRowChunk];
  __m512i p[kRowChunk];
  for (int64_t r = 0; r < rows; ++r) acc[r] = offset[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const auto close = filled.fill(tiles[2 * g], tiles[2 * g + 1], tiles + 2 * (g + GroupTiles::kAheadGroups));
    for (int64_t first = 0; first < rows; first += kAmxRows)
      filled.products(x.q.data() + first * cols + g * 256, cols, std::min<int64_t>(kAmxRows, rows - first), p + first);
    for (int64_t r = 0; r < rows; ++r) close(x, r, g, p[r], acc[r], offset[r]);
  }
  store_pair_rows(acc, offset, rows, x, 0, out);
}

}  // namespace gguf
#endif  // GGUF_AMX
