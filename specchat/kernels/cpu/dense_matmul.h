// Dense weights times bf16 activation rows, the matrix read as it lies (row-major: a checkpoint's or an unquantized
// GGUF file's weights multiplied in place), each output's sum an order fixed by its own row alone, so a verified
// tree row is its decode step bit for bit, whatever rows share the call, on either path:
// - bf16 weights in bf16 dot-product arithmetic (bf16_dots.h): vdpbf16ps on AVX-512 BF16, the same bits through
//   fp32 fmas on AVX-512 without BF16 and on AVX2. Output j of activation row r sums x[r] . W[j] in 16 lanes, lane
//   l adding the products of inputs 32c + 2l + 1, then 32c + 2l, for c = 0, 1, ... in order;
// - fp16 weights (an F16 file's, or a model's run in fp16) in fp32: each weight converted exactly (vcvtph2ps), bf16
//   and fp16 activations too, fp32 ones as they are, lane l of an output adding the products of inputs 16c + l in
//   order by fmas, on AVX-512 and AVX2;
// - fp32 weights (a model in fp32) times fp32 or fp16 activations the same way: the fp32 product whose rows are
//   independent, where ATen's (oneDNN's) sums in an order that depends on the rows sharing the call;
// - int8 codes with an fp32 scale per 32 inputs (GGUF Q8_0: a tied LM head reading its embedding's codes) the same
//   way, each weight d * q exactly in fp32 (an fp16 d times 8 bits), times any activations converted exactly: the
//   bytes of 8 bits, the products of the dequantized matrix.
// The 16 lanes are then paired down as a key's are in attention.
//
// Weight rows go in blocks of 16 (the lanes of 16 outputs pair down together) and units of four blocks (a thread's
// share), inputs in slices of 2048 and activation rows in groups of 64, so that what a pass reads again stays in L2.
// A decode step's pass takes one weight row at a time: one stream of memory, which a Zen 5 reads ~12% faster than
// four rows side by side. Against ATen's bf16 product (oneDNN) on that Zen 5 (AVX-512 BF16;
// `scripts/dense_matmul_rows.py`), a Gemma 3 1B layer's MLP matrices take 0.57x its time at one row (they read the
// memory at 53 GB/s against 31), 0.66x at 8, 1.05x at 64 and 1.2x at 512 (oneDNN's packed panels reach the
// dot-product units' peak on a prompt; these row-major passes 0.6 of it); the AVX2 build against ATen's AVX2 product
// 1.0x at one row and 0.44x at four.
#pragma once

#include "bf16_dots.h"
#include "claims.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <memory>
#include <type_traits>
#include <vector>

