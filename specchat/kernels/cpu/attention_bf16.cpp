// `attention` over a bf16 cache, beside bf16 or fp32 activations (`attend_bf16`, `attend_bf16_tiles`), and its scores
// alone for a test (`bf16_scores`).
#include "attention_kernels.h"

#include <ATen/ops/empty.h>

namespace cpu_decoder {

CPU_DECODER_ATTENTION(at::BFloat16, PlainKv<at::BFloat16>);
CPU_DECODER_ATTENTION(float, PlainKv<at::BFloat16>);

at::Tensor bf16_scores(const at::Tensor& queries, const at::Tensor& keys) {
  TORCH_CHECK(queries.dim() == 2 && keys.dim() == 2 && queries.size(1) == keys.size(1), "[n, D] and [k, D]");
  TORCH_CHECK(keys.size(0) % LANES == 0, "keys come in tiles of 16");
  const at::Tensor q = queries.to(at::kFloat).contiguous(), k = keys.to(at::kBFloat16).contiguous();
  const int64_t n = q.size(0), count = k.size(0);
  at::Tensor out = at::empty({n, count}, q.options());
  float* const scores = out.data_ptr<float>();
  with_head_dim(q.size(1), [&](auto head_dim) {
    constexpr int DIM = decltype(head_dim)::value;
    const Bf16Scores<DIM> by_tiles(q.data_ptr<float>(), n, 1, 1);
    const auto* rows = reinterpret_cast<const uint16_t*>(k.data_ptr<at::BFloat16>());
    const bf16_dots::Arithmetic arithmetic;
    for (int64_t b = 0; b < count; b += LANES) {
      by_tiles.tile(rows + b * DIM, 0, n, [&](int64_t i) { return scores + i * count + b; });
    }
  });
  return out;
}

}  // namespace cpu_decoder
