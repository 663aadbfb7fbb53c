// A Llama-family decoder forward for CPUs in one call: every layer, no Python between the operations. Gemma 3's
// layers are the same with more norms (each half's output), GELU and sliding windows (`Layer`, `Decoder`).
//
// A decode step of a small model is a few hundred operations of a few microseconds each; run one by one
// from Python they cost more than the matmuls. Here the matmuls are our own (GGUF blocks: gguf/matmul.h; dense ones
// on x86: dense_matmul.h) or ATen's (the 4-bit kernel, dense products on other CPUs), and what lies between them
// (RMSNorm, rotary, the cache write, tree attention, SiLU-gating, residuals) is plain loops over the rows.
//
// Exactness: every row's attention sums over its keys in position order (the committed prefix, then its
// ancestors by depth, itself last) with a fixed lane layout, so a verified tree node gets bitwise what a
// decode step at its position gets, whatever the tree around it. The norms and elementwise parts are per
// row; the 4-bit kernel computes each row on its own (tested in tests/test_quant.py). A bf16 cache is read in
// bf16 dot-product arithmetic (bf16_dots.h), its value rows summed in pairs by their index in that order.

#include "decoder.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_weight_int4pack_mm_for_cpu.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/linear.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

#include "attention.h"
#include "dense_matmul.h"
#include "gguf/matmul.h"
#include "int8_dots.h"
#include "rows.h"

namespace cpu_decoder {

at::Tensor Linear::operator()(const at::Tensor& x) const {
  at::Tensor out;
  if (dense.defined()) {  // its inputs in whole chunks (`Linear.dense`): x's padded to match
    const at::Tensor xs = dense_matmul::in_whole_chunks(x);
    out = xs.dim() == 2 && dense_matmul::takes(xs, dense)
              ? dense_matmul::matmul(xs, dense, dense_scales, x.scalar_type())
              : at::linear(xs, dense_values().to(x.scalar_type()));
  } else if (!blocks.empty()) {
    const int64_t terms = x.scalar_type() == at::kFloat ? 2 : 1;  // fp32 activations: 16 bits of each value
    out = gguf::matmul(x, blocks, gguf::Path::Best, terms, x.scalar_type());
  } else {
    out = at::_weight_int4pack_mm_for_cpu(x, packed[0], group, scales[0]);
    for (size_t i = 1; i < packed.size(); ++i) {
      out.add_(at::_weight_int4pack_mm_for_cpu(x, packed[i], group, scales[i]));
    }
  }
  if (bias) out.add_(*bias);
  return out;
}

at::Tensor Linear::dense_values() const {
  if (!dense_scales.defined()) return dense;
  const at::Tensor codes = dense.to(at::kFloat).view({dense.size(0), dense_scales.size(1), -1});
  return codes.mul(dense_scales.unsqueeze(-1)).view({dense.size(0), -1});
}

at::Tensor Projection::operator()(const at::Tensor& x) const {
  if (parts.size() == 1) return parts[0](x);
  std::vector<at::Tensor> outs;
  for (const auto& part : parts) outs.push_back(part(x));
  return at::cat(outs, -1);
}

// x[r] += y[r], rounded once.
template <typename T>
void add_into(T* x, const T* y, int64_t count) {
  for (int64_t i = 0; i < count; ++i) x[i] = store<T>(load(x[i]) + load(y[i]));
}

// gate_up [rows, 2 I] -> [rows, I]: act(gate) * up, rounded once. SiLU is g / (1 + exp(-g)); GELU's tanh form
// 0.5 g (1 + tanh(u)) is the same with 2u for g, u = sqrt(2 / pi) (g + 0.044715 g^3). Eight columns at a time
// (each column's operations the same one by one or in a vector), split over the threads: one by one on one thread it
// took a tenth of a tree's forward of the 1.5B on a Zen 3 while the other thread waited.
template <typename T>
void gate(const T* gate_up, T* out, int64_t rows, int64_t intermediate, Activation activation) {
  constexpr float kGeluScale = 2.0f * 0.7978845608028654f;  // 2 sqrt(2 / pi)
  constexpr float kCube = 0.044715f;
  const int64_t blocks = (intermediate + 7) / 8;
  at::parallel_for(0, rows * blocks, 256, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t r = b / blocks, first = b % blocks * 8, last = std::min(first + 8, intermediate);
      const T* gates = gate_up + r * 2 * intermediate;
      const T* up = gates + intermediate;
      T* gated = out + r * intermediate;
#if defined(__AVX2__) && defined(__FMA__)
      if constexpr (kVector8<T>) {
        if (last - first == 8) {
          const __m256 g = load8(gates + first);
          __m256 z = g;
          if (activation != Activation::SiLU) {  // ((c g) g) g, as one by one
            const __m256 cubed = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(kCube), g), g), g);
            z = _mm256_mul_ps(_mm256_set1_ps(kGeluScale), _mm256_add_ps(g, cubed));
          }
          const __m256 e = exp8(_mm256_xor_ps(z, _mm256_set1_ps(-0.0f)));  // exp(-z)
          store8(gated + first, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)),
                                              load8(up + first)));
          continue;
        }
      }
