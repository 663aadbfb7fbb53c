// The matrix product over the dispatch table (matmul.h): activation rows quantized once per pass, the weight units
// split over the threads, each through its type's entry.
#include "matmul.h"

#include "../claims.h"
#include "amx.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <memory>
#include <optional>

namespace gguf {

const TypeKernels& kernels(int64_t type) {
  return visit_type(type, [](auto t) -> const TypeKernels& { return type_kernels<t()>(); });
}

// What a pass's activation rows are padded to a multiple of (`Quantized`): AMX's tiles read 16.
static int64_t activation_padding(int64_t rows, Path path) {
#ifdef GGUF_AMX
  if (through_amx(rows, path)) return 16;
#endif
  (void)rows, (void)path;
  return 1;
}

Matrix blocks_matrix(const at::Tensor& blocks, int64_t type, int64_t unit_rows, int64_t cols) {
  const TypeKernels& k = kernels(type);
  TORCH_CHECK(blocks.dim() == 2 && blocks.scalar_type() == at::kByte, "blocks must be uint8 [units, bytes]");
  TORCH_CHECK(unit_rows == 1 || ((unit_rows == kTileRows || unit_rows == 2 * kTileRows) && k.tiles),
              "GGUF block type ", type, " is not held in units of ", unit_rows, " rows");
  const int64_t groups = cols / k.layout.values;
  const int64_t unit_bytes = unit_rows == 1 ? groups * k.layout.bytes : groups * unit_rows / kTileRows * k.tile_bytes;
  TORCH_CHECK(cols % k.layout.values == 0 && blocks.size(1) == unit_bytes, "blocks do not fit the type");
  return {blocks.contiguous(), type, unit_rows, cols};
}

std::vector<Matrix> matrices(const std::vector<at::Tensor>& blocks, const std::vector<int64_t>& types,
                             const std::vector<int64_t>& unit_rows, int64_t cols) {
  TORCH_CHECK(blocks.size() == types.size() && blocks.size() == unit_rows.size(), "one type and unit per matrix");
  std::vector<Matrix> held;
  for (size_t i = 0; i < blocks.size(); ++i) held.push_back(blocks_matrix(blocks[i], types[i], unit_rows[i], cols));
  return held;
}

// The build's choice: pairs where AVX-512 VNNI reads a pair's 16 rows at once and the rows come in sixteens, else
// 8-row tiles where they come in eights (the tests hold every path to both).
//
// Measured on the 1.5B (2 threads, a forward's matrices, against 8-row tiles in one process): 4 activation rows
// 24.1-24.6 ms -> 17.5-18.0 ms, 8 rows 33 -> 31 ms, 1 and 2 rows the same. Read as two streams (two 8-row tiles
// apart in memory) pairs had lost to a tile at a time below 8 rows.
Matrix tile(const Matrix& m, int64_t per_unit) {
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

at::Tensor activations_as_read(const at::Tensor& x) {
  return x.scalar_type() == at::kBFloat16 ? x.contiguous() : x.to(at::kFloat).contiguous();
}

std::unique_ptr<Quantized> quantized_rows(const at::Tensor& x, int64_t first, int64_t rows, int64_t group,
                                          int64_t terms, int64_t pad) {
  const int64_t cols = x.size(1);
  if (x.scalar_type() == at::kBFloat16)
    return std::make_unique<Quantized>(x.data_ptr<at::BFloat16>() + first * cols, rows, cols, group, terms, pad);
  return std::make_unique<Quantized>(x.data_ptr<float>() + first * cols, rows, cols, group, terms, pad);
}

// A unit's outputs for a pass's `rows` (`column`: a run of `passed` a weight row; with two terms each row's rest
// after the rows, added) into their columns [first, first + done) of `out` [rows, total], rounded to Out there: a
// prefill's products never stand whole in fp32 (a 512-row pass of the 1.5B's gate and up: 37 MB, fresh pages on
// every call).
template <typename Out>
void put_unit(const float* column, int64_t rows, int64_t passed, int64_t done, bool two_terms, Out* out,
              int64_t total, int64_t first) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < done; ++i) {
      const float* outputs = column + i * passed;
      out[r * total + first + i] = static_cast<Out>(two_terms ? outputs[r] + outputs[rows + r] : outputs[r]);
    }
}

