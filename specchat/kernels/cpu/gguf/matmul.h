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
// (tiles.h) where its type has tiles (traits.h). This file: what the decoder calls, and the dispatch table's
// entry, one per type (type_kernels.h builds them; matmul.cpp walks them).
#pragma once

#include "activations.h"
#include "unpack.h"

#include <memory>
#include <vector>

namespace gguf {

// One quantized matrix: [rows / unit_rows, bytes per unit] uint8, as the file's blocks (unit_rows 1) or repacked in
// 8-row tiles (8) or pairs of them (16).
struct Matrix {
  at::Tensor blocks;
  int64_t type = 0, unit_rows = 1, cols = 0;
  int64_t rows() const { return blocks.size(0) * unit_rows; }
};

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

// A type's entry: defined in type_kernels.h, compiled for a few types at a time in the kernels_*.cpp files, which a
// build's cores compile side by side.
template <int64_t TYPE>
const TypeKernels& type_kernels();

const TypeKernels& kernels(int64_t type);

// A matrix of `type` held in units of `unit_rows` rows, checked against its type.
Matrix blocks_matrix(const at::Tensor& blocks, int64_t type, int64_t unit_rows, int64_t cols);

// Matrices as they cross from Python: each its blocks, its type and its unit's rows.
std::vector<Matrix> matrices(const std::vector<at::Tensor>& blocks, const std::vector<int64_t>& types,
                             const std::vector<int64_t>& unit_rows, int64_t cols);

// The tiled form of a matrix held as its blocks (`per_unit` 1 or 2 asks for tiles or pairs; 0 lets the build
// choose); a type without tiles, or rows that do not come in eights, as it is.
Matrix tile(const Matrix& m, int64_t per_unit);

// x [n, cols] as the products read it: bf16 in place (`Quantized` widens each row as it reads it), any other float
// dtype in fp32.
at::Tensor activations_as_read(const at::Tensor& x);

// Rows [first, first + rows) of `activations_as_read`'s tensor, quantized (`Quantized`).
std::unique_ptr<Quantized> quantized_rows(const at::Tensor& x, int64_t first, int64_t rows, int64_t group,
                                          int64_t terms, int64_t pad = 1);

// x [n, cols] (any float dtype) times the matrices stacked along their rows -> [n, total rows] in `out_type` (fp32,
// bf16 or fp16: each fp32 result rounded as `Tensor::to` rounds it), its rows quantized in one int8 term or two
// (`terms`, activations.h).
at::Tensor matmul(const at::Tensor& x, const std::vector<Matrix>& matrices, Path path, int64_t terms = 1,
                  at::ScalarType out_type = at::kFloat);

// Rows `ids` of a matrix, dequantized to float32 [ids, cols] (embedding lookups).
at::Tensor dequantize_rows(const Matrix& m, const at::Tensor& ids);

}  // namespace gguf