#endif
      for (int64_t c = first; c < last; ++c) {
        const float g = load(gates[c]);
        const float z = activation == Activation::SiLU ? g : kGeluScale * (g + kCube * g * g * g);
        gated[c] = store<T>(g / (1.0f + exp_approx(-z)) * load(up[c]));
      }
    }
  });
}

// A layer's attention half over its cache (slot 0 at position `first`): queries, keys and values projected from
// `normed`, the rows written at positions [prefix + span - rows, prefix + span) and attending as `mask` [rows, span]
// says (none: causally, span = rows); the heads' outputs in `attended`.
template <typename T>
void attention_half(const Layer& layer, const Decoder& decoder, const at::Tensor& normed, const at::Tensor& cos,
                    const at::Tensor& sin, at::Tensor& keys, at::Tensor& values, const at::Tensor* scales,
                    int64_t first, int64_t prefix, const std::optional<at::Tensor>& mask,
                    const std::vector<std::vector<int64_t>>& tails, at::Tensor& attended, float* kept) {
  const at::Tensor qkv = layer.qkv(normed).contiguous();
  const int64_t written = prefix + (mask ? mask->size(1) : qkv.size(0)) - qkv.size(0);
  const auto* tree = mask ? &tails : nullptr;
  const int64_t slots = keys.size(1);
  if (scales) {
    const Int8Kv cache{keys.data_ptr<uint8_t>(), values.data_ptr<int8_t>(), scales->data_ptr<float>(), slots};
    attention<T>(layer, qkv, cos, sin, cache, first, prefix, written, tree, attended, decoder, kept);
  } else if (keys.scalar_type() == at::kBFloat16) {  // the activations' dtype, or bf16 beside fp32 (`forward`)
    if constexpr (std::is_same_v<T, at::Half>) {
      TORCH_CHECK(false, "a bf16 cache does not run beside fp16 activations");
    } else {
      const PlainKv<at::BFloat16> cache{keys.data_ptr<at::BFloat16>(), values.data_ptr<at::BFloat16>(), slots};
      attention<T>(layer, qkv, cos, sin, cache, first, prefix, written, tree, attended, decoder, kept);
    }
  } else {
    const PlainKv<T> cache{keys.data_ptr<T>(), values.data_ptr<T>(), slots};
    attention<T>(layer, qkv, cos, sin, cache, first, prefix, written, tree, attended, decoder, kept);
  }
}

