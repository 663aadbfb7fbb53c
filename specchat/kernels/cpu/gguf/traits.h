// One entry per block type: the kernels it has of its own. A type without an entry runs through its rows'
// integer form (`unpack_row`, then `dots_avx2` or `dots_portable`), which every type has; an entry adds
//   row_kernel  an AVX2 kernel reading the file's blocks directly (`row_dots<ROWS>`, four rows a pass),
//   tiles       8-row tiles (`Tile`, `repack`, `unpack_tile_row`, `tile_dots_portable`, the 256-bit `tile_dots`,
//               or `every_row_unit_dots` taking every activation row: the IQ types', a pair decoded once for many),
//   pairs       on AVX-512 VNNI, a 512-bit kernel for a pair of tiles side by side (`pair_dots`),
//   amx         on AMX-INT8, a pair of K-quant tiles times all of a pass's activation rows in tiles (`amx_dots`).
// type_kernels.h builds the dispatch table's entries from these alone.
#pragma once

#include "amx.h"

namespace gguf {

template <int64_t TYPE>
struct Traits {
  static constexpr bool row_kernel = false, tiles = false;
};

template <typename TileType>
struct LegacyTraits {  // Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL
  using Tile = TileType;
  static constexpr bool row_kernel = true, tiles = true;
  static constexpr bool pairs = true, amx = false;
  static at::Tensor repack(const at::Tensor& blocks, int64_t cols, int64_t per_unit) {
    return tile_legacy<Tile>(blocks, cols, per_unit);
  }
  static void unpack_tile_row(const uint8_t* tile, int64_t i, int64_t cols, int64_t stride, Unpacked& u) {
    unpack_legacy_tile_row<Tile>(tile, i, cols, stride, u);
  }
  static void tile_dots_portable(const uint8_t* tile, const Quantized& x, int64_t n, int64_t stride, float* out) {
    legacy_tile_dots_portable<Tile>(tile, x, 0, n, stride, out);
  }
#ifdef GGUF_AVX2
  template <int ROWS>
  static void row_dots(const uint8_t* row, const Quantized& x, int64_t first, float* out) {
    dots_32<Legacy<Tile>::type, ROWS>(row, x, first, out);
  }
  template <int ROWS, bool VNNI, int HALVES>
  static void tile_dots(const uint8_t* unit, const Quantized& x, int64_t first, float* out) {
    legacy_tile_dots<Tile, ROWS, VNNI, HALVES>(unit, x, first, out);
  }
#endif
#ifdef GGUF_VNNI
  template <int ROWS>
  static void pair_dots(const uint8_t* pair, const Quantized& x, int64_t first, float* out) {
    legacy_pair_dots_vnni<Tile, ROWS>(pair, x, first, out);
  }
#endif
};

template <> struct Traits<Q4_0> : LegacyTraits<TileQ4_0> {};
template <> struct Traits<Q4_1> : LegacyTraits<TileQ4_1> {};
template <> struct Traits<Q5_0> : LegacyTraits<TileQ5_0> {};
template <> struct Traits<Q5_1> : LegacyTraits<TileQ5_1> {};
template <> struct Traits<IQ4_NL> : LegacyTraits<TileIQ4NL> {
  static constexpr bool row_kernel = false;  // rows that do not come in eights go through the integer form
};

template <>
struct Traits<Q8_0> {
  using Tile = TileQ8_0;
  static constexpr bool row_kernel = true, tiles = true;
  static constexpr bool pairs = false, amx = false;  // its 256-bit kernel reads a pair as fast
  static at::Tensor repack(const at::Tensor& blocks, int64_t cols, int64_t per_unit) {
    return tile_q8_0(blocks, cols, per_unit);
  }
  static void unpack_tile_row(const uint8_t* tile, int64_t i, int64_t cols, int64_t stride, Unpacked& u) {
    unpack_q8_tile_row(tile, i, cols, stride, u);
  }
  static void tile_dots_portable(const uint8_t* tile, const Quantized& x, int64_t n, int64_t stride, float* out) {
    q8_tile_dots_portable(tile, x, 0, n, stride, out);
  }
#ifdef GGUF_AVX2
  template <int ROWS>
  static void row_dots(const uint8_t* row, const Quantized& x, int64_t first, float* out) {
    dots_32<Q8_0, ROWS>(row, x, first, out);
  }
  template <int ROWS, bool VNNI, int HALVES>
  static void tile_dots(const uint8_t* unit, const Quantized& x, int64_t first, float* out) {
    q8_tile_dots<ROWS, VNNI, HALVES>(unit, x, first, out);
  }
#endif
};

template <typename TileType>
struct K4Traits {  // Q4_K, and Q5_K (TileQ5K: the same tiles, fifth bits beside them)
  using Tile = TileType;
  static constexpr bool five = std::is_same_v<Tile, TileQ5K>;
  static constexpr bool row_kernel = true, tiles = true;
  static constexpr bool pairs = true, amx = true;
  static at::Tensor repack(const at::Tensor& blocks, int64_t cols, int64_t per_unit) {
    return five ? tile_q5_k(blocks, cols, per_unit) : tile_q4_k(blocks, cols, per_unit);
  }
  static void unpack_tile_row(const uint8_t* tile, int64_t i, int64_t cols, int64_t stride, Unpacked& u) {
    gguf::unpack_tile_row<Tile>(tile, i, cols, stride, u);
  }
  static void tile_dots_portable(const uint8_t* tile, const Quantized& x, int64_t n, int64_t stride, float* out) {
    gguf::tile_dots_portable<Tile>(tile, x, 0, n, stride, out);
  }
#ifdef GGUF_AVX2
  template <int ROWS>
  static void row_dots(const uint8_t* row, const Quantized& x, int64_t first, float* out) {
    dots_q4_k<five, ROWS>(row, x, first, out);
  }
  template <int ROWS, bool VNNI, int HALVES>
  static void tile_dots(const uint8_t* unit, const Quantized& x, int64_t first, float* out) {
    gguf::tile_dots<ROWS, VNNI, HALVES, Tile>(unit, x, first, out);
  }
#endif
#ifdef GGUF_VNNI
  template <int ROWS>
  static void pair_dots(const uint8_t* pair, const Quantized& x, int64_t first, float* out) {
    tile_pair_dots_vnni<ROWS, Tile>(pair, x, first, out);
  }
#endif
#ifdef GGUF_AMX
  static void amx_dots(const uint8_t* pair, const Quantized& x, float* out) {
    tile_pair_dots_amx<Tile, K4GroupTiles<Tile>>(pair, x, out);
  }
#endif
};

template <> struct Traits<Q4_K> : K4Traits<TileQ4K> {};
template <> struct Traits<Q5_K> : K4Traits<TileQ5K> {};

template <>
struct Traits<IQ4_XS> {
  using Tile = TileIQ4XS;
  static constexpr bool row_kernel = false, tiles = true;
  static constexpr bool pairs = true, amx = false;
  static at::Tensor repack(const at::Tensor& blocks, int64_t cols, int64_t per_unit) {
    return tile_iq4_xs(blocks, cols, per_unit);
  }
  static void unpack_tile_row(const uint8_t* tile, int64_t i, int64_t cols, int64_t stride, Unpacked& u) {
    unpack_iq4_tile_row(tile, i, cols, stride, u);
  }
  static void tile_dots_portable(const uint8_t* tile, const Quantized& x, int64_t n, int64_t stride, float* out) {
    iq4_tile_dots_portable(tile, x, 0, n, stride, out);
  }
#ifdef GGUF_AVX2
  template <int ROWS, bool VNNI, int HALVES>
  static void tile_dots(const uint8_t* unit, const Quantized& x, int64_t first, float* out) {
    iq4_tile_dots<ROWS, VNNI, HALVES>(unit, x, first, out);
  }
#endif
#ifdef GGUF_VNNI
  template <int ROWS>
  static void pair_dots(const uint8_t* pair, const Quantized& x, int64_t first, float* out) {
    iq4_pair_dots_vnni<ROWS>(pair, x, first, out);
  }
#endif
};

template <typename TileType>
struct K16Traits {  // Q2_K, Q3_K and Q6_K: the same kernels over their tiles (tiles.h, "k16")
  using Tile = TileType;
  static constexpr bool row_kernel = false, tiles = true;
  static constexpr bool pairs = true, amx = true;
  static at::Tensor repack(const at::Tensor& blocks, int64_t cols, int64_t per_unit) {
    if constexpr (std::is_same_v<Tile, TileQ6K>) return tile_q6_k(blocks, cols, per_unit);
    else if constexpr (std::is_same_v<Tile, TileQ3K>) return tile_q3_k(blocks, cols, per_unit);
    else return tile_q2_k(blocks, cols, per_unit);
  }
  static void unpack_tile_row(const uint8_t* tile, int64_t i, int64_t cols, int64_t stride, Unpacked& u) {
    unpack_k16_tile_row<Tile>(tile, i, cols, stride, u);
  }
  static void tile_dots_portable(const uint8_t* tile, const Quantized& x, int64_t n, int64_t stride, float* out) {
    k16_tile_dots_portable<Tile>(tile, x, 0, n, stride, out);
  }
#ifdef GGUF_AVX2
  template <int ROWS, bool VNNI, int HALVES>
  static void tile_dots(const uint8_t* unit, const Quantized& x, int64_t first, float* out) {
    k16_tile_dots<ROWS, VNNI, HALVES, Tile>(unit, x, first, out);
  }
#endif
#ifdef GGUF_VNNI
  template <int ROWS>
  static void pair_dots(const uint8_t* pair, const Quantized& x, int64_t first, float* out) {
    k16_tile_pair_dots_vnni<ROWS, Tile>(pair, x, first, out);
  }
#endif
#ifdef GGUF_AMX
  static void amx_dots(const uint8_t* pair, const Quantized& x, float* out) {
    tile_pair_dots_amx<Tile, K16GroupTiles<Tile>>(pair, x, out);
  }
#endif
};

template <int64_t TYPE>
struct IqTraits {  // IQ1_S ... IQ3_S: their blocks decoded by codebook lookups (avx512.h, avx2.h)
  using Tile = TileIQ<TYPE>;
  static constexpr bool row_kernel = false, tiles = true;  // rows that do not come in eights: the integer form
  static constexpr bool pairs = false, amx = false;        // every unit's rows: `every_row_unit_dots`
  static at::Tensor repack(const at::Tensor& blocks, int64_t cols, int64_t per_unit) {
    return tile_iq<TYPE>(blocks, cols, per_unit);
  }
  static void unpack_tile_row(const uint8_t* tile, int64_t i, int64_t cols, int64_t stride, Unpacked& u) {
    unpack_iq_tile_row<TYPE>(tile, i, cols, stride, u);
  }
  static void tile_dots_portable(const uint8_t* tile, const Quantized& x, int64_t n, int64_t stride, float* out) {
    iq_tile_dots_portable<TYPE>(tile, x, 0, n, stride, out);
  }
#ifdef GGUF_AVX2
  // Eight rows a lookup. On AVX-512 VNNI a pair through 512 bits, decoded once from kIqGemmFromRows rows (a lone
  // tile, which a matrix has there only when its rows are 8 past a multiple of 16, through the AVX2 kernel); with
  // AVX-VNNI alone a tile decoded once from kIqGemmFromRows rows; on plain AVX2 into signed codes from
  // kIqSignedGemmFromRows.
  static void every_row_unit_dots(const uint8_t* unit, const Quantized& x, int64_t per_unit, Path path, float* out) {
#ifdef GGUF_VNNI
    if (path == Path::Best && per_unit == 2) return iq_pair_dots<TYPE>(unit, x, out);
#elif defined(GGUF_DPBUSD)
    if (path == Path::Best && x.rows >= kIqGemmFromRows)
      return by_halves(per_unit, [&](auto halves) { iq_decoded_unit_dots<TYPE, halves()>(unit, x, out); });
#else
    if (path == Path::Best && x.rows >= kIqSignedGemmFromRows)
      return by_halves(per_unit, [&](auto halves) { iq_signed_unit_dots<TYPE, halves()>(unit, x, out); });
#endif
    by_halves(per_unit, [&](auto halves) {
      by_eights(x.rows, [&](auto rows, int64_t r) { iq_tile_dots_avx2<TYPE, rows(), halves()>(unit, x, r, out); });
    });
    (void)path;
  }
#endif
};

template <> struct Traits<IQ2_XXS> : IqTraits<IQ2_XXS> {};
template <> struct Traits<IQ2_XS> : IqTraits<IQ2_XS> {};
template <> struct Traits<IQ2_S> : IqTraits<IQ2_S> {};
template <> struct Traits<IQ3_XXS> : IqTraits<IQ3_XXS> {};
template <> struct Traits<IQ3_S> : IqTraits<IQ3_S> {};
template <> struct Traits<IQ1_S> : IqTraits<IQ1_S> {};
template <> struct Traits<IQ1_M> : IqTraits<IQ1_M> {};

template <> struct Traits<Q2_K> : K16Traits<TileQ2K> {};
template <> struct Traits<Q3_K> : K16Traits<TileQ3K> {};

template <>
struct Traits<Q6_K> : K16Traits<TileQ6K> {
  static constexpr bool row_kernel = true;
#ifdef GGUF_AVX2
  template <int ROWS>
  static void row_dots(const uint8_t* row, const Quantized& x, int64_t first, float* out) {
    dots_q6_k<ROWS>(row, x, first, out);
  }
#endif
};

}  // namespace gguf
