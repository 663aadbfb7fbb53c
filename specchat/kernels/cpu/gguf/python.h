// The block kernels' functions in Python, defined on the decoder's module and on the kernels' own (gguf_kernels.cpp).
// A GGUF matrix crosses as (blocks, type, unit_rows): its tensor, ggml's type id, and 1 for the file's blocks or
// 8 / 16 for tiles (`Matrix`). A header of the two modules' files: a file of its own would compile torch's Python
// headers once more.
#pragma once

#include "matmul.h"
#include "quantize.h"

#include <torch/csrc/utils/pybind.h>

#include <cstring>
#include <map>
#include <string>
#include <tuple>

namespace gguf {

inline void define_functions(pybind11::module_& m) {
  namespace py = pybind11;
  m.def("gguf_matmul", [](at::Tensor x, std::vector<at::Tensor> blocks, std::vector<int64_t> types,
                          std::vector<int64_t> unit_rows, int64_t cols, const std::string& path, int64_t terms) {
    return matmul(x, matrices(blocks, types, unit_rows, cols), path_named(path), terms);
  }, py::arg("x"), py::arg("blocks"), py::arg("types"), py::arg("unit_rows"), py::arg("cols"), py::arg("path"),
     py::arg("terms") = 1,
     "x [n, cols] times GGUF matrices stacked along their rows -> [n, rows] float32, x in `terms` int8 terms "
     "(gguf/matmul.h).");
  m.def("gguf_activations", [](at::Tensor x, int64_t group, int64_t terms) {
    TORCH_CHECK(x.dim() == 2 && (group == 32 || group == 256) && x.size(1) % group == 0 && (terms == 1 || terms == 2),
                "x [rows, groups of 32 or 256], in one term or two");
    const at::Tensor xc = activations_as_read(x);
    const auto held = quantized_rows(xc, 0, xc.size(0), group, terms);
    const auto copied = [](const auto& values, at::ScalarType type) {
      at::Tensor out = at::empty({static_cast<int64_t>(values.size())}, at::TensorOptions().dtype(type));
      std::memcpy(out.data_ptr(), values.data(), values.size() * sizeof(values[0]));
      return out;
    };
    return std::make_tuple(copied(held->q, at::kChar).view({held->rows, held->cols}), copied(held->scale, at::kFloat),
                           copied(held->sums, at::kShort), copied(held->sums32, at::kShort));
  }, py::arg("x"), py::arg("group"), py::arg("terms") = 1,
     "x [rows, cols] as the kernels take it (gguf/activations.h): (int8 codes [terms * rows, cols], a scale per "
     "group, the codes' sums per 16 and per 32), for tests.");
  m.def("gguf_tile", [](at::Tensor blocks, int64_t type, int64_t cols, int64_t per_unit) {
    const Matrix tiled = tile(blocks_matrix(blocks, type, 1, cols), per_unit);
    return std::make_tuple(tiled.blocks, tiled.unit_rows);
  }, py::arg("blocks"), py::arg("type"), py::arg("cols"), py::arg("per_unit") = 0,
     "A matrix's blocks [rows, bytes] -> (its units, their rows: 1, or 8 / 16 where this build tiles it).");
  m.def("gguf_quantize", &quantize::rows, py::arg("weight"), py::arg("type"),
        "Dense rows [rows, cols] written as GGUF blocks of `type` (Q4_K, Q5_K, Q6_K, Q8_0, Q5_0; gguf/quantize.h).");
  m.def("iq_grids", [](std::map<std::string, at::Tensor> grids) {
    IqGrids& held = iq_grids();
    const std::pair<const char*, std::vector<int8_t>*> names[] = {{"iq2_xxs", &held.iq2xxs}, {"iq2_xs", &held.iq2xs},
        {"iq2_s", &held.iq2s}, {"iq3_xxs", &held.iq3xxs}, {"iq3_s", &held.iq3s}, {"iq1_s", &held.iq1s}};  // fmt: skip
    for (const auto& [name, grid] : names) {
      const at::Tensor values = grids.at(name).to(at::kChar).contiguous();
      grid->assign(values.data_ptr<int8_t>(), values.data_ptr<int8_t>() + values.numel());
    }
    held.iq2xxs_packed = pack_grid(held.iq2xxs, 8);
    held.iq2xs_packed = pack_grid(held.iq2xs, 8);
    held.iq3xxs_packed = pack_grid(held.iq3xxs, 4);
    held.iq3s_packed = pack_grid(held.iq3s, 4);
  }, "The IQ types' codebooks, {name: int8 [entries, values]} (gguf-py's grids), for the unpacking of their blocks.");
  m.def("gguf_rows", [](at::Tensor blocks, int64_t type, int64_t unit_rows, int64_t cols, at::Tensor ids) {
    return dequantize_rows(blocks_matrix(blocks, type, unit_rows, cols), ids);
  }, "Rows `ids` of a GGUF matrix dequantized to float32.");
}

}  // namespace gguf
