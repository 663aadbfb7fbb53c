// The decoder as the Python module builds it (cpu_decoder.cpp): its projections, layers and shape, and the forwards
// over them (decoder.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "gguf/matmul.h"

namespace cpu_decoder {

struct Linear {
  // y = x W^T + bias, with W dense (int8 codes times `dense_scales`, one per 32 inputs), the sum of 4-bit planes
  // (packed codes + scales/zeros per group), or GGUF block-quantized matrices stacked along their rows (gguf/matmul.h).
  at::Tensor dense, dense_scales;
  std::vector<at::Tensor> packed, scales;
  int64_t group = 0;
  std::vector<gguf::Matrix> blocks;
  std::optional<at::Tensor> bias;

  at::Tensor operator()(const at::Tensor& x) const;
  // The dense weight's values: int8 codes times their scales (for ATen's product, on builds without the kernels).
  at::Tensor dense_values() const;
};

struct Projection {
  // Outputs of its parts side by side (one part when the projections could be stacked).
  std::vector<Linear> parts;

  at::Tensor operator()(const at::Tensor& x) const;
};

// A norm's weight is in the activations' dtype (Llama's RMSNorm: two roundings) or fp32 (Gemma's: one).
struct Layer {
  Projection qkv, o, gate_up, down;
  at::Tensor attention_norm, mlp_norm;
  at::Tensor q_norm, k_norm;  // the RMSNorm of each head's query and key before RoPE [D] (qwen3, gemma3), or undefined
  at::Tensor attention_output_norm, mlp_output_norm;  // gemma3's norms of each half's output, or undefined
  int64_t window = 0;  // a sliding window: a row at position p sees the keys at p - window + 1 .. p; 0: all
  int64_t rope = 0;    // which of the forward's cos / sin tables rotates this layer
};

enum class Activation { SiLU, GeluTanh };

struct Decoder {
  std::vector<Layer> layers;
  at::Tensor final_norm;
  int64_t heads = 0, kv_heads = 0, head_dim = 0, intermediate = 0;
  double eps = 1e-5, scale = 1.0;
  Activation activation = Activation::SiLU;
  int64_t rotary_dims = 0;  // RoPE turns a head's first dims, in pairs (d, d + rotary_dims / 2); the rest pass
  float residual_scale = 1.0f;  // each half's output times this as it joins the residual stream (Granite's)
  float attention_cap = 0.0f;  // scores soft-capped to (-cap, cap) before the softmax (Gemma 2's); 0: none
};

// EAGLE-3's draft layer (drafters/eagle3/model.py): one Llama layer whose q / k / v read the token's embedding and
// a hidden state side by side, each normed, around the hidden state (or its norm) as the residual; then the draft's
// final norm and LM head. Its attention and MLP are the decoder's (`attention_half`, `layer_rest`).
struct Eagle3Layer {
  Decoder decoder;  // one layer: its attention norm is the hidden state's, its final norm the head's
  at::Tensor embed_norm;
  Projection head;
  bool norm_before_residual = false;
};

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
                                int64_t query_layer);

// hidden (fc's output, or the layer's own output a depth on) and embeds [rows, H], cos / sin [rows, D] fp32 ->
// [the layer's outputs [rows, H], their logits [rows (the last only with `last_only`), draft vocabulary]].
// keys / values: the draft's cache [kv_heads, slots, D] in the activations' dtype, written and read as `forward`
// does its layers' (mask included).
std::vector<at::Tensor> eagle3_forward(const Eagle3Layer& draft, const at::Tensor& hidden, const at::Tensor& embeds,
                                       const at::Tensor& cos, const at::Tensor& sin, at::Tensor keys,
                                       at::Tensor values, int64_t prefix, const std::optional<at::Tensor>& mask,
                                       bool last_only);

}  // namespace cpu_decoder