namespace dense_matmul {

#if defined(BF16_DOTS_NATIVE) || defined(BF16_DOTS_AVX2)
constexpr bool kBuilt = true;
#else
constexpr bool kBuilt = false;  // portable builds (ARM) keep ATen's product: the lane-at-a-time loops are slow
#endif
constexpr int64_t kBlock = 16;    // weight rows whose outputs pair down together
constexpr int64_t kChunk = 32;    // inputs a lane sum steps over at once
constexpr int64_t kSlice = 2048;  // inputs a pass over a block takes: its 64 KB stay in L2 while every row passes
constexpr int64_t kUnit = 4;      // blocks a thread takes at once: 64 weight rows, every activation row read once for them
constexpr int64_t kRows = 64;     // activation rows whose lane sums a unit keeps at once (256 KB, in L2)

// `t` with its last dim (inputs) padded with zeros to whole chunks, on a build with the kernels: a weight stored so
// and its activations padded as they come run every width through `matmul` (each padded product adds an exact zero
// to its lane), so a model of any width computes its rows apart.
inline at::Tensor in_whole_chunks(const at::Tensor& t) {
  const int64_t pad = kBuilt ? (kChunk - t.size(-1) % kChunk) % kChunk : 0;
  return pad ? at::constant_pad_nd(t, {0, pad}) : t;
}

// Whether `matmul` takes these operands: bf16 activations and a bf16 or fp16 weight, or fp32 or fp16 activations and
// an fp16 or fp32 weight, or any of them and int8 codes; inputs in whole chunks, on a build with the kernels.
inline bool takes(const at::Tensor& x, const at::Tensor& weight) {
  const auto a = x.scalar_type(), w = weight.scalar_type();
  return kBuilt && weight.size(1) % kChunk == 0 &&
         ((a == at::kBFloat16 && (w == at::kBFloat16 || w == at::kHalf)) ||
          ((a == at::kFloat || a == at::kHalf) && (w == at::kHalf || w == at::kFloat)) ||
          ((a == at::kBFloat16 || a == at::kFloat || a == at::kHalf) && w == at::kChar));
}

constexpr int64_t kScaled = 32;  // inputs an int8 weight's scale covers

// The scale of an int8 weight's row `row` at input c (`scales` [rows][in / kScaled]); null for the other weights.
template <typename W>
inline const float* scale_at(const float* scales, int64_t row, int64_t in, int64_t c) {
  if constexpr (std::is_same_v<W, int8_t>) return scales + row * (in / kScaled) + c / kScaled;
  return nullptr;
}

// lanes[j][i][l] += lane l's products of activation row j and weight row i of a block (row stride `in`) over
// inputs [from, to), in order (from 0: lanes[j][i][l] = those). FETCH: the weights come from memory (a slice's first
// rows): each row's inputs are prefetched KEYS rows down, the next pass's (then the next block's, which lies there).
#ifdef BF16_DOTS_NATIVE
constexpr int QUERIES = 8;  // a prompt's rows eight at a time by two weight rows: 16 sums in registers
#elif defined(BF16_DOTS_AVX512)
constexpr int QUERIES = 4;  // four rows by four weight rows: 16 sums (eight by two ran 1.1-1.3x slower on Ice Lake)
#endif
#if defined(BF16_DOTS_NATIVE) || defined(BF16_DOTS_AVX512)
// Weight rows a pass for Q activation rows: for one or two, one (a single stream of memory reads fastest), for three
// or four, four (each activation load serves four sums, and the sums' chains keep the units busy), for eight two (16
// sums in registers); measured with scripts/dense_matmul_ab.py.
constexpr int keys_per_pass(int q) { return q > 4 ? 2 : q > 2 ? 4 : 1; }
// int8 weights, a byte each, are read faster than one weight row's chain of fmas (4 cycles a step) takes them: four
// rows a pass from one activation row on.
constexpr int int8_keys_per_pass(int q) { return q > 4 ? 2 : 4; }
#endif

#ifdef BF16_DOTS_NATIVE
template <int Q, bool FETCH>
inline void add_lanes(const uint16_t* const (&x)[Q], const uint16_t* w, int64_t in, int64_t from, int64_t to,
                      float (*const (&lanes)[Q])[16]) {
  constexpr int KEYS = keys_per_pass(Q);
  for (int i = 0; i < kBlock; i += KEYS) {
    __m512 sums[KEYS][Q];
    for (int k = 0; k < KEYS; ++k)
      for (int j = 0; j < Q; ++j) sums[k][j] = from == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(lanes[j][i + k]);
    for (int64_t c = from; c < to; c += kChunk) {
      __m512bh keys[KEYS];
      for (int k = 0; k < KEYS; ++k) {
        keys[k] = (__m512bh)_mm512_loadu_si512(w + (i + k) * in + c);
        if (FETCH) _mm_prefetch(reinterpret_cast<const char*>(w + (i + k + KEYS) * in + c), _MM_HINT_T0);
      }
      for (int j = 0; j < Q; ++j) {
        const __m512bh q = (__m512bh)_mm512_loadu_si512(x[j] + c);
        for (int k = 0; k < KEYS; ++k) sums[k][j] = _mm512_dpbf16_ps(sums[k][j], q, keys[k]);
      }
    }
    for (int k = 0; k < KEYS; ++k)
      for (int j = 0; j < Q; ++j) _mm512_storeu_ps(lanes[j][i + k], sums[k][j]);
  }
}
#elif defined(BF16_DOTS_AVX512)
// The native path's lanes in fp32 fmas (AVX-512 without BF16): each activation row given widened (`widen`: odd[j]
// and even[j] hold row j's odd and even inputs as fp32), each chunk of a weight row widened once for the Q rows,
// each lane the odd product, then the even one, into the sum.
template <int Q, bool FETCH>
inline void add_lanes(const float* const (&odd)[Q], const float* const (&even)[Q], const uint16_t* w, int64_t in,
                      int64_t from, int64_t to, float (*const (&lanes)[Q])[16]) {
  constexpr int KEYS = keys_per_pass(Q);
  for (int i = 0; i < kBlock; i += KEYS) {
    __m512 sums[KEYS][Q];
    for (int k = 0; k < KEYS; ++k)
      for (int j = 0; j < Q; ++j) sums[k][j] = from == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(lanes[j][i + k]);
    for (int64_t c = from; c < to; c += kChunk) {
      __m512 keys_odd[KEYS], keys_even[KEYS];
      for (int k = 0; k < KEYS; ++k) {
        const __m512i key = _mm512_loadu_si512(w + (i + k) * in + c);
        if (FETCH) _mm_prefetch(reinterpret_cast<const char*>(w + (i + k + KEYS) * in + c), _MM_HINT_T0);
        keys_odd[k] = bf16_dots::odd_halves(key), keys_even[k] = bf16_dots::even_halves(key);
      }
      for (int j = 0; j < Q; ++j) {
        const __m512 x_odd = _mm512_loadu_ps(odd[j] + c / 2), x_even = _mm512_loadu_ps(even[j] + c / 2);
        for (int k = 0; k < KEYS; ++k) {
          sums[k][j] = _mm512_fmadd_ps(x_odd, keys_odd[k], sums[k][j]);
          sums[k][j] = _mm512_fmadd_ps(x_even, keys_even[k], sums[k][j]);
        }
      }
    }
    for (int k = 0; k < KEYS; ++k)
      for (int j = 0; j < Q; ++j) _mm512_storeu_ps(lanes[j][i + k], sums[k][j]);
  }
}
#elif defined(BF16_DOTS_AVX2)
constexpr int QUERIES = 2;  // 16 ymm registers: eight sums, the weights widened, the activations loaded

// The same with each activation row given widened (`widen`): odd[j] and even[j] hold row j's odd and even inputs as
// fp32, eight of each per 16 inputs. KEYS weight rows at a time, each 16 inputs widened once for the Q rows;
// sums[4h + KEYS j + i] holds row j's lanes 8h .. 8h + 7 of weight row i (a chunk is two vectors of eight dwords,
// h = 0 then 1), each lane the odd product, then the even one, into the sum.
template <int Q, bool FETCH>
inline void add_lanes(const float* const (&odd)[Q], const float* const (&even)[Q], const uint16_t* w, int64_t in,
                      int64_t from, int64_t to, float (*const (&lanes)[Q])[16]) {
  constexpr int KEYS = Q == 1 ? 1 : 4 / Q;  // weight rows a pass: one row streams fastest alone
  for (int first = 0; first < kBlock; first += KEYS) {
    __m256 sums[8];
    for (int h = 0; h < 2; ++h)
      for (int j = 0; j < Q; ++j)
        for (int i = 0; i < KEYS; ++i)
          sums[4 * h + KEYS * j + i] = from == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(lanes[j][first + i] + 8 * h);
    for (int64_t c = from / 16; c < to / 16; c += 2) {
      for (int h = 0; h < 2; ++h) {
        for (int i = 0; i < KEYS; ++i) {
          const uint16_t* at = w + (first + i) * in + 16 * (c + h);
          if (FETCH && h == 0) _mm_prefetch(reinterpret_cast<const char*>(at + KEYS * in), _MM_HINT_T0);
          const __m256i key = bf16_dots::load256(at);
          const __m256 key_odd = bf16_dots::odd_halves(key), key_even = bf16_dots::even_halves(key);
          for (int j = 0; j < Q; ++j) {
            __m256& sum = sums[4 * h + KEYS * j + i];
            sum = _mm256_fmadd_ps(_mm256_loadu_ps(odd[j] + 8 * (c + h)), key_odd, sum);
            sum = _mm256_fmadd_ps(_mm256_loadu_ps(even[j] + 8 * (c + h)), key_even, sum);
          }
        }
      }
    }
    for (int h = 0; h < 2; ++h)
      for (int j = 0; j < Q; ++j)
        for (int i = 0; i < KEYS; ++i) _mm256_storeu_ps(lanes[j][first + i] + 8 * h, sums[4 * h + KEYS * j + i]);
  }
}

#endif

#ifdef BF16_DOTS_AVX2
// A row's odd and even inputs as fp32 (denormals kept: DAZ reads them as zero in the fmas).
inline void widen(const uint16_t* x, int64_t in, float* odd, float* even) {
  for (int64_t c = 0; c < in / 16; ++c) {
    const __m256i v = bf16_dots::load256(x + 16 * c);
    _mm256_storeu_ps(odd + 8 * c, bf16_dots::odd_halves(v));
    _mm256_storeu_ps(even + 8 * c, bf16_dots::even_halves(v));
  }
}
#endif

// The same for fp16 weights (W = uint16_t) or fp32 ones (W = float), each activation row given in fp32 (x[j]): lane
// l adds the products of inputs 16c + l.
#if defined(BF16_DOTS_NATIVE) || defined(BF16_DOTS_AVX512)
inline __m512 load_weights(const uint16_t* w, const float*) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
}
inline __m512 load_weights(const float* w, const float*) { return _mm512_loadu_ps(w); }
inline __m512 load_weights(const int8_t* w, const float* scale) {  // d * q, exact
  const __m512 codes = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w))));
  return _mm512_mul_ps(codes, _mm512_set1_ps(*scale));
}

