// GGUF's block-quantized weights times a few activation rows, each weight block read once for all rows.
//
// Every block type has one integer form (unpack.h):  w[i] = A[g] * S[j] * u[i] + B[g] * M[j].  Activations are
// quantized per row to int8 over the same groups (x = D[g] * a, activations.h), so a dot product is
//   sum_g D[g] * (A[g] * sum_j S[j] * (u . a)_j + B[g] * sum_j M[j] * sum(a)_j)
// whose inner sums are integers: exact in any order. Each row's float steps (8 lanes, a fixed final sum) are
// the same whichever rows share the call, and every code path (portable.h, avx2.h, avx512.h) performs the same
// float operations, so results are bitwise the same across row counts and code paths (tests/test_gguf_kernels.py).
//
// A matrix is held as the file's blocks, a row at a time, or repacked in units of 8-row tiles or 16-row pairs
// (tiles.h) where its type has tiles (traits.h). This file: the dispatch table built from the types' traits, and
// the matrix product that walks it.
#pragma once

#include "traits.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

namespace gguf {

// One quantized matrix: [rows / unit_rows, bytes per unit] uint8, as the file's blocks (unit_rows 1) or repacked in
// 8-row tiles (8) or pairs of them (16).
struct Matrix {
  at::Tensor blocks;
  int64_t type = 0, unit_rows = 1, cols = 0;
  int64_t rows() const { return blocks.size(0) * unit_rows; }
};

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

#ifdef GGUF_AMX
// From this many activation rows a pair's rows go through AMX tiles (amx.h), where the process may use them.
// Measured on the 1.5B's matrices (a Xeon, 2 threads) against the 512-bit kernels: 0.90x their time at 12 rows,
// 0.84x at 16, 0.69x at 64; Q4_K's through tiles from 2 rows took 1.14x at 8 (docs/benchmarks.md).
constexpr int64_t kAmxFromRows = 12;
inline bool through_amx(int64_t rows, Path path) { return path == Path::Best && rows >= kAmxFromRows && amx::ready(); }
#endif

// What a pass's activation rows are padded to a multiple of (`Quantized`): AMX's tiles read 16.
inline int64_t activation_padding(int64_t rows, Path path) {
#ifdef GGUF_AMX
  if (through_amx(rows, path)) return 16;
#endif
  (void)rows, (void)path;
  return 1;
}

#ifdef GGUF_AVX2
// A unit's weight rows through a type's `tile_dots` (and `pair_dots`, `amx_dots`) on the Best or Avx2 path: where the
// CPU has vpdpbusd its products take it; on AVX-512 VNNI a pair's tiles go through 512 bits from kPairsFromRows,
// and through AMX tiles where the pass has them configured (`through_amx`).
template <int64_t TYPE>
void tile_kernel_dots(const uint8_t* unit, const Quantized& x, int64_t per_unit, Path path, float* out) {
  using T = Traits<TYPE>;
#ifdef GGUF_DPBUSD
  if (path == Path::Best) {
#ifdef GGUF_AMX
    if constexpr (T::amx)
      if (per_unit == 2 && through_amx(x.rows, path)) return T::amx_dots(unit, x, out);
#endif
#ifdef GGUF_VNNI
    if constexpr (T::pairs)
      if (per_unit == 2 && x.rows >= kPairsFromRows)
        return by_eights(x.rows, [&](auto rows, int64_t r) { T::template pair_dots<rows()>(unit, x, r, out); });
#endif
    return by_halves(per_unit, [&](auto halves) {
      by_eights(x.rows, [&](auto rows, int64_t r) { T::template tile_dots<rows(), true, halves()>(unit, x, r, out); });
    });
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

// The dispatch table: a type's layout and kernels, one entry per type of GGUF_BLOCK_TYPES.
struct TypeKernels {
  Layout layout;
  bool tiles;
  int64_t tile_bytes;  // per group of values of an 8-row tile
  at::Tensor (*repack)(const at::Tensor& blocks, int64_t cols, int64_t per_unit);
  void (*row_dots)(const uint8_t* row, const Quantized& x, Path path, Unpacked& u, float* out);
  void (*unit_dots)(const uint8_t* unit, const Quantized& x, int64_t per_unit, Path path, Unpacked& u, float* out);
  void (*unpack_unit_row)(const uint8_t* unit, int64_t i, int64_t cols, int64_t per_unit, Unpacked& u);
};

template <int64_t TYPE>
inline constexpr TypeKernels kKernels{kLayout<TYPE>, Traits<TYPE>::tiles, tile_bytes<TYPE>(), repack<TYPE>, row_dots<TYPE>,
                                      unit_dots<TYPE>, unpack_unit_row<TYPE>};

inline const TypeKernels& kernels(int64_t type) {
  return visit_type(type, [](auto t) -> const TypeKernels& { return kKernels<t()>; });
}

// A matrix of `type` held in units of `unit_rows` rows, checked against its type.
inline Matrix blocks_matrix(const at::Tensor& blocks, int64_t type, int64_t unit_rows, int64_t cols) {
  const TypeKernels& k = kernels(type);
  TORCH_CHECK(blocks.dim() == 2 && blocks.scalar_type() == at::kByte, "blocks must be uint8 [units, bytes]");
  TORCH_CHECK(unit_rows == 1 || ((unit_rows == kTileRows || unit_rows == 2 * kTileRows) && k.tiles),
              "GGUF block type ", type, " is not held in units of ", unit_rows, " rows");
  const int64_t groups = cols / k.layout.values;
  const int64_t unit_bytes = unit_rows == 1 ? groups * k.layout.bytes : groups * unit_rows / kTileRows * k.tile_bytes;
  TORCH_CHECK(cols % k.layout.values == 0 && blocks.size(1) == unit_bytes, "blocks do not fit the type");
  return {blocks.contiguous(), type, unit_rows, cols};
}

// The tiled form of a matrix held as its blocks: pairs where AVX-512 VNNI reads a pair's 16 rows at once and the
// rows come in sixteens, else 8-row tiles where they come in eights; a type without tiles, or rows that do not
// come in eights, as it is. `per_unit` 1 or 2 asks for tiles or pairs (the tests hold every path to both).
//
// Measured on the 1.5B (2 threads, a forward's matrices, against 8-row tiles in one process): 4 activation rows
// 24.1-24.6 ms -> 17.5-18.0 ms, 8 rows 33 -> 31 ms, 1 and 2 rows the same. Read as two streams (two 8-row tiles
// apart in memory) pairs had lost to a tile at a time below 8 rows.
inline Matrix tile(const Matrix& m, int64_t per_unit) {
  if (per_unit == 0) {
#ifdef GGUF_VNNI
    per_unit = m.rows() % (2 * kTileRows) == 0 ? 2 : 1;
#else
    per_unit = 1;
#endif
  }
  TORCH_CHECK(per_unit == 1 || per_unit == 2, "a unit holds 1 or 2 tiles");
  const TypeKernels& k = kernels(m.type);
  if (m.unit_rows != 1 || !k.tiles || m.rows() % (per_unit * kTileRows) != 0) return m;
  return {k.repack(m.blocks, m.cols, per_unit), m.type, per_unit * kTileRows, m.cols};
}

// x [n, cols] (any float dtype) times the matrices stacked along their rows -> [n, total rows] float32. One
// parallel loop over all their rows per chunk of kRowChunk activation rows, quantized once per group size.
inline at::Tensor matmul(const at::Tensor& x, const std::vector<Matrix>& matrices, Path path) {
  TORCH_CHECK(x.dim() == 2, "x must be [rows, cols]");
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const int64_t n = xf.size(0), cols = xf.size(1);
  std::vector<int64_t> starts{0}, units{0};  // per matrix: its first output row, its first unit (`unit_rows`)
  std::vector<const TypeKernels*> kinds;
  for (const auto& m : matrices) {
    TORCH_CHECK(m.cols == cols, "matrix of ", m.cols, " columns times rows of ", cols);
    kinds.push_back(&kernels(m.type));
    starts.push_back(starts.back() + m.rows());
    units.push_back(units.back() + m.blocks.size(0));
  }
  const int64_t total = starts.back();
  at::Tensor out = at::empty({n, total}, xf.options());
  float* out_data = out.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1));
  std::vector<const uint8_t*> bases;  // read once: data_ptr is checked on every call
  for (const auto& m : matrices) bases.push_back(m.blocks.data_ptr<uint8_t>());
  // Activation rows a chunk at a time, so that their int8 values stay in cache while every weight row passes
  // by (a 512-row prefill re-read 0.8 MB of them per weight row). Each row is quantized and dotted on its own,
  // so chunking changes no result.
  for (int64_t chunk = 0; chunk < n; chunk += kRowChunk) {
    const int64_t rows = std::min(kRowChunk, n - chunk);
    const float* x_rows = xf.data_ptr<float>() + chunk * cols;
    const Quantized* by_group[2] = {nullptr, nullptr};  // groups of 32, 256
    std::vector<std::unique_ptr<Quantized>> held;
    for (const auto& m : matrices) {
      const int64_t values = kernels(m.type).layout.values, slot = values == 32 ? 0 : 1;
      if (!by_group[slot]) {
        held.push_back(std::make_unique<Quantized>(x_rows, rows, cols, values, activation_padding(rows, path)));
        by_group[slot] = held.back().get();
      }
    }
    float* out_rows = out_data + chunk * total;
    at::parallel_for(0, units.back(), grain, [&](int64_t begin, int64_t end) {
#ifdef GGUF_AMX
      std::optional<amx::Tiles> tiles;  // configured on this thread for the pass
      if (through_amx(rows, path)) tiles.emplace();
#endif
      Unpacked u;
      std::vector<float> column(2 * kTileRows * rows);
      size_t part = 0;
      for (int64_t unit = begin; unit < end; ++unit) {
        while (unit >= units[part + 1]) ++part;
        const Matrix& m = matrices[part];
        const uint8_t* blocks = bases[part] + (unit - units[part]) * m.blocks.size(1);
        const TypeKernels& k = *kinds[part];
        const Quantized& x = *by_group[k.layout.values == 32 ? 0 : 1];
        const int64_t done = m.unit_rows, first = starts[part] + (unit - units[part]) * done;
        if (done == 1) k.row_dots(blocks, x, path, u, column.data());
        else k.unit_dots(blocks, x, done / kTileRows, path, u, column.data());
        for (int64_t r = 0; r < rows; ++r)  // weight rows: a run of outputs per row r
          for (int64_t i = 0; i < done; ++i) out_rows[r * total + first + i] = column[i * rows + r];
      }
    });
  }
  return out;
}

// Rows `ids` of a matrix, dequantized to float32 [ids, cols] (embedding lookups).
inline at::Tensor dequantize_rows(const Matrix& m, const at::Tensor& ids) {
  const at::Tensor idx = ids.to(at::kLong).contiguous();
  const TypeKernels& k = kernels(m.type);
  const int64_t n = idx.numel(), cols = m.cols, values = k.layout.values;
  at::Tensor out = at::empty({n, cols}, at::TensorOptions().dtype(at::kFloat));
  Unpacked u;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t id = idx.data_ptr<int64_t>()[r];
    TORCH_CHECK(id >= 0 && id < m.rows(), "row ", id, " out of range");
    const uint8_t* unit = m.blocks.data_ptr<uint8_t>() + id / m.unit_rows * m.blocks.size(1);
    if (m.unit_rows == 1) unpack_row(unit, m.type, cols, u);
    else k.unpack_unit_row(unit, id % m.unit_rows, cols, m.unit_rows / kTileRows, u);
    float* dst = out.data_ptr<float>() + r * cols;
    for (int64_t i = 0; i < cols; ++i) {
      const int64_t g = i / values, j = i / 16;
      const float code = k.layout.is_signed ? static_cast<int8_t>(u.codes[i]) : u.codes[i];
      dst[i] = u.a[g] * u.pair_scales[i / 2] * code + u.b[g] * u.mins[j];
    }
  }
  return out;
}

}  // namespace gguf