// x += y [rows, hidden], or with `norm` defined x += its RMSNorm of y (y normed in place); y times `scale` first
// where it is not 1, rounded once with the sum.
template <typename T>
void add_output(T* x, at::Tensor& y, const at::Tensor& norm, float eps, float scale) {
  const int64_t rows = y.size(0), hidden = y.size(1);
  if (norm.defined()) rms_norm<T>(y.data_ptr<T>(), norm, y.data_ptr<T>(), rows, hidden, eps);
  const T* added = y.data_ptr<T>();
  if (scale == 1.0f) return add_into<T>(x, added, rows * hidden);
  for (int64_t i = 0; i < rows * hidden; ++i) x[i] = store<T>(load(x[i]) + load(added[i]) * scale);
}

// The rest of a layer after its attention: x += o(attended), then x += down(act(gate) * up) of x's norm (each
// half's output normed first where the layer has those norms).
template <typename T>
void layer_rest(const Layer& layer, const Decoder& decoder, at::Tensor& x, const at::Tensor& attended,
                at::Tensor& normed, at::Tensor& gated) {
  const int64_t rows = x.size(0), hidden = x.size(1);
  const float eps = static_cast<float>(decoder.eps);
  at::Tensor projected = layer.o(attended).contiguous();
  add_output<T>(x.data_ptr<T>(), projected, layer.attention_output_norm, eps, decoder.residual_scale);
  rms_norm<T>(x.data_ptr<T>(), layer.mlp_norm, normed.data_ptr<T>(), rows, hidden, eps);
  const at::Tensor gate_up = layer.gate_up(normed).contiguous();
  gate<T>(gate_up.data_ptr<T>(), gated.data_ptr<T>(), rows, decoder.intermediate, decoder.activation);
  at::Tensor down = layer.down(gated).contiguous();
  add_output<T>(x.data_ptr<T>(), down, layer.mlp_output_norm, eps, decoder.residual_scale);
}

template <typename T>
std::vector<at::Tensor> forward_typed(const Decoder& decoder, at::Tensor x, const at::Tensor& cos,
                                      const at::Tensor& sin, std::vector<at::Tensor>& keys,
                                      std::vector<at::Tensor>& values, const std::vector<at::Tensor>* scales,
                                      const std::vector<int64_t>& firsts, int64_t prefix,
                                      const std::optional<at::Tensor>& mask, bool last_only, bool every_layer,
                                      const std::vector<int64_t>& feature_layers, size_t query_layer) {
  const int64_t rows = x.size(0), hidden = x.size(1);
  const float eps = static_cast<float>(decoder.eps);
  const auto tails = mask ? tails_of(rows, prefix, mask) : std::vector<std::vector<int64_t>>{};
  at::Tensor normed = at::empty_like(x);
  at::Tensor attended = at::empty({rows, decoder.heads * decoder.head_dim}, x.options());
  at::Tensor gated = at::empty({rows, decoder.intermediate}, x.options());
  const int64_t kept_layers = every_layer ? static_cast<int64_t>(decoder.layers.size()) : 1;
  at::Tensor queries = at::empty({kept_layers, rows, decoder.heads, decoder.head_dim}, x.options().dtype(at::kFloat));
  const int64_t kept_features = static_cast<int64_t>(feature_layers.size());
  at::Tensor features = at::empty({rows, kept_features * hidden}, x.options());
  const auto keep_features = [&](int64_t layer) {  // the residual stream as it enters `layer`
    for (int64_t k = 0; k < kept_features; ++k)
      if (feature_layers[k] == layer) features.narrow(1, k * hidden, hidden).copy_(x);
  };
  for (size_t i = 0; i < decoder.layers.size(); ++i) {
    const Layer& layer = decoder.layers[i];
    keep_features(static_cast<int64_t>(i));
    rms_norm<T>(x.data_ptr<T>(), layer.attention_norm, normed.data_ptr<T>(), rows, hidden, eps);
    float* kept = every_layer ? queries[i].data_ptr<float>()
                  : i == query_layer ? queries[0].data_ptr<float>() : nullptr;
    attention_half<T>(layer, decoder, normed, cos, sin, keys[i], values[i], scales ? &(*scales)[i] : nullptr,
                      firsts[i], prefix, mask, tails, attended, kept);
    layer_rest<T>(layer, decoder, x, attended, normed, gated);
  }
  keep_features(static_cast<int64_t>(decoder.layers.size()));
  at::Tensor last = last_only ? x.slice(0, rows - 1) : x;
  at::Tensor out = at::empty_like(last);
  rms_norm<T>(last.data_ptr<T>(), decoder.final_norm, out.data_ptr<T>(), last.size(0), hidden, eps);
  return {out, x, every_layer ? queries : queries[0], features};
}