// `scales`: an int8 weight's, [16 rows][in / kScaled] (null for the others).
template <int Q, bool FETCH, typename W>
inline void add_fp32_lanes(const float* const (&x)[Q], const W* w, const float* scales, int64_t in, int64_t from,
                           int64_t to, float (*const (&lanes)[Q])[16]) {
  constexpr int KEYS = std::is_same_v<W, int8_t> ? int8_keys_per_pass(Q) : keys_per_pass(Q);
  constexpr int64_t kLine = 64 / sizeof(W);  // inputs a cache line of weights holds
  for (int i = 0; i < kBlock; i += KEYS) {
    __m512 sums[KEYS][Q];
    for (int k = 0; k < KEYS; ++k)
      for (int j = 0; j < Q; ++j) sums[k][j] = from == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(lanes[j][i + k]);
    for (int64_t c = from; c < to; c += 16) {
      __m512 keys[KEYS];
      for (int k = 0; k < KEYS; ++k) {
        const W* at = w + (i + k) * in + c;
        if (FETCH && c % kLine == 0) _mm_prefetch(reinterpret_cast<const char*>(at + KEYS * in), _MM_HINT_T0);
        keys[k] = load_weights(at, scale_at<W>(scales, i + k, in, c));
      }
      for (int j = 0; j < Q; ++j) {
        const __m512 q = _mm512_loadu_ps(x[j] + c);
        for (int k = 0; k < KEYS; ++k) sums[k][j] = _mm512_fmadd_ps(q, keys[k], sums[k][j]);
      }
    }
    for (int k = 0; k < KEYS; ++k)
      for (int j = 0; j < Q; ++j) _mm512_storeu_ps(lanes[j][i + k], sums[k][j]);
  }
}
#elif defined(BF16_DOTS_AVX2)
inline __m256 load_weights(const uint16_t* w, const float*) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
}
inline __m256 load_weights(const float* w, const float*) { return _mm256_loadu_ps(w); }
inline __m256 load_weights(const int8_t* w, const float* scale) {  // d * q, exact
  const __m256 codes = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w))));
  return _mm256_mul_ps(codes, _mm256_set1_ps(*scale));
}

