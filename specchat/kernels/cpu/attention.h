// The decoder's attention as its layers call it: the caches it reads and writes, the rows a tree's mask lets each
// row see, and `attention` itself, compiled apart for each kind of cache (attention_kernels.h holds the kernels;
// attention_plain.cpp, attention_bf16.cpp and attention_int8.cpp compile them side by side).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <type_traits>
#include <vector>

#include "decoder.h"
#include "int8_dots.h"
#include "rows.h"

namespace cpu_decoder {

// A cache of elements C, the activations' dtype or bf16 beside fp32 activations (as llama.cpp keeps an f16 cache
// beside f32 activations): each KV head's keys and values [slots][D].
template <typename C>
struct PlainKv {
  C* keys;
  C* values;
  int64_t slots;

  void write_key(int64_t head, int64_t slot, const float* rotated, int64_t dim) const {
    C* out = keys + (head * slots + slot) * dim;
    for (int64_t d = 0; d < dim; ++d) out[d] = store<C>(rotated[d]);
  }
  template <typename T>
  void write_value(int64_t head, int64_t slot, const T* value, int64_t dim) const {
    C* out = values + (head * slots + slot) * dim;
    for (int64_t d = 0; d < dim; ++d) out[d] = store<C>(load(value[d]));
  }
};

// Where scale `row` of a slot lies in an int8 cache's tiled scales (int8_dots.h): rows 0 .. D / 32 - 1 are the
// key's block scales, row D / 32 the value's.
inline int64_t scale_index(int64_t slot, int64_t row, int64_t dim) {
  return ((slot / int8_dots::LANES) * (dim / int8_dots::BLOCK + 1) + row) * int8_dots::LANES + slot % int8_dots::LANES;
}

// An int8 cache (int8_dots.h): each KV head's keys and values in tiles of 16 slots, and their scales
// [slots / 16][D / 32 + 1][16] fp32. `slots` is a multiple of 16.
struct Int8Kv {
  uint8_t* keys;
  int8_t* values;
  float* scales;
  int64_t slots;

  float* head_scales(int64_t head, int64_t dim) const { return scales + head * slots * (dim / int8_dots::BLOCK + 1); }

  void write_key(int64_t head, int64_t slot, const float* rotated, int64_t dim) const {
    std::vector<int8_t> codes(dim);
    for (int64_t b = 0; b < dim / int8_dots::BLOCK; ++b) {
      head_scales(head, dim)[scale_index(slot, b, dim)] =
          int8_dots::quantize(rotated + b * int8_dots::BLOCK, codes.data() + b * int8_dots::BLOCK, int8_dots::BLOCK);
    }
    int8_dots::store_key(codes.data(), keys + head * slots * dim, slot, static_cast<int>(dim));
  }
  template <typename T>
  void write_value(int64_t head, int64_t slot, const T* value, int64_t dim) const {
    std::vector<float> x(dim);
    for (int64_t d = 0; d < dim; ++d) x[d] = load(value[d]);
    std::vector<int8_t> codes(dim);
    head_scales(head, dim)[scale_index(slot, dim / int8_dots::BLOCK, dim)] =
        int8_dots::quantize(x.data(), codes.data(), static_cast<int>(dim));
    int8_dots::store_value(codes.data(), values + head * slots * dim, slot, static_cast<int>(dim));
  }
};

// Tree slots row r attends, in depth order: of the `span` slots after the prefix (the rows' own the last `rows`
// of them), those its mask row [span] marks up to its own slot (row 0 alone without a mask: a decode step).
inline std::vector<std::vector<int64_t>> tails_of(int64_t rows, int64_t prefix,
                                                 const std::optional<at::Tensor>& mask) {
  std::vector<std::vector<int64_t>> tails(rows);
  const int64_t span = mask ? mask->size(1) : rows, before = span - rows;
  const bool* visible = mask ? mask->data_ptr<bool>() : nullptr;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j <= before + r; ++j) {
      if (!visible || visible[r * span + j]) tails[r].push_back(prefix + j);
    }
  }
  return tails;
}

// f(std::integral_constant<int, D>) for the head dimension D = dim: the attention kernels are compiled for these.
template <typename F>
inline void with_head_dim(int64_t dim, F&& f) {
  switch (dim) {
    case 64: return f(std::integral_constant<int, 64>{});
    case 96: return f(std::integral_constant<int, 96>{});
    case 128: return f(std::integral_constant<int, 128>{});
    case 256: return f(std::integral_constant<int, 256>{});
    default: TORCH_CHECK(false, "head_dim must be 64, 96, 128 or 256");
  }
}

// Rotate the rows' queries and keys, write keys and values to the cache at positions [written, written + rows),
// and attend: through `tails` (a tree: one per row), else causally (written = prefix). The cache's slot 0 holds
// position `first` (0 but in a sliding window's cache).
template <typename T, typename Kv>
void attention(const Layer& layer, const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
               const Kv& cache, int64_t first, int64_t prefix, int64_t written,
               const std::vector<std::vector<int64_t>>* tails, at::Tensor& out, const Decoder& decoder,
               float* kept_queries);

// `attention` compiled for activations T over a cache KV: each attention_*.cpp names the pairs of its kind of cache.
#define CPU_DECODER_ATTENTION(T, KV)                                                                                \
  template void attention<T, KV>(const Layer&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const KV&, \
                                 int64_t, int64_t, int64_t, const std::vector<std::vector<int64_t>>*, at::Tensor&,  \
                                 const Decoder&, float*)

// queries [n, D] . keys [k, D] (bf16, k in 16s) as a bf16 cache's attention scores them, the n queries together
// (`Bf16Scores`), for the test that holds them to a model of their arithmetic; compiled beside that attention.
at::Tensor bf16_scores(const at::Tensor& queries, const at::Tensor& keys);

}  // namespace cpu_decoder