void check_mask(const std::optional<at::Tensor>& mask, int64_t rows) {
  if (mask) TORCH_CHECK(mask->scalar_type() == at::kBool && mask->dim() == 2 && mask->size(0) == rows &&
                            mask->size(1) >= rows && mask->is_contiguous(),
                        "mask must be a contiguous [rows, span >= rows] bool");
}

// x [rows, hidden] (the embedded tokens) -> [final-normed rows (the last only with `last_only`), the last
// layer's output before the final norm, layer `query_layer`'s rotated queries [rows, heads, D] fp32 (-1: the last
// layer's; with `every_layer` every layer's, [layers, rows, heads, D]), the residual stream entering each of `feature_layers`
// side by side [rows, len(feature_layers) * hidden] (layer count: the last layer's output)]. keys /
// values: each layer's cache [kv_heads, slots, D] in the activations' dtype (or bf16 beside fp32 ones), written at
// [prefix, prefix + rows); with `scales` (each layer's [kv_heads, slots / 16, D / 32 + 1, 16] fp32) an int8 cache
// instead: keys uint8, values int8 and scales as int8_dots.h lays them out, slots a multiple of 16. mask [rows, span]
// bool: a tree (`tails_of`: the rows are the last of `span` slots after the prefix, and see those their row marks, up
// to their own); none: causal. cos / sin [rows, D] fp32, or [ropes, rows, D] with a table per `Layer::rope`. `firsts`:
// the position each layer's slot 0 holds (none: 0 for all): a sliding-window layer's cache may keep only the last
// positions, down to the first its earliest row sees.
std::vector<at::Tensor> forward(const Decoder& decoder, const at::Tensor& embedded, const at::Tensor& cos,
                                const at::Tensor& sin, std::vector<at::Tensor> keys, std::vector<at::Tensor> values,
                                int64_t prefix, const std::optional<at::Tensor>& mask, bool last_only,
                                const std::optional<std::vector<at::Tensor>>& scales, bool every_layer,
                                const std::vector<int64_t>& feature_layers, const std::vector<int64_t>& firsts,
                                int64_t query_layer) {
  TORCH_CHECK(embedded.dim() == 2, "x must be [rows, hidden]");
  with_head_dim(decoder.head_dim, [](auto) {});
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat, "cos/sin must be float32");
  TORCH_CHECK(cos.size(-1) == decoder.rotary_dims && sin.sizes() == cos.sizes(), "cos/sin must be [..., rotary dims]");
  for (const Layer& layer : decoder.layers) {
    TORCH_CHECK(cos.dim() == 2 || (layer.rope >= 0 && layer.rope < cos.size(0)), "a layer's rope has no cos / sin");
    TORCH_CHECK(!layer.window || !scales, "an int8 cache does not run sliding-window layers");
  }
  TORCH_CHECK(keys.size() == decoder.layers.size() && values.size() == keys.size(), "one cache per layer");
  TORCH_CHECK(firsts.empty() || firsts.size() == keys.size(), "one first position per layer");
  const int64_t layers = static_cast<int64_t>(keys.size());
  TORCH_CHECK(-1 <= query_layer && query_layer < layers, "the query layer is out of range");
  const size_t kept_layer = query_layer < 0 ? keys.size() - 1 : static_cast<size_t>(query_layer);
  const std::vector<int64_t> held_from = firsts.empty() ? std::vector<int64_t>(keys.size()) : firsts;
  const int64_t rows = embedded.size(0);
  for (size_t i = 0; i < keys.size(); ++i) {
    const int64_t first = held_from[i], window = decoder.layers[i].window;
    TORCH_CHECK(first == 0 || (window && first >= 0 && first <= std::max<int64_t>(0, prefix - window + 1)),
                "only a sliding window's cache may start past position 0, and not past its first row's window");
    TORCH_CHECK(keys[i].is_contiguous() && values[i].is_contiguous(), "caches must be contiguous");
    TORCH_CHECK(prefix + (mask ? mask->size(1) : rows) - first <= keys[i].size(1), "the cache has no room for the rows");
    if (!scales) {
      const at::ScalarType held = keys[i].scalar_type();
      const bool beside_fp32 = held == at::kBFloat16 && embedded.scalar_type() == at::kFloat;
      TORCH_CHECK(values[i].scalar_type() == held && (held == embedded.scalar_type() || beside_fp32),
                  "caches must have the activations' dtype, or bf16 beside fp32 activations");
      continue;
    }
    const at::Tensor& scale = (*scales)[i];
    TORCH_CHECK(keys[i].scalar_type() == at::kByte && values[i].scalar_type() == at::kChar,
                "an int8 cache's keys must be uint8 and its values int8");
    TORCH_CHECK(keys[i].size(1) % int8_dots::LANES == 0 && values[i].sizes() == keys[i].sizes(),
                "an int8 cache's keys and values must be [kv_heads, slots, D], slots a multiple of 16");
    const int64_t tiles = keys[i].size(1) / int8_dots::LANES, scale_rows = decoder.head_dim / int8_dots::BLOCK + 1;
    TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() &&
                    scale.sizes() == at::IntArrayRef({keys[i].size(0), tiles, scale_rows, int8_dots::LANES}),
                "an int8 cache's scales must be a contiguous [kv_heads, slots / 16, D / 32 + 1, 16] float32");
  }
  if (scales) TORCH_CHECK(scales->size() == keys.size(), "one scale tensor per layer");
  for (const int64_t layer : feature_layers)
    TORCH_CHECK(0 <= layer && layer <= static_cast<int64_t>(keys.size()), "a feature layer is out of range");
  check_mask(mask, rows);
  at::Tensor x = embedded.contiguous().clone();
  at::Tensor c = cos.contiguous(), s = sin.contiguous();
  const std::vector<at::Tensor>* int8_scales = scales ? &*scales : nullptr;
  switch (x.scalar_type()) {
    case at::kFloat:
      return forward_typed<float>(decoder, x, c, s, keys, values, int8_scales, held_from, prefix, mask, last_only,
                                     every_layer, feature_layers, kept_layer);
    case at::kBFloat16:
      return forward_typed<at::BFloat16>(decoder, x, c, s, keys, values, int8_scales, held_from, prefix, mask, last_only,
                                            every_layer, feature_layers, kept_layer);
    case at::kHalf:
      return forward_typed<at::Half>(decoder, x, c, s, keys, values, int8_scales, held_from, prefix, mask, last_only,
                                     every_layer, feature_layers, kept_layer);
    default: TORCH_CHECK(false, "activations must be float32, bfloat16 or float16");
  }
}

