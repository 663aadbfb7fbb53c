// The dispatch table's entries (matmul.h's `TypeKernels`) built from the types' traits (traits.h): a type's kernels
// for rows held as the file's blocks or in tiles, on each path. Included by the kernels_*.cpp files alone, each of
// which compiles a few types' entries, so that a build's cores compile them side by side.
#pragma once

#include "matmul.h"
#include "traits.h"

namespace gguf {

// Rows of the integer form (`unpack_row` or a tile's `unpack_tile_row`) dotted with activation rows: out[r].
inline void unpacked_dots(const Unpacked& u, const Quantized& x, Layout l, Path path, float* out) {
#ifdef GGUF_AVX2
  if (path != Path::Portable) {
    if (l.is_signed) return by_fours(x.rows, [&](auto rows, int64_t r) { dots_avx2<true, rows()>(u, x, r, l.values, out); });
    return by_fours(x.rows, [&](auto rows, int64_t r) { dots_avx2<false, rows()>(u, x, r, l.values, out); });
  }
#endif
  (void)path;
  l.is_signed ? dots_portable<true>(u, x, 0, x.rows, l.values, out)
              : dots_portable<false>(u, x, 0, x.rows, l.values, out);
}

// Whether a type's unit kernel takes every activation row in one call (`every_row_unit_dots`).
template <typename T, typename = void>
struct UnitTakesEveryRow : std::false_type {};
template <typename T>
struct UnitTakesEveryRow<T, std::void_t<decltype(&T::every_row_unit_dots)>> : std::true_type {};

// A weight row (the file's blocks) dotted with every activation row: out[r].
template <int64_t TYPE>
void row_dots(const uint8_t* row, const Quantized& x, Path path, Unpacked& u, float* out) {
#ifdef GGUF_AVX2
  if constexpr (Traits<TYPE>::row_kernel) {
    if (path == Path::Best || path == Path::Avx2) {
      return by_fours(x.rows, [&](auto rows, int64_t r) { Traits<TYPE>::template row_dots<rows()>(row, x, r, out); });
    }
  }
#endif
  unpack_row(row, TYPE, x.cols, u);
  unpacked_dots(u, x, kLayout<TYPE>, path, out);
}

// From this many activation rows a pair's two tiles go side by side through 512-bit vectors (`pair_dots`), below
// it group by group through 256 bits. Measured on the 1.5B's matrices (a Zen 4, 2 threads, while its memory ran
// fast): one row 21.4-23.3 ms through 256 bits against 26.3-28.5 through 512, two rows 23.0-24.9 through 512
// against 27.7-29.0; with slow memory the two within 5% (docs/benchmarks.md).
constexpr int64_t kPairsFromRows = 2;

#ifdef GGUF_AVX2
// A unit's weight rows through a type's `tile_dots` (and `pair_dots`, `amx_dots`) on the Best or Avx2 path: where the
// CPU has vpdpbusd its products take it. On AVX-512 VNNI a pair's tiles go through 512 bits from kPairsFromRows (one
// row through 256 bits), and through AMX tiles where the pass has them configured (`through_amx`); a lone tile of a
// type with pairs, which a matrix has there only when its rows are 8 past a multiple of 16 (no model's), through the
// AVX2 kernel.
template <int64_t TYPE>
void tile_kernel_dots(const uint8_t* unit, const Quantized& x, int64_t per_unit, Path path, float* out) {
  using T = Traits<TYPE>;
#ifdef GGUF_DPBUSD
  if (path == Path::Best) {
#ifdef GGUF_VNNI
    if constexpr (T::pairs) {
      if (per_unit == 2) {
#ifdef GGUF_AMX
        if constexpr (T::amx)
          if (through_amx(x.rows, path)) return T::amx_dots(unit, x, out);
#endif
        static_assert(kPairsFromRows == 2, "below it one row");
        if (x.rows == 1) return T::template tile_dots<1, true, 2>(unit, x, 0, out);
        return by_eights(x.rows, [&](auto rows, int64_t r) { T::template pair_dots<rows()>(unit, x, r, out); });
      }
    } else
#endif
    {
      return by_halves(per_unit, [&](auto halves) {
        by_eights(x.rows, [&](auto rows, int64_t r) {
          T::template tile_dots<rows(), true, halves()>(unit, x, r, out);
        });
      });
    }
  }
#endif
  (void)path;
  by_halves(per_unit, [&](auto halves) {
    by_fours(x.rows, [&](auto rows, int64_t r) { T::template tile_dots<rows(), false, halves()>(unit, x, r, out); });
  });
}
#endif

// A unit's weight rows i (8, or 16 in a pair) dotted with every activation row r: out[i * x.rows + r], through the
// type's kernels (`tile_kernel_dots`, or its own `every_row_unit_dots`) unless the path asks for the integer form or
// the portable loops.
template <int64_t TYPE>
void unit_dots(const uint8_t* unit, const Quantized& x, int64_t per_unit, Path path, Unpacked& u, float* out) {
  using T = Traits<TYPE>;
  if constexpr (T::tiles) {
    using Tile = typename T::Tile;
    if (path == Path::Unpacked) {
      for (int64_t i = 0; i < kTileRows * per_unit; ++i) {
        T::unpack_tile_row(unit + i / kTileRows * sizeof(Tile), i % kTileRows, x.cols, per_unit, u);
        unpacked_dots(u, x, kLayout<TYPE>, path, out + i * x.rows);
      }
      return;
    }
#ifdef GGUF_AVX2
    if (path != Path::Portable) {
      if constexpr (UnitTakesEveryRow<T>::value) return T::every_row_unit_dots(unit, x, per_unit, path, out);
      else return tile_kernel_dots<TYPE>(unit, x, per_unit, path, out);
    }
#endif
    for (int64_t h = 0; h < per_unit; ++h)
      T::tile_dots_portable(unit + h * sizeof(Tile), x, x.rows, per_unit, out + h * kTileRows * x.rows);
  } else {
    TORCH_CHECK(false, "GGUF block type ", TYPE, " has no tiles");
  }
}

// Row i of a unit in the integer form; its tile's groups `per_unit` groups apart.
template <int64_t TYPE>
void unpack_unit_row(const uint8_t* unit, int64_t i, int64_t cols, int64_t per_unit, Unpacked& u) {
  if constexpr (Traits<TYPE>::tiles) {
    using Tile = typename Traits<TYPE>::Tile;
    Traits<TYPE>::unpack_tile_row(unit + i / kTileRows * sizeof(Tile), i % kTileRows, cols, per_unit, u);
  } else {
    TORCH_CHECK(false, "GGUF block type ", TYPE, " has no tiles");
  }
}

template <int64_t TYPE>
constexpr int64_t tile_bytes() {
  if constexpr (Traits<TYPE>::tiles) return sizeof(typename Traits<TYPE>::Tile);
  return 0;
}

template <int64_t TYPE>
at::Tensor repack(const at::Tensor& blocks, int64_t cols, int64_t per_unit) {
  if constexpr (Traits<TYPE>::tiles) return Traits<TYPE>::repack(blocks, cols, per_unit);
  return blocks;
}

template <int64_t TYPE>
const TypeKernels& type_kernels() {
  static constexpr TypeKernels entry{kLayout<TYPE>, Traits<TYPE>::tiles, tile_bytes<TYPE>(), repack<TYPE>,
                                     row_dots<TYPE>, unit_dots<TYPE>, unpack_unit_row<TYPE>};
  return entry;
}

}  // namespace gguf
