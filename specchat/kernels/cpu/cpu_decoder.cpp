// The CPU decoder as a Python module: its parts built from Python (Linear, Projection, Layer, Decoder, Eagle3Layer),
// its forwards (decoder.cpp), the GGUF kernels' functions (gguf/python.h), and a few kernels exposed for tests.

#include <ATen/Parallel.h>
#include <torch/csrc/utils/pybind.h>

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "attention_kernels.h"
#include "decoder.h"
#include "dense_matmul.h"
#include "gguf/python.h"
#include "isa.h"

using namespace cpu_decoder;

// A forward's temporaries (in a 512-row prefill, megabytes a product) go back to glibc's heap and come from it again
// on the next forward: by default one over its mmap threshold was a mapping of its own, and the heap's top went back
// to the kernel past 128 KB free, so every forward faulted in and zeroed its pages afresh (with products that stood in
// fp32 too: 3.5M page faults in two 2048-token prefills of the 1.5B on a Xeon, 0.15M now). 32 MB is the largest
// threshold glibc takes; the heap keeps up to 256 MB free at its top.
static void reuse_freed_memory() {
#ifdef __GLIBC__
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  reuse_freed_memory();
  m.def("isa", &isa, "The instruction set this build's kernels use.");
  m.def("exponentials", [](at::Tensor row) {
    at::Tensor out = row.to(at::kFloat).contiguous().clone();
    const float total = exponentials(out.data_ptr<float>(), out.numel());
    return std::make_tuple(out, total);
  }, "exp(row - max(row)) and its total, as attention's softmax computes them (for tests).");
  m.def("soft_cap", [](at::Tensor x, double cap) {
    TORCH_CHECK(cap > 0, "a soft cap is positive");
    at::Tensor out = x.to(at::kFloat).contiguous().clone();
    float* data = out.data_ptr<float>();
    const int64_t n = out.numel();
    at::parallel_for(0, (n + LANES - 1) / LANES, 1024, [&](int64_t begin, int64_t end) {  // 16 values a chunk
      soft_cap(data + begin * LANES, std::min(end * LANES, n) - begin * LANES, static_cast<float>(cap));
    });
    return out.to(x.scalar_type());
  }, "cap * tanh(x / cap), as attention's scores are capped (Gemma 2's logits too), in x's dtype.");
  m.def("bf16_scores", &bf16_scores,
        "queries [n, D] . keys [k, D] (bf16, k in 16s) as a bf16 cache's attention scores them, the n queries together.");
  // The classes are the module's own: two builds loaded in one process (tests, A/B scripts) each register theirs.
  const py::module_local local;
  py::class_<Linear>(m, "Linear", local)
      .def_static("dense", [](at::Tensor weight, std::optional<at::Tensor> bias) {
        Linear linear;
        linear.dense = dense_matmul::in_whole_chunks(weight);
        linear.bias = bias;
        return linear;
      })
      .def_static("int8", [](at::Tensor codes, at::Tensor scales, std::optional<at::Tensor> bias) {
        TORCH_CHECK(codes.dim() == 2 && codes.scalar_type() == at::kChar && codes.size(1) % dense_matmul::kScaled == 0,
                    "int8 codes [out, in], in in 32s");
        TORCH_CHECK(scales.dim() == 2 && scales.size(0) == codes.size(0) &&
                    scales.size(1) == codes.size(1) / dense_matmul::kScaled, "an int8 weight's scales are [out, in / 32]");
        Linear linear;
        linear.dense = codes.contiguous();
        linear.dense_scales = scales.to(at::kFloat).contiguous();
        linear.bias = bias;
        return linear;
      })
      .def_static("int4", [](std::vector<at::Tensor> packed, std::vector<at::Tensor> scales, int64_t group,
                             std::optional<at::Tensor> bias) {
        Linear linear;
        linear.packed = packed;
        linear.scales = scales;
        linear.group = group;
        linear.bias = bias;
        return linear;
      });
  m.def("gguf_linear", [](std::vector<at::Tensor> blocks, std::vector<int64_t> types, std::vector<int64_t> unit_rows,
                          int64_t cols, std::optional<at::Tensor> bias) {
    Linear linear;
    linear.blocks = gguf::matrices(blocks, types, unit_rows, cols);
    linear.bias = bias;
    return linear;
  });
  m.def("dense_matmul", [](at::Tensor x, at::Tensor weight, std::optional<at::Tensor> scales) {
    TORCH_CHECK(dense_matmul::takes(x, weight),
                "dense_matmul takes bf16 activations and a bf16 or fp16 weight, or fp32 or fp16 activations and an "
                "fp16 or fp32 weight, or any of them and int8 codes, inputs in 32s, on an x86 build");
    return dense_matmul::matmul(x, weight, scales.value_or(at::Tensor()));
  }, "x [rows, in] . weight [out, in]^T in fp32: bf16 x bf16 or fp16, fp32 or fp16 x fp16 or fp32, any x int8 codes "
     "times their `scales` [out, in / 32] (dense_matmul.h).", py::arg("x"), py::arg("weight"),
     py::arg("scales") = py::none());
  gguf::define_functions(m);
  py::class_<Projection>(m, "Projection", local)
      .def(py::init([](std::vector<Linear> parts) { return Projection{parts}; }))
      .def("__call__", &Projection::operator(), "x [rows, in] -> [rows, out] in x's dtype (an output head's logits).");
  const auto held = [](const std::optional<at::Tensor>& tensor) { return tensor ? tensor->contiguous() : at::Tensor(); };
  py::class_<Layer>(m, "Layer", local).def(
      py::init([held](Projection qkv, Projection o, Projection gate_up, Projection down, at::Tensor attention_norm,
                      at::Tensor mlp_norm, std::optional<at::Tensor> q_norm, std::optional<at::Tensor> k_norm,
                      std::optional<at::Tensor> attention_output_norm, std::optional<at::Tensor> mlp_output_norm,
                      int64_t window, int64_t rope) {
        TORCH_CHECK(window >= 0, "a window is a number of keys");
        return Layer{qkv, o, gate_up, down, attention_norm.contiguous(), mlp_norm.contiguous(), held(q_norm),
                     held(k_norm), held(attention_output_norm), held(mlp_output_norm), window, rope};
      }),
      py::arg("qkv"), py::arg("o"), py::arg("gate_up"), py::arg("down"), py::arg("attention_norm"),
      py::arg("mlp_norm"), py::arg("q_norm") = py::none(), py::arg("k_norm") = py::none(),
      py::arg("attention_output_norm") = py::none(), py::arg("mlp_output_norm") = py::none(), py::arg("window") = 0,
      py::arg("rope") = 0);
  py::class_<Decoder>(m, "Decoder", local).def(py::init([](std::vector<Layer> layers, at::Tensor final_norm,
                                                      int64_t heads, int64_t kv_heads, int64_t head_dim,
                                                      int64_t intermediate, double eps, double scale,
                                                      const std::string& activation, int64_t rotary_dims,
                                                      double residual_scale, double attention_cap) {
    TORCH_CHECK(activation == "silu" || activation == "gelu_tanh", "the MLP's activation must be silu or gelu_tanh");
    rotary_dims = rotary_dims ? rotary_dims : head_dim;
    TORCH_CHECK(rotary_dims > 0 && rotary_dims <= head_dim && rotary_dims % 2 == 0, "rotary_dims must be even, <= D");
    return Decoder{layers, final_norm.contiguous(), heads, kv_heads, head_dim, intermediate, eps, scale,
                   activation == "silu" ? Activation::SiLU : Activation::GeluTanh, rotary_dims,
                   static_cast<float>(residual_scale), static_cast<float>(attention_cap)};
  }), py::arg("layers"), py::arg("final_norm"), py::arg("heads"), py::arg("kv_heads"), py::arg("head_dim"),
      py::arg("intermediate"), py::arg("eps"), py::arg("scale"), py::arg("activation") = "silu",
      py::arg("rotary_dims") = 0, py::arg("residual_scale") = 1.0, py::arg("attention_cap") = 0.0);
  m.def("forward", &forward, "The decoder's layers and final norm over the rows (see the source).",
        py::arg("decoder"), py::arg("x"), py::arg("cos"), py::arg("sin"), py::arg("keys"), py::arg("values"),
        py::arg("prefix"), py::arg("mask"), py::arg("last_only"), py::arg("scales") = py::none(),
        py::arg("every_layer") = false, py::arg("feature_layers") = std::vector<int64_t>{},
        py::arg("firsts") = std::vector<int64_t>{}, py::arg("query_layer") = -1);
  py::class_<Eagle3Layer>(m, "Eagle3Layer", local).def(py::init([](Decoder decoder, at::Tensor embed_norm, Projection head,
                                                              bool norm_before_residual) {
    return Eagle3Layer{decoder, embed_norm.contiguous(), head, norm_before_residual};
  }));
  m.def("eagle3_forward", &eagle3_forward, "EAGLE-3's draft layer and head over the rows (see the source).",
        py::arg("draft"), py::arg("hidden"), py::arg("embeds"), py::arg("cos"), py::arg("sin"), py::arg("keys"),
        py::arg("values"), py::arg("prefix"), py::arg("mask"), py::arg("last_only") = false);
}