// One parallel loop over all the matrices' rows per chunk of kRowChunk activation rows, quantized once per group size
// (in two terms: a chunk's rows, then their rests, as one pass's rows, each row's two products summed).
at::Tensor matmul(const at::Tensor& x, const std::vector<Matrix>& matrices, Path path, int64_t terms,
                  at::ScalarType out_type) {
  TORCH_CHECK(x.dim() == 2, "x must be [rows, cols]");
  TORCH_CHECK(terms == 1 || terms == 2, "activations go in one int8 term or two");
  TORCH_CHECK(out_type == at::kFloat || out_type == at::kBFloat16 || out_type == at::kHalf,
              "the products come out in fp32, bf16 or fp16");
  const at::Tensor xc = activations_as_read(x);
  const int64_t n = xc.size(0), cols = xc.size(1);
  std::vector<int64_t> starts{0}, units{0};  // per matrix: its first output row, its first unit (`unit_rows`)
  std::vector<const TypeKernels*> kinds;
  for (const auto& m : matrices) {
    TORCH_CHECK(m.cols == cols, "matrix of ", m.cols, " columns times rows of ", cols);
    kinds.push_back(&kernels(m.type));
    starts.push_back(starts.back() + m.rows());
    units.push_back(units.back() + m.blocks.size(0));
  }
  const int64_t total = starts.back();
  at::Tensor out = at::empty({n, total}, xc.options().dtype(out_type));
  void* const out_data = out.data_ptr();
  std::vector<const uint8_t*> bases;  // read once: data_ptr is checked on every call
  for (const auto& m : matrices) bases.push_back(m.blocks.data_ptr<uint8_t>());
  // Activation rows a chunk at a time, so that their int8 values stay in cache while every weight row passes
  // by (a 512-row prefill re-read 0.8 MB of them per weight row). Each row is quantized and dotted on its own,
  // so chunking changes no result.
  for (int64_t chunk = 0; chunk < n; chunk += kRowChunk / terms) {
    const int64_t rows = std::min(kRowChunk / terms, n - chunk), passed = terms * rows;  // a pass's activation rows
    const Quantized* by_group[2] = {nullptr, nullptr};  // groups of 32, 256
    std::vector<std::unique_ptr<Quantized>> held;
    for (const auto& m : matrices) {
      const int64_t values = kernels(m.type).layout.values, slot = values == 32 ? 0 : 1;
      if (by_group[slot]) continue;
      held.push_back(quantized_rows(xc, chunk, rows, values, terms, activation_padding(passed, path)));
      by_group[slot] = held.back().get();
    }
    const bool two = terms == 2;
    // a claim at least 16K of a unit's columns over the pass's rows (a decode step: 10 units of 1536 columns)
    claim_in_parallel(units.back(), 16384 / std::max<int64_t>(cols * passed, 1), [&](Claims& claims) {
#ifdef GGUF_AMX
      std::optional<amx::Tiles> tiles;  // configured on this thread for the pass
      if (through_amx(passed, path)) tiles.emplace();
#endif
      Unpacked u;
      alignas(64) float column[2 * kTileRows * kRowChunk];  // a unit's outputs for the pass's rows
      size_t part = 0;
      for (int64_t begin, end; claims.next(begin, end);)
        for (int64_t unit = begin; unit < end; ++unit) {
          while (unit >= units[part + 1]) ++part;
          const Matrix& m = matrices[part];
          const uint8_t* blocks = bases[part] + (unit - units[part]) * m.blocks.size(1);
          const TypeKernels& k = *kinds[part];
          const Quantized& x = *by_group[k.layout.values == 32 ? 0 : 1];
          const int64_t done = m.unit_rows, first = starts[part] + (unit - units[part]) * done;
          if (done == 1) k.row_dots(blocks, x, path, u, column);
          else k.unit_dots(blocks, x, done / kTileRows, path, u, column);
          const int64_t at_row = chunk * total;
          if (out_type == at::kBFloat16) {
            put_unit(column, rows, passed, done, two, static_cast<at::BFloat16*>(out_data) + at_row, total, first);
          } else if (out_type == at::kHalf) {
            put_unit(column, rows, passed, done, two, static_cast<at::Half*>(out_data) + at_row, total, first);
          } else {
            put_unit(column, rows, passed, done, two, static_cast<float*>(out_data) + at_row, total, first);
          }
        }
    });
  }
  return out;
}

at::Tensor dequantize_rows(const Matrix& m, const at::Tensor& ids) {
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
