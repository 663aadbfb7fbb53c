// Block-quantized matrices repacked at load in tiles of eight rows: per group of values, the eight rows' codes
// interleaved so that one 32-byte vector holds a few values of each row, and those values of an activation row,
// broadcast, multiply all eight rows at once; each weight row's sum ends in a lane of its own. A tile's bytes are
// its rows' blocks rearranged (Q4_K's and Q5_K's scales unpacked besides). A pair is two 8-row tiles whose groups
// alternate, read as one stream. Here: each tile's layout, its repacking, and its rows back in the integer form
// (`dequantize_rows`); the kernels that read them are per ISA (portable.h, avx2.h, avx512.h).
#pragma once

#include "unpack.h"

#include <ATen/Parallel.h>
#include <ATen/ops/from_blob.h>

#include <cstdlib>

#ifdef __linux__
#include <sys/mman.h>
#endif

namespace gguf {

// A uint8 tensor [rows, cols], its bytes left for the caller to write, in memory that asks for 2 MB pages (Linux,
// `madvise`): every decode step streams the whole model, and in 4 KB pages each 4 KB of weights is a TLB miss of
// its own. A matrix under 2 MB takes ordinary pages: rounded up to whole 2 MB pages, the 1.5B's small matrices
// held 142 MB more.
inline at::Tensor huge_page_bytes(int64_t rows, int64_t cols) {
  constexpr size_t kHuge = size_t{2} << 20, kLine = 64;
  const size_t bytes = static_cast<size_t>(rows * cols), align = bytes < kHuge ? kLine : kHuge;
  const size_t size = std::max((bytes + align - 1) / align * align, align);
  void* memory = std::aligned_alloc(align, size);
  TORCH_CHECK(memory, "out of memory for ", bytes, " bytes of tiles");
#ifdef __linux__
  if (align == kHuge) madvise(memory, size, MADV_HUGEPAGE);
#endif
  return at::from_blob(memory, {rows, cols}, [](void* p) { std::free(p); }, at::TensorOptions().dtype(at::kByte));
}

// The fills below move codes four bytes at a time, as 32-bit words: masks and shifts that stay within each byte
// (a nibble, a 2-bit pair) rearrange four values in one operation, in either byte order.
inline uint32_t load_word(const uint8_t* p) {
  uint32_t word;
  std::memcpy(&word, p, 4);
  return word;
}
inline void store_word(uint8_t* p, uint32_t word) { std::memcpy(p, &word, 4); }
constexpr uint32_t kLowNibbles = 0x0F0F0F0Fu;

// Four bytes of a tile row from two words of nibbles: byte c holds `first`'s byte c's low (or high) nibble in its low
// nibble and `second`'s in its high one.
inline uint32_t low_nibbles(uint32_t first, uint32_t second) { return (first & kLowNibbles) | (second & kLowNibbles) << 4; }
inline uint32_t high_nibbles(uint32_t first, uint32_t second) { return (first >> 4 & kLowNibbles) | (second & ~kLowNibbles); }

// 16 bytes of nibbles (values 0-15 low, 16-31 high: legacy and IQ4_XS blocks) into the four 32-byte vectors of a
// tile group's row, `out` its first: byte c of vector p holds values 8p + c (low nibble) and 8p + 4 + c (high).
inline void interleave_nibbles_32(const uint8_t* q, uint8_t* out) {
  for (int p = 0; p < 2; ++p) {
    const uint32_t first = load_word(q + 8 * p), second = load_word(q + 8 * p + 4);
    store_word(out + 32 * p, low_nibbles(first, second));
    store_word(out + 32 * (p + 2), high_nibbles(first, second));
  }
}

// Blocks [rows, groups * block_bytes] (groups of VALUES values) -> units of `per_unit` 8-row tiles [rows / (8
// per_unit), groups * per_unit * sizeof(Tile)], each tile group zeroed, then `fill(tile_group, i, block)` for each
// of its 8 rows i: the repacking every tile shares. The threads that fill the memory are the first to touch it (a serial pass zeroing 1 GB
// first took a third of a 1.5B's load). In a pair (per_unit 2) the two tiles' groups alternate: group g of the first
// tile, of the second, then group g + 1 of each, so the pair is read as one stream.
template <typename Tile, int64_t VALUES = 256, typename Fill>
inline at::Tensor repack_tiles(const at::Tensor& blocks, int64_t cols, int64_t block_bytes, int64_t per_unit, Fill fill) {
  const int64_t unit_rows = kTileRows * per_unit;
  TORCH_CHECK(blocks.dim() == 2 && blocks.size(0) % unit_rows == 0, "tiles of ", unit_rows, " take rows in ", unit_rows, "s");
  const int64_t tiles = blocks.size(0) / kTileRows, groups = cols / VALUES, row_bytes = groups * block_bytes;
  TORCH_CHECK(blocks.size(1) == row_bytes, "blocks do not fit the type");
  const at::Tensor in = blocks.contiguous();
  at::Tensor out = huge_page_bytes(tiles / per_unit, groups * per_unit * static_cast<int64_t>(sizeof(Tile)));
  const uint8_t* src = in.data_ptr<uint8_t>();
  auto* dst = reinterpret_cast<Tile*>(out.data_ptr<uint8_t>());
  at::parallel_for(0, tiles * groups, 64, [&](int64_t begin, int64_t end) {
    for (int64_t index = begin; index < end; ++index) {
      const int64_t tile = index / groups, g = index % groups;
      Tile& group = dst[(tile / per_unit * groups + g) * per_unit + tile % per_unit];
      std::memset(&group, 0, sizeof(Tile));
      for (int i = 0; i < 8; ++i) fill(group, i, src + (tile * kTileRows + i) * row_bytes + g * block_bytes);
    }
  });
  return out;
}

// ---- Q4_K in tiles of eight rows ---------------------------------------------------------------------------
//
// At load a Q4_K matrix whose rows come in eights is repacked (`tile_q4_k`): per group of 256 values, its eight
// rows' codes interleaved four values at a time, so that one 32-byte vector holds 4 values of each of the 8
// rows, and 4 values of an activation row, broadcast, multiply all 8 rows at once. On AVX2 a sub-block's 8 such
// products sum in int16 (|sum| <= 8 * 2 * 15 * 127 < 2^15) before its scale's one multiply-add: 9 integer
// multiplies per 256 products where the row-at-a-time kernel takes 16; with AVX-512 VNNI they sum into int32
// lanes four at a time. Either way each weight row's sum ends in a lane of its own.
// Per weight row i, activation row r and group g:
//   P = sum_j S[i][j] (u . a)_j,  Q = sum_j M[i][j] sum(a)_j        (integers: exact in any order)
//   acc = fma(float(P), D[g] * d[i], acc),  offset = fma(float(Q), D[g] * (0 - dmin[i]), offset)
// and the result is acc + offset, in every path alike.

struct TileQ4K {  // one group of 256 values of 8 rows
  // sub-block j: 4 vectors of 32 bytes; byte 4i + c of vector p holds row i's code of value 8p + c (low
  // nibble) and of value 8p + 4 + c (high nibble)
  uint8_t codes[8][128];
  uint8_t scales[8][8];  // [sub-block][row]
  uint8_t mins[4][16];   // [pair of sub-blocks][row][which of the pair]
  uint16_t d[8], dmin[8];  // fp16, per row
};
static_assert(sizeof(TileQ4K) == 8 * 148, "a tile group is its 8 rows' 148 bytes");

// Q5_K in the same tiles, its fifth bits beside them a byte per code lane, as a legacy Q5_0 tile's: bit 2p + h of
// fifth[j][4i + c] is row i's for value 8p + 4h + c of sub-block j (the code of byte 4i + c's low (h 0) or high
// (h 1) nibble in vector p).
struct TileQ5K {
  TileQ4K k4;
  uint8_t fifth[8][32];
};
static_assert(sizeof(TileQ5K) == 8 * 180, "a Q5_K tile group is its 8 rows' 176 bytes and their scales unpacked");

inline const TileQ4K& k4_part(const TileQ4K& t) { return t; }
inline const TileQ4K& k4_part(const TileQ5K& t) { return t.k4; }

// Row i of a tile from a Q4_K or Q5_K block `b` whose nibbles are at `qs`.
inline void fill_k4_tile(TileQ4K& t, int i, const uint8_t* b, const uint8_t* qs) {
    std::memcpy(&t.d[i], b, 2);
    std::memcpy(&t.dmin[i], b + 2, 2);
    uint8_t scales[16];
    scales_mins_k4(b + 4, scales);
    for (int j = 0; j < 8; ++j) {
      t.scales[j][i] = scales[j];
      t.mins[j / 2][2 * i + j % 2] = scales[8 + j];
    }
    // sub-blocks 2k and 2k + 1 are the low and the high nibbles of bytes 32k .. 32k + 31
    for (int k = 0; k < 4; ++k)
      for (int p = 0; p < 4; ++p) {
        const uint32_t first = load_word(qs + 32 * k + 8 * p), second = load_word(qs + 32 * k + 8 * p + 4);
        store_word(t.codes[2 * k] + 32 * p + 4 * i, low_nibbles(first, second));
        store_word(t.codes[2 * k + 1] + 32 * p + 4 * i, high_nibbles(first, second));
      }
}

// Q4_K blocks [rows, groups * 144] -> units of `per_unit` tiles (`repack_tiles`).
inline at::Tensor tile_q4_k(const at::Tensor& blocks, int64_t cols, int64_t per_unit) {
  return repack_tiles<TileQ4K>(blocks, cols, 144, per_unit,
                               [](TileQ4K& t, int i, const uint8_t* b) { fill_k4_tile(t, i, b, b + 16); });
}

// Q5_K blocks [rows, groups * 176] -> units of `per_unit` tiles: the Q4_K tile of their nibbles, and value v's fifth
// bit, bit v / 32 of byte v % 32 of the block's 32 high-bit bytes, moved to where the tile's code of v lies.
inline at::Tensor tile_q5_k(const at::Tensor& blocks, int64_t cols, int64_t per_unit) {
  return repack_tiles<TileQ5K>(blocks, cols, 176, per_unit, [](TileQ5K& t, int i, const uint8_t* b) {
    fill_k4_tile(t.k4, i, b, b + 48);
    // word 2p + h: the bytes whose bit j is sub-block j's fifth bit of byte 4i + c's nibble h in vector p
    uint32_t high[8];
    for (int w = 0; w < 8; ++w) high[w] = load_word(b + 16 + 4 * w);
    for (int j = 0; j < 8; ++j) {
      uint32_t fifth = 0;
      for (int w = 0; w < 8; ++w) fifth |= (high[w] >> j & 0x01010101u) << w;
      store_word(t.fifth[j] + 4 * i, fifth);
    }
  });
}


// Row i's fifth bit (0 or 16) for value 8p + 4h + c of sub-block j: none in a Q4_K tile.
inline int fifth_of(const TileQ4K&, int, int, int, int, int) { return 0; }
inline int fifth_of(const TileQ5K& t, int j, int p, int h, int i, int c) { return ((t.fifth[j][4 * i + c] >> (2 * p + h)) & 1) << 4; }

// Row i of a Q4_K or Q5_K tile in the integer form (`dequantize_rows`); its groups `stride` groups apart (2 in a
// pair).
template <typename Tile>
inline void unpack_tile_row(const uint8_t* tile, int64_t i, int64_t cols, int64_t stride, Unpacked& u) {
  const int64_t groups = cols / 256;
  u.resize(cols, groups);
  for (int64_t g = 0; g < groups; ++g) {
    const Tile& whole = reinterpret_cast<const Tile*>(tile)[g * stride];
    const TileQ4K& t = k4_part(whole);
    for (int j = 0; j < 8; ++j) {
      for (int p = 0; p < 4; ++p)
        for (int c = 0; c < 4; ++c) {
          const uint8_t byte = t.codes[j][32 * p + 4 * i + c];
          u.codes[g * 256 + 32 * j + 8 * p + c] = (byte & 15) + fifth_of(whole, j, p, 0, i, c);
          u.codes[g * 256 + 32 * j + 8 * p + 4 + c] = (byte >> 4) + fifth_of(whole, j, p, 1, i, c);
        }
      set_sub(u, g * 16 + 2 * j, t.scales[j][i], t.mins[j / 2][2 * i + j % 2]);
      set_sub(u, g * 16 + 2 * j + 1, t.scales[j][i], t.mins[j / 2][2 * i + j % 2]);
    }
    u.a[g] = half(reinterpret_cast<const uint8_t*>(&t.d[i]));
    u.b[g] = -half(reinterpret_cast<const uint8_t*>(&t.dmin[i]));
  }
}

// ---- Q6_K, Q3_K and Q2_K in tiles of eight rows --------------------------------------------------------------
//
// The same idea for the K-quants of 16-value sub-blocks, each with an integer scale S: w = d S u + B M, Q6_K's
// codes 6 bits and centred on C = 32 (M = S, B = -C d: the 1.5B's output head and half its down projections),
// Q3_K's 3 bits with C = 4 (S its 6-bit scale less 32), Q2_K's 2 bits with a 4-bit min M of their own and B =
// -dmin. Per group of 256 values and sub-block j of 16, one 32-byte vector per quarter of the sub-block holds 4
// values of each of the 8 rows, so 4 activation values, broadcast, multiply all 8 rows at once. Per weight row i,
// activation row r and group g:
//   P = sum_j S[i][j] (u . a)_j,  Q = sum_j M[i][j] sum(a)_j        (integers: exact in any order)
//   acc = fma(float(P), D[g] * d[i], acc),  offset = fma(float(Q), D[g] * B[i], offset)
// and the result is acc + offset, in every path alike. The kernels of all three ("k16") differ only in how a
// quarter's codes and a sub-block's S and M are read (`k16_tile_code`, `k16_scale`, `k16_min` and their vector
// forms) and in B (`k16_offset_factor`).

struct TileQ6K {  // one group of 256 values of 8 rows: the 8 rows' 210 bytes rearranged
  static constexpr int kCentre = 32, kLargestCode = 63;
  static constexpr bool kMins = false;
  // sub-block j: byte 4i + c of low[j][32p .. 32p + 31] holds the low 4 bits of row i's value 4p + c (low
  // nibble) and of its value 8 + 4p + c (high nibble); byte 4i + c of high[j] the top 2 bits of its values
  // c, 4 + c, 8 + c, 12 + c (bits 0-1, 2-3, 4-5, 6-7)
  uint8_t low[16][64];
  uint8_t high[16][32];
  int8_t scales[8][16];  // [pair of sub-blocks][row][which of the pair]
  uint16_t d[8];         // fp16, per row
};
static_assert(sizeof(TileQ6K) == 8 * 210, "a Q6_K tile group is its 8 rows' 210 bytes");

struct TileQ3K {  // one group of 256 values of 8 rows: their 110 bytes, the scales unpacked to a byte each
  static constexpr int kCentre = 4, kLargestCode = 7;
  static constexpr bool kMins = false;
  // sub-block j: byte 4i + c of low[j] holds the low 2 bits of row i's values c, 4 + c, 8 + c, 12 + c (bits 0-1,
  // 2-3, 4-5, 6-7); byte 4i + c of high[j / 2] their third bits (bits 0-3 for an even j, 4-7 for an odd one)
  uint8_t low[16][32];
  uint8_t high[8][32];
  int8_t scales[8][16];  // S - 32: [pair of sub-blocks][row][which of the pair]
  uint16_t d[8];         // fp16, per row
};
static_assert(sizeof(TileQ3K) == 8 * 114, "a Q3_K tile group is its 8 rows' 110 bytes and 4 of unpacked scales");

struct TileQ2K {  // one group of 256 values of 8 rows: the 8 rows' 84 bytes rearranged
  static constexpr int kLargestCode = 3;
  static constexpr bool kMins = true;
  uint8_t low[16][32];     // as TileQ3K's
  uint8_t scales[8][16];   // [pair of sub-blocks][row][which of the pair]: S in the low nibble, M in the high one
  uint16_t d[8], dmin[8];  // fp16, per row
};
static_assert(sizeof(TileQ2K) == 8 * 84, "a Q2_K tile group is its 8 rows' 84 bytes");

// Row i's code of value v (0..15) of sub-block j.
inline int k16_tile_code(const TileQ6K& t, int j, int i, int v) {
  const int quarter = v / 4, c = v % 4;
  const int low = (t.low[j][32 * (quarter % 2) + 4 * i + c] >> (4 * (quarter / 2))) & 15;
  return low | (((t.high[j][4 * i + c] >> (2 * quarter)) & 3) << 4);
}
inline int k16_tile_code(const TileQ3K& t, int j, int i, int v) {
  const int quarter = v / 4, c = v % 4;
  const int low = (t.low[j][4 * i + c] >> (2 * quarter)) & 3;
  return low | (((t.high[j / 2][4 * i + c] >> (4 * (j % 2) + quarter)) & 1) << 2);
}
inline int k16_tile_code(const TileQ2K& t, int j, int i, int v) { return (t.low[j][4 * i + v % 4] >> (v / 4 * 2)) & 3; }

// Row i's S and M of sub-block j, and its B.
template <typename Tile>
inline int k16_scale(const Tile& t, int j, int i) {
  const int s = t.scales[j / 2][2 * i + j % 2];
  return Tile::kMins ? s & 15 : s;
}
template <typename Tile>
inline int k16_min(const Tile& t, int j, int i) {
  return Tile::kMins ? t.scales[j / 2][2 * i + j % 2] >> 4 : k16_scale(t, j, i);
}
template <typename Tile>
inline float k16_offset_factor(const Tile& t, int i) {
  if constexpr (Tile::kMins) return -half(reinterpret_cast<const uint8_t*>(&t.dmin[i]));
  else return -static_cast<float>(Tile::kCentre) * half(reinterpret_cast<const uint8_t*>(&t.d[i]));
}

// Sub-block j's 2-bit codes (Q2_K's, Q3_K's low bits) from the block's 64 bytes of pairs `q` (`two_bits_256`) as the
// word a tile row holds: byte c the values c, 4 + c, 8 + c, 12 + c (bits 0-1, 2-3, 4-5, 6-7).
inline uint32_t pairs_word(const uint8_t* q, int j) {
  const uint8_t* bytes = q + 32 * (j / 8) + 16 * (j % 2);
  const int shift = 2 * (j % 8 / 2);
  uint32_t word = 0;
  for (int quarter = 0; quarter < 4; ++quarter)
    word |= (load_word(bytes + 4 * quarter) >> shift & 0x03030303u) << (2 * quarter);
  return word;
}

// Q6_K blocks [rows, groups * 210] -> units of `per_unit` tiles (`repack_tiles`).
inline at::Tensor tile_q6_k(const at::Tensor& blocks, int64_t cols, int64_t per_unit) {
  return repack_tiles<TileQ6K>(blocks, cols, 210, per_unit, [](TileQ6K& t, int i, const uint8_t* b) {
    std::memcpy(&t.d[i], b + 208, 2);
    for (int j = 0; j < 16; ++j) {
      t.scales[j / 2][2 * i + j % 2] = static_cast<int8_t>(b[192 + j]);
      // sub-block j: values 16 (j % 2) .. + 15 of the 32 in part (j % 8) / 2 of half j / 8 (`six_bits_128`), their
      // low 4 bits a nibble of `low`'s bytes, their top 2 bits a pair of `high`'s
      const int half = j / 8, part = j % 8 / 2, first = 16 * (j % 2);
      const uint8_t* low = b + 64 * half + 32 * (part % 2) + first;
      const uint8_t* high = b + 128 + 32 * half + first;
      uint32_t lows[4], highs = 0;
      for (int quarter = 0; quarter < 4; ++quarter) {  // values 4 quarter .. 4 quarter + 3 of the sub-block
        lows[quarter] = load_word(low + 4 * quarter) >> (4 * (part / 2)) & kLowNibbles;
        highs |= (load_word(high + 4 * quarter) >> (2 * part) & 0x03030303u) << (2 * quarter);
      }
      store_word(t.low[j] + 4 * i, lows[0] | lows[2] << 4);
      store_word(t.low[j] + 32 + 4 * i, lows[1] | lows[3] << 4);
      store_word(t.high[j] + 4 * i, highs);
    }
  });
}

// Q3_K blocks [rows, groups * 110] -> units of `per_unit` tiles (`repack_tiles`).
inline at::Tensor tile_q3_k(const at::Tensor& blocks, int64_t cols, int64_t per_unit) {
  return repack_tiles<TileQ3K>(blocks, cols, 110, per_unit, [](TileQ3K& t, int i, const uint8_t* b) {
    alignas(32) uint8_t scales[16];
    scales_k3(b + 96, scales);
    std::memcpy(&t.d[i], b + 108, 2);
    for (int j = 0; j < 16; ++j) {
      t.scales[j / 2][2 * i + j % 2] = static_cast<int8_t>(scales[j] - 32);
      store_word(t.low[j] + 4 * i, pairs_word(b + 32, j));
      // third bits (`three_bits_256`): bit 4 (j / 8) + j % 8 / 2 of the mask's bytes 16 (j % 2) .. + 15
      const uint8_t* mask = b + 16 * (j % 2);
      uint32_t third = 0;
      for (int quarter = 0; quarter < 4; ++quarter)
        third |= (load_word(mask + 4 * quarter) >> (4 * (j / 8) + j % 8 / 2) & 0x01010101u) << (4 * (j % 2) + quarter);
      store_word(t.high[j / 2] + 4 * i, load_word(t.high[j / 2] + 4 * i) | third);
    }
  });
}

// Q2_K blocks [rows, groups * 84] -> units of `per_unit` tiles (`repack_tiles`).
inline at::Tensor tile_q2_k(const at::Tensor& blocks, int64_t cols, int64_t per_unit) {
  return repack_tiles<TileQ2K>(blocks, cols, 84, per_unit, [](TileQ2K& t, int i, const uint8_t* b) {
    std::memcpy(&t.d[i], b + 80, 2);
    std::memcpy(&t.dmin[i], b + 82, 2);
    for (int j = 0; j < 16; ++j) {
      t.scales[j / 2][2 * i + j % 2] = b[j];
      store_word(t.low[j] + 4 * i, pairs_word(b + 16, j));
    }
  });
}

// Row i of a Q6_K, Q3_K or Q2_K tile in the integer form (`dequantize_rows`); its groups `stride` groups apart.
template <typename Tile>
inline void unpack_k16_tile_row(const uint8_t* tile, int64_t i, int64_t cols, int64_t stride, Unpacked& u) {
  const int64_t groups = cols / 256;
  u.resize(cols, groups);
  for (int64_t g = 0; g < groups; ++g) {
    const Tile& t = reinterpret_cast<const Tile*>(tile)[g * stride];
    for (int j = 0; j < 16; ++j) {
      for (int v = 0; v < 16; ++v) u.codes[g * 256 + 16 * j + v] = static_cast<uint8_t>(k16_tile_code(t, j, i, v));
      set_sub(u, g * 16 + j, k16_scale(t, j, i), k16_min(t, j, i));
    }
    u.a[g] = half(reinterpret_cast<const uint8_t*>(&t.d[i]));
    u.b[g] = k16_offset_factor(t, i);
  }
}

// ---- IQ4_XS in tiles of eight rows --------------------------------------------------------------------------
//
// Q4_K's tiles for llama.cpp's non-linear 4-bit type: per group of 256 values, eight 32-value sub-blocks with a
// signed scale S each, and codes that stand for the table's int8 values v(u) (`kIq4Values`); no min. The tile
// holds the codes as Q4_K's holds its nibbles, the kernels look their values up (vpshufb). Per weight row i,
// activation row r and group g:
//   P = sum_j S[i][j] (v(u) . a)_j                                   (integers: exact in any order)
//   acc = fma(float(P), D[g] * d[i], acc)
// and the result is acc + 0, in every path alike.

struct TileIQ4XS {  // one group of 256 values of 8 rows: their 136 bytes, the scales unpacked to a byte each
  uint8_t codes[8][128];  // as TileQ4K's
  int8_t scales[8][8];    // S: [sub-block][row]
  uint16_t d[8];          // fp16, per row
};
static_assert(sizeof(TileIQ4XS) == 8 * 138, "an IQ4_XS tile group is its 8 rows' 136 bytes and 2 of unpacked scales");

// Row i's code (0..15) of value v (0..31) of sub-block j.
inline int iq4_tile_code(const TileIQ4XS& t, int j, int i, int v) {
  return (t.codes[j][32 * (v / 8) + 4 * i + v % 4] >> (4 * (v % 8 / 4))) & 15;
}

// IQ4_XS blocks [rows, groups * 136] -> units of `per_unit` tiles (`repack_tiles`).
inline at::Tensor tile_iq4_xs(const at::Tensor& blocks, int64_t cols, int64_t per_unit) {
  return repack_tiles<TileIQ4XS>(blocks, cols, 136, per_unit, [](TileIQ4XS& t, int i, const uint8_t* b) {
    std::memcpy(&t.d[i], b, 2);
    for (int j = 0; j < 8; ++j) {
      t.scales[j][i] = static_cast<int8_t>(scale_iq4_xs(b, j));
      interleave_nibbles_32(b + 8 + 16 * j, t.codes[j] + 4 * i);
    }
  });
}

// Row i of an IQ4_XS tile in the integer form (`dequantize_rows`); its groups `stride` groups apart.
inline void unpack_iq4_tile_row(const uint8_t* tile, int64_t i, int64_t cols, int64_t stride, Unpacked& u) {
  const int64_t groups = cols / 256;
  u.resize(cols, groups);
  for (int64_t g = 0; g < groups; ++g) {
    const TileIQ4XS& t = reinterpret_cast<const TileIQ4XS*>(tile)[g * stride];
    for (int j = 0; j < 8; ++j) {
      for (int v = 0; v < 32; ++v)
        u.codes[g * 256 + 32 * j + v] = static_cast<uint8_t>(kIq4Values[iq4_tile_code(t, j, static_cast<int>(i), v)]);
      set_sub(u, g * 16 + 2 * j, t.scales[j][i], 0);
      set_sub(u, g * 16 + 2 * j + 1, t.scales[j][i], 0);
    }
    u.a[g] = half(reinterpret_cast<const uint8_t*>(&t.d[i]));
    u.b[g] = 0.0f;
  }
}

// ---- IQ1_S ... IQ3_S in tiles of eight rows ---------------------------------------------------------------
//
// The codebook types' blocks stay as the file has them, the eight rows' blocks of a group side by side, so that
// a pass over many activation rows can decode a tile's blocks once into int8 codes and multiply them as a GEMM
// (avx512.h) and a decode step still reads the file's bytes. Per weight row i, activation row r and group g, with
// u, S and A the integer form's (unpack.h):
//   P = sum_j S[i][j] (u . a)_j                                      (integers: exact in any order)
//   acc = fma(float(P), D[g] * A[i][g], acc)
// and the result is acc + 0, in every path alike.

template <int64_t TYPE>
struct TileIQ {  // one group of 256 values of 8 rows: their blocks
  uint8_t blocks[8][kLayout<TYPE>.bytes];
};

// IQ blocks [rows, groups * bytes] -> units of `per_unit` tiles (`repack_tiles`).
template <int64_t TYPE>
inline at::Tensor tile_iq(const at::Tensor& blocks, int64_t cols, int64_t per_unit) {
  return repack_tiles<TileIQ<TYPE>>(blocks, cols, kLayout<TYPE>.bytes, per_unit, [](TileIQ<TYPE>& t, int i, const uint8_t* b) {
    std::memcpy(t.blocks[i], b, kLayout<TYPE>.bytes);
  });
}

// Row i of an IQ tile in the integer form (`dequantize_rows`); its groups `stride` groups apart.
template <int64_t TYPE>
inline void unpack_iq_tile_row(const uint8_t* tile, int64_t i, int64_t cols, int64_t stride, Unpacked& u) {
  const int64_t groups = cols / 256, bytes = kLayout<TYPE>.bytes;
  std::vector<uint8_t> row(groups * bytes);
  for (int64_t g = 0; g < groups; ++g)
    std::memcpy(row.data() + g * bytes, reinterpret_cast<const TileIQ<TYPE>*>(tile)[g * stride].blocks[i], bytes);
  unpack_row(row.data(), TYPE, cols, u);
}

// ---- Q8_0 in tiles of eight rows ---------------------------------------------------------------------------
//
// At load a Q8_0 matrix whose rows come in eights is repacked (`tile_q8_0`) as Q4_K is: per group of 32 values,
// its eight rows' codes interleaved four values at a time, so that one 32-byte vector holds 4 values of each of
// the 8 rows and 4 values of an activation row, broadcast, multiply all 8 rows at once; each weight row's sum
// ends in a lane of its own. Per weight row i, activation row r and group g:
//   P = sum_v c[i][v] a[v]   (an integer: exact in any order),   acc = fma(float(P), D[g] * d[i], acc)
// and the result is acc, in every path alike. The codes are stored plus 128 (unsigned bytes): AVX-512 VNNI
// multiplies them straight into int32 lanes and takes 128 sum(a) back once a group; AVX2 turns them back into
// int8 and multiplies |c| by a with c's sign, as the row-at-a-time kernel does (unsigned, a pair of products
// could pass int16's range).
struct TileQ8_0 {  // one group of 32 values of 8 rows
  uint8_t codes[8][32];  // codes[k][4i + b]: row i's value 4k + b, plus 128
  uint16_t d[8];         // fp16, per row
};
static_assert(sizeof(TileQ8_0) == 8 * 34, "a Q8_0 tile group is its 8 rows' 34 bytes");

// Q8_0 blocks [rows, groups * 34] -> units of `per_unit` tiles (`repack_tiles`).
inline at::Tensor tile_q8_0(const at::Tensor& blocks, int64_t cols, int64_t per_unit) {
  return repack_tiles<TileQ8_0, 32>(blocks, cols, 34, per_unit, [](TileQ8_0& t, int i, const uint8_t* b) {
    std::memcpy(&t.d[i], b, 2);
    for (int k = 0; k < 8; ++k) store_word(t.codes[k] + 4 * i, load_word(b + 2 + 4 * k) ^ 0x80808080u);
  });
}

// Row i of a Q8_0 tile in the integer form (`dequantize_rows`); its groups `stride` groups apart.
inline void unpack_q8_tile_row(const uint8_t* tile, int64_t i, int64_t cols, int64_t stride, Unpacked& u) {
  const int64_t groups = cols / 32;
  u.resize(cols, groups);
  for (int64_t g = 0; g < groups; ++g) {
    const TileQ8_0& t = reinterpret_cast<const TileQ8_0*>(tile)[g * stride];
    for (int v = 0; v < 32; ++v) u.codes[g * 32 + v] = static_cast<uint8_t>(t.codes[v / 4][4 * i + v % 4] ^ 0x80);
    u.a[g] = half(reinterpret_cast<const uint8_t*>(&t.d[i]));
    u.b[g] = 0.0f;
    set_sub(u, 2 * g, 1, 0);
    set_sub(u, 2 * g + 1, 1, 0);
  }
}


// ---- Q4_0, Q4_1, Q5_0 and Q5_1 in tiles of eight rows --------------------------------------------------------
//
// At load these legacy matrices are repacked as a Q4_K sub-block is (`tile_legacy`), in the file's bytes: per group
// of 32 values, byte 4i + c of vector p holds row i's codes of values 8p + c (low nibble) and 8p + 4 + c (high),
// so that one 32-byte vector, its nibbles apart, times four activation values broadcast multiplies all 8 rows;
// Q5_0 / Q5_1's fifth bits lie beside them in 32 bytes, byte 4i + c's bit 2p + h the fifth bit of byte 4i + c's
// low (h 0) or high (h 1) nibble in vector p: one shift brings vector p's to where a code's 16 is. Per weight row i, activation row r and group g, with u
// the unsigned code and S the group's sum of activation values:
//   P = sum_v u[i][v] a[v] - bias S   (bias 8 for Q4_0, 16 for Q5_0, 0 with a min: an integer),
//   acc = fma(float(P), D[g] * d[i], acc),   then with Q4_1 / Q5_1's min   acc = fma(float(S), D[g] * m[i], acc)
// and the result is acc, in every path alike (one accumulator a row: a second left 8 rows of Q5_1 short of
// registers).
struct TileQ4_0 {  // one group of 32 values of 8 rows, as the blocks' 8 * 18 bytes
  uint8_t codes[4][32];
  uint16_t d[8];
};
struct TileQ4_1 {
  uint8_t codes[4][32];
  uint16_t d[8], m[8];
};
struct TileQ5_0 {
  uint8_t codes[4][32];
  uint8_t fifth[32];  // bit 2p + h of byte 4i + c: row i's fifth bit of value 8p + 4h + c
  uint16_t d[8];
};
struct TileQ5_1 {
  uint8_t codes[4][32];
  uint8_t fifth[32];
  uint16_t d[8], m[8];
};
static_assert(sizeof(TileQ4_0) == 8 * 18 && sizeof(TileQ4_1) == 8 * 20, "a legacy tile group is its rows' bytes");
static_assert(sizeof(TileQ5_0) == 8 * 22 && sizeof(TileQ5_1) == 8 * 24, "a legacy tile group is its rows' bytes");
struct TileIQ4NL : TileQ4_0 {};  // IQ4_NL's blocks are Q4_0's, their codes standing for `kIq4Values`

// What a legacy tile's codes mean: its block type, whether it has fifth bits and a min, the codes' bias, and whether
// a code stands for the non-linear table's value (IQ4_NL: u = v + 128, bias 128).
template <typename Tile> struct Legacy;
template <> struct Legacy<TileQ4_0> { static constexpr int64_t type = Q4_0, bias = 8; static constexpr bool five = false, min = false, table = false; };
template <> struct Legacy<TileQ4_1> { static constexpr int64_t type = Q4_1, bias = 0; static constexpr bool five = false, min = true, table = false; };
template <> struct Legacy<TileQ5_0> { static constexpr int64_t type = Q5_0, bias = 16; static constexpr bool five = true, min = false, table = false; };
template <> struct Legacy<TileQ5_1> { static constexpr int64_t type = Q5_1, bias = 0; static constexpr bool five = true, min = true, table = false; };
template <> struct Legacy<TileIQ4NL> { static constexpr int64_t type = IQ4_NL, bias = 128; static constexpr bool five = false, min = false, table = true; };

// Row i's unsigned code of value v of a legacy tile group.
template <typename Tile>
inline int legacy_code(const Tile& t, int i, int v) {
  const int p = v / 8, h = v % 8 / 4, c = v % 4;
  int code = (t.codes[p][4 * i + c] >> (4 * h)) & 15;
  if constexpr (Legacy<Tile>::five) code |= ((t.fifth[4 * i + c] >> (2 * p + h)) & 1) << 4;
  if constexpr (Legacy<Tile>::table) code = kIq4Values[code] + 128;
  return code;
}

// Legacy blocks [rows, groups * bytes] -> units of `per_unit` tiles (`repack_tiles`). A block is d (fp16), then m
// (fp16) with a min, the 32 fifth bits (bit v for value v) with five bits, and 16 bytes of nibbles (values 0-15
// low, 16-31 high).
template <typename Tile>
inline at::Tensor tile_legacy(const at::Tensor& blocks, int64_t cols, int64_t per_unit) {
  using L = Legacy<Tile>;
  return repack_tiles<Tile, 32>(blocks, cols, layout(L::type).bytes, per_unit, [](Tile& t, int i, const uint8_t* b) {
    std::memcpy(&t.d[i], b, 2);
    const uint8_t* rest = b + 2;
    if constexpr (L::min) std::memcpy(&t.m[i], b + 2, 2), rest += 2;
    uint32_t bits = 0;
    if constexpr (L::five) std::memcpy(&bits, rest, 4), rest += 4;
    interleave_nibbles_32(rest, reinterpret_cast<uint8_t*>(t.codes) + 4 * i);
    if constexpr (L::five)
      for (int v = 0; v < 32; ++v) t.fifth[4 * i + v % 4] |= static_cast<uint8_t>(((bits >> v) & 1) << (v / 4));
  });
}

// Row i of a legacy tile in the integer form (`dequantize_rows`), as `unpack_row` has its blocks; its groups
// `stride` groups apart.
template <typename Tile>
inline void unpack_legacy_tile_row(const uint8_t* tile, int64_t i, int64_t cols, int64_t stride, Unpacked& u) {
  using L = Legacy<Tile>;
  const int64_t groups = cols / 32;
  u.resize(cols, groups);
  for (int64_t g = 0; g < groups; ++g) {
    const Tile& t = reinterpret_cast<const Tile*>(tile)[g * stride];
    for (int v = 0; v < 32; ++v) u.codes[g * 32 + v] = static_cast<uint8_t>(legacy_code(t, i, v) - L::bias);
    u.a[g] = half(reinterpret_cast<const uint8_t*>(&t.d[i]));
    u.b[g] = 0.0f;
    if constexpr (L::min) u.b[g] = half(reinterpret_cast<const uint8_t*>(&t.m[i]));
    set_sub(u, 2 * g, 1, L::min);
    set_sub(u, 2 * g + 1, 1, L::min);
  }
}

}  // namespace gguf