template <typename T>
std::vector<at::Tensor> eagle3_typed(const Eagle3Layer& draft, const at::Tensor& hidden, const at::Tensor& embeds,
                                     const at::Tensor& cos, const at::Tensor& sin, at::Tensor& keys,
                                     at::Tensor& values, int64_t prefix, const std::optional<at::Tensor>& mask,
                                     bool last_only) {
  const Decoder& decoder = draft.decoder;
  const Layer& layer = decoder.layers[0];
  const int64_t rows = hidden.size(0), width = hidden.size(1);
  const float eps = static_cast<float>(decoder.eps);
  at::Tensor normed_embeds = at::empty_like(embeds), normed = at::empty_like(hidden);
  rms_norm<T>(embeds.data_ptr<T>(), draft.embed_norm, normed_embeds.data_ptr<T>(), rows, width, eps);
  rms_norm<T>(hidden.data_ptr<T>(), layer.attention_norm, normed.data_ptr<T>(), rows, width, eps);
  const at::Tensor both = at::cat({normed_embeds, normed}, 1);
  at::Tensor x = draft.norm_before_residual ? normed.clone() : hidden.clone();
  at::Tensor attended = at::empty({rows, decoder.heads * decoder.head_dim}, hidden.options());
  at::Tensor gated = at::empty({rows, decoder.intermediate}, hidden.options());
  const auto tails = mask ? tails_of(rows, prefix, mask) : std::vector<std::vector<int64_t>>{};
  attention_half<T>(layer, decoder, both, cos, sin, keys, values, nullptr, 0, prefix, mask, tails, attended, nullptr);
  layer_rest<T>(layer, decoder, x, attended, normed, gated);
  const int64_t first = last_only ? rows - 1 : 0;
  rms_norm<T>(x.data_ptr<T>() + first * width, decoder.final_norm, normed.data_ptr<T>(), rows - first, width, eps);
  return {x, draft.head(normed.slice(0, 0, rows - first))};
}