// Lanes 0-7 in one vector, 8-15 in another (h = 0, 1).
template <int Q, bool FETCH, typename W>
inline void add_fp32_lanes(const float* const (&x)[Q], const W* w, const float* scales, int64_t in, int64_t from,
                           int64_t to, float (*const (&lanes)[Q])[16]) {
  constexpr int KEYS = std::is_same_v<W, int8_t> ? 4 / Q : Q == 1 ? 1 : 4 / Q;  // int8: four chains of fmas
  constexpr int64_t kLine = 64 / sizeof(W);
  for (int i = 0; i < kBlock; i += KEYS) {
    __m256 sums[2][KEYS][Q];
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < KEYS; ++k)
        for (int j = 0; j < Q; ++j)
          sums[h][k][j] = from == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(lanes[j][i + k] + 8 * h);
    for (int64_t c = from; c < to; c += 16) {
      for (int k = 0; k < KEYS; ++k) {
        const W* at = w + (i + k) * in + c;
        if (FETCH && c % kLine == 0) _mm_prefetch(reinterpret_cast<const char*>(at + KEYS * in), _MM_HINT_T0);
        const float* scale = scale_at<W>(scales, i + k, in, c);  // both halves' (c is in 16s)
        for (int h = 0; h < 2; ++h) {
          const __m256 key = load_weights(at + 8 * h, scale);
          for (int j = 0; j < Q; ++j) sums[h][k][j] = _mm256_fmadd_ps(_mm256_loadu_ps(x[j] + c + 8 * h), key, sums[h][k][j]);
        }
      }
    }
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < KEYS; ++k)
        for (int j = 0; j < Q; ++j) _mm256_storeu_ps(lanes[j][i + k] + 8 * h, sums[h][k][j]);
  }
}
#endif

#if defined(BF16_DOTS_NATIVE) || defined(BF16_DOTS_AVX2)
// out[i] = weight row i's 16 lane sums paired down (adjacent lanes, then pairs of those), for the 16 of a block.
inline void pair_down(const float (*lanes)[16], float* out) {
  for (int first = 0; first < kBlock; first += 8) {
    __m256 low[8], high[8];
    for (int i = 0; i < 8; ++i) low[i] = _mm256_loadu_ps(lanes[first + i]), high[i] = _mm256_loadu_ps(lanes[first + i] + 8);
    _mm256_storeu_ps(out + first, _mm256_add_ps(pairwise_sums8(low), pairwise_sums8(high)));
  }
}
#endif

// run(Q) for the Q = n < QUERIES rows left after the full groups: in one call.
template <int Q, typename Run>
inline void rest(int64_t n, Run& run) {
  if constexpr (Q > 0) {
    if (n == Q) return run(std::integral_constant<int, Q>{});
    rest<Q - 1>(n, run);
  }
}

// n fp32 results into y (fp32, bf16 or fp16) from element `first` on, each rounded as `Tensor::to` rounds it.
inline void put_block(const float* results, int64_t n, at::ScalarType type, void* y, int64_t first) {
  if (type == at::kBFloat16) {
    for (int64_t i = 0; i < n; ++i) static_cast<at::BFloat16*>(y)[first + i] = static_cast<at::BFloat16>(results[i]);
  } else if (type == at::kHalf) {
    for (int64_t i = 0; i < n; ++i) static_cast<at::Half*>(y)[first + i] = static_cast<at::Half>(results[i]);
  } else {
    std::memcpy(static_cast<float*>(y) + first, results, n * sizeof(float));
  }
}