// hidden (fc's output, or the layer's own output a depth on) and embeds [rows, H], cos / sin [rows, D] fp32 ->
// [the layer's outputs [rows, H], their logits [rows (the last only with `last_only`), draft vocabulary]].
// keys / values: the draft's cache [kv_heads, slots, D] in the activations' dtype, written and read as `forward`
// does its layers' (mask included).
std::vector<at::Tensor> eagle3_forward(const Eagle3Layer& draft, const at::Tensor& hidden, const at::Tensor& embeds,
                                       const at::Tensor& cos, const at::Tensor& sin, at::Tensor keys,
                                       at::Tensor values, int64_t prefix, const std::optional<at::Tensor>& mask,
                                       bool last_only) {
  const Decoder& decoder = draft.decoder;
  const int64_t rows = hidden.size(0);
  TORCH_CHECK(decoder.layers.size() == 1, "an EAGLE-3 draft has one layer");
  with_head_dim(decoder.head_dim, [](auto) {});
  TORCH_CHECK(hidden.dim() == 2 && embeds.sizes() == hidden.sizes() && embeds.scalar_type() == hidden.scalar_type(),
              "hidden and embeds must be [rows, hidden] of one dtype");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat, "cos/sin must be float32");
  TORCH_CHECK(cos.size(-1) == decoder.rotary_dims && sin.sizes() == cos.sizes(), "cos/sin must be [..., rotary dims]");
  TORCH_CHECK(keys.is_contiguous() && values.is_contiguous() && keys.scalar_type() == hidden.scalar_type() &&
                  values.scalar_type() == hidden.scalar_type(),
              "the cache must be contiguous, in the activations' dtype");
  TORCH_CHECK(prefix + (mask ? mask->size(1) : rows) <= keys.size(1), "the cache has no room for the rows");
  check_mask(mask, rows);
  const at::Tensor h = hidden.contiguous(), e = embeds.contiguous(), c = cos.contiguous(), s = sin.contiguous();
  switch (h.scalar_type()) {
    case at::kFloat: return eagle3_typed<float>(draft, h, e, c, s, keys, values, prefix, mask, last_only);
    case at::kBFloat16: return eagle3_typed<at::BFloat16>(draft, h, e, c, s, keys, values, prefix, mask, last_only);
    case at::kHalf: return eagle3_typed<at::Half>(draft, h, e, c, s, keys, values, prefix, mask, last_only);
    default: TORCH_CHECK(false, "activations must be float32, bfloat16 or float16");
  }
}

}  // namespace cpu_decoder