// y [rows, out] = x [rows, in] . weight [out, in]^T (`takes`; int8 codes times their `scales` [out, in / 32]), in
// `out_type` (fp32, bf16 or fp16: each fp32 result rounded where it is summed, so a prompt's products never stand
// whole in fp32). Threads split the weight's rows in units of kUnit blocks; a unit goes over the inputs a slice at a
// time, every activation row passing over the slice's blocks (from L2) before the next: each row is read once a
// unit, not once a block (a prompt's 512 rows are megabytes). A last block of fewer than 16 rows is multiplied as 16
// with zero rows after it.
inline at::Tensor matmul(const at::Tensor& x_in, const at::Tensor& weight_in, const at::Tensor& scales_in = {},
                         at::ScalarType out_type = at::kFloat) {
#if !(defined(BF16_DOTS_NATIVE) || defined(BF16_DOTS_AVX2))
  TORCH_CHECK(false, "dense_matmul: not in this build");
#else
  const at::Tensor x = x_in.contiguous(), weight = weight_in.contiguous();
  const int64_t rows = x.size(0), out = weight.size(0), in = weight.size(1);
  TORCH_CHECK(takes(x, weight) && x.size(1) == in,
              "dense_matmul takes bf16 [rows, in] x bf16 or fp16 [out, in], or fp32 or fp16 x fp16 or fp32, or any of "
              "them x int8, in % 32 == 0");
  const bool f16 = weight.scalar_type() == at::kHalf, f32 = weight.scalar_type() == at::kFloat;
  const bool q8 = weight.scalar_type() == at::kChar;
  TORCH_CHECK(q8 == scales_in.defined(), "int8 codes, and they alone, come with their scales");
  const at::Tensor scales = q8 ? scales_in.to(at::kFloat).contiguous() : scales_in;
  TORCH_CHECK(!q8 || (scales.dim() == 2 && scales.size(0) == out && scales.size(1) == in / kScaled),
              "an int8 weight's scales are [out, in / 32]");
  const int64_t size = weight.element_size(), per_row = in / kScaled;  // scales a row
  TORCH_CHECK(out_type == at::kFloat || out_type == at::kBFloat16 || out_type == at::kHalf,
              "the products come out in fp32, bf16 or fp16");
  at::Tensor y = at::empty({rows, out}, x.options().dtype(out_type));
  if (rows == 0 || out == 0) return y;
  const auto* xs = static_cast<const uint16_t*>(x.data_ptr());  // as bf16 activations
  const auto* ws = static_cast<const char*>(weight.data_ptr());
  void* const ys = y.data_ptr();
  const int64_t blocks = (out + kBlock - 1) / kBlock, units = (blocks + kUnit - 1) / kUnit;
  // The rows in fp32 for fp16, fp32 or int8 weights (bf16 ones widened); for bf16 weights on AVX2, each row's odd
  // inputs in fp32, then its even ones
  std::vector<float> widened;
#ifdef BF16_DOTS_AVX2
  if (!f16 && !f32 && !q8) {
    widened.resize(rows * in);
    for (int64_t r = 0; r < rows; ++r) widen(xs + r * in, in, &widened[r * in], &widened[r * in + in / 2]);
  }
#endif
  if ((f16 || f32 || q8) && x.scalar_type() != at::kFloat) {  // bf16 or fp16 activations, each converted exactly
    widened.resize(rows * in);
    at::from_blob(widened.data(), {rows, in}, at::TensorOptions().dtype(at::kFloat)).copy_(x);
  }
  const float* fp32_rows = x.scalar_type() == at::kFloat ? x.data_ptr<float>() : widened.data();
  claim_in_parallel(units, 1, [&](Claims& claims) {
    [[maybe_unused]] bf16_dots::Arithmetic arithmetic;  // AVX2: DAZ and FTZ, per thread
    std::vector<char> padded;  // the last block's rows and zero rows
    std::vector<float> padded_scales;  // an int8 weight's, likewise
    // row r's lane sums of the unit's block k (r within the rows at hand), written before they are read
    const std::unique_ptr<float[]> sums(new float[std::min(rows, kRows) * kUnit * kBlock * 16]);
    const auto lanes = [&](int64_t r, int64_t k) {
      return reinterpret_cast<float(*)[16]>(sums.get() + (r * kUnit + k) * kBlock * 16);
    };
    alignas(32) float part[kBlock];
    for (int64_t begin, end; claims.next(begin, end);)
      for (int64_t u = begin; u < end; ++u) {
        const int64_t first = u * kUnit, count = std::min(kUnit, blocks - first);
        const char* w[kUnit];
        const float* s[kUnit] = {};
        for (int64_t k = 0; k < count; ++k) w[k] = ws + (first + k) * kBlock * in * size;
        if (q8)
          for (int64_t k = 0; k < count; ++k) s[k] = scales.data_ptr<float>() + (first + k) * kBlock * per_row;
        const int64_t last = out - (first + count - 1) * kBlock;  // rows in the unit's last block
        if (last < kBlock) {
          padded.assign(kBlock * in * size, 0);
          std::memcpy(padded.data(), w[count - 1], last * in * size);
          w[count - 1] = padded.data();
          if (q8) {
            padded_scales.assign(kBlock * per_row, 0.0f);
            std::memcpy(padded_scales.data(), s[count - 1], last * per_row * sizeof(float));
            s[count - 1] = padded_scales.data();
          }
        }
        for (int64_t top = 0; top < rows; top += kRows) {
          const int64_t bottom = std::min(rows, top + kRows);
          for (int64_t from = 0; from < in; from += kSlice) {
            const int64_t to = std::min(in, from + kSlice);
            int64_t r = top;
            const auto run = [&](auto queries) {
              constexpr int Q = decltype(queries)::value;
              const float* xf[Q];
              for (int j = 0; j < Q; ++j) xf[j] = fp32_rows + (r + j) * in;
#ifdef BF16_DOTS_NATIVE
              const uint16_t* xj[Q];
              for (int j = 0; j < Q; ++j) xj[j] = xs + (r + j) * in;
#else
              const float *odd[Q], *even[Q];
              for (int j = 0; j < Q; ++j) odd[j] = xf[j], even[j] = odd[j] + in / 2;
#endif
              for (int64_t k = 0; k < count; ++k) {
                float(*outs[Q])[16];
                for (int j = 0; j < Q; ++j) outs[j] = lanes(r + j - top, k);
                const auto add = [&](auto fetch) {
                  constexpr bool FETCH = decltype(fetch)::value;
                  const auto* w16 = reinterpret_cast<const uint16_t*>(w[k]);
                  if (f32) return add_fp32_lanes<Q, FETCH>(
                      xf, reinterpret_cast<const float*>(w[k]), s[k], in, from, to, outs);
                  if (f16) return add_fp32_lanes<Q, FETCH>(xf, w16, s[k], in, from, to, outs);
                  if (q8) return add_fp32_lanes<Q, FETCH>(
                      xf, reinterpret_cast<const int8_t*>(w[k]), s[k], in, from, to, outs);
#ifdef BF16_DOTS_NATIVE
                  add_lanes<Q, FETCH>(xj, w16, in, from, to, outs);
#else
                  add_lanes<Q, FETCH>(odd, even, w16, in, from, to, outs);
#endif
                };
                // the weights' first pass comes from memory
                r == 0 ? add(std::true_type{}) : add(std::false_type{});
              }
              r += Q;
            };
            while (bottom - r >= QUERIES) run(std::integral_constant<int, QUERIES>{});
            rest<QUERIES - 1>(bottom - r, run);
          }
          for (int64_t r = top; r < bottom; ++r) {
            for (int64_t k = 0; k < count; ++k) {
              const int64_t start = (first + k) * kBlock;
              pair_down(lanes(r - top, k), part);
              put_block(part, std::min(kBlock, out - start), out_type, ys, r * out + start);
            }
          }
        }
      }
  });
  return y;
#endif
}

}  // namespace dense_matmul
