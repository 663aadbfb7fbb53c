// The attention's kernels: each row's scores, softmax and value sums over the cache in a fixed order (see
// decoder.cpp), for a cache in the activations' dtype (fp32 arithmetic), in bf16 (bf16 dot products, or AMX tiles)
// or in int8 (integer dot products); then the rows spread over the threads, and `attention` around them. Each
// attention_*.cpp compiles them for its kind of cache.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <optional>
#include <type_traits>
#include <vector>

#include "attention.h"
#include "bf16_dots.h"
#include "bf16_tiles.h"
#include "int8_dots.h"
#include "lane_pairs.h"
#include "rows.h"

namespace cpu_decoder {

// The rows' queries rotated into fp32 [rows, heads, D]; their keys rotated and values written to the cache
// slots [prefix, prefix + rows). With `q_norm` / `k_norm` (defined), each head's query / key is RMS-normed first.
// cos / sin [rows, rot]: RoPE turns the first `rot` dims of each head.
template <typename T, typename Kv>
void rotate_and_cache(const T* qkv, const float* cos, const float* sin, float* queries, const Kv& cache,
                      int64_t prefix, int64_t rows, int64_t heads, int64_t kv_heads, int64_t dim, int64_t rot,
                      const at::Tensor& q_norm, const at::Tensor& k_norm, float eps) {
  const int64_t half = rot / 2, width = (heads + 2 * kv_heads) * dim;
  std::vector<float> rotated(dim);
  std::vector<T> normed(dim);
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = qkv + r * width;
    const float* c = cos + r * rot;
    const float* s = sin + r * rot;
    for (int64_t h = 0; h < heads + kv_heads; ++h) {
      const T* in = row + h * dim;
      if (const at::Tensor& norm = h < heads ? q_norm : k_norm; norm.defined()) {
        rms_norm<T>(in, norm, normed.data(), 1, dim, eps);
        in = normed.data();
      }
      for (int64_t d = 0; d < rot; ++d) {
        const float turned = d < half ? -load(in[d + half]) : load(in[d - half]);
        rotated[d] = load(in[d]) * c[d] + turned * s[d];
      }
      for (int64_t d = rot; d < dim; ++d) rotated[d] = load(in[d]);
      if (h < heads) {
        std::copy(rotated.begin(), rotated.end(), queries + (r * heads + h) * dim);
      } else {
        cache.write_key(h - heads, prefix + r, rotated.data(), dim);
      }
    }
    for (int64_t g = 0; g < kv_heads; ++g) cache.write_value(g, prefix + r, row + (heads + kv_heads + g) * dim, dim);
  }
}

// scores[i] = q . tile[i] for a tile of 16 keys [16][dim] (dim a multiple of 16): the products summed in 16
// lanes, then adjacent lanes paired down to one. The AVX-512, AVX2 and portable paths compute the same sums.
// Q queries at once: AVX-512 loads each key vector once for all of them, and pairs the keys' sums down as they
// come (keys 2i and 2i + 1 as soon as both are summed, then pairs of those: the same pairs in the same order).
template <int DIM, int Q>
inline void dots16(const float* const (&q)[Q], const float* tile, float* const (&scores)[Q]) {
  constexpr int dim = DIM;
#if defined(__AVX512F__)
  constexpr int kVectors = DIM / LANES;
  LanePairs<Q> pairs;
  __m512 query[Q][kVectors];
  for (int j = 0; j < Q; ++j)
    for (int c = 0; c < kVectors; ++c) query[j][c] = _mm512_loadu_ps(q[j] + LANES * c);
#pragma GCC unroll 16
  for (int i = 0; i < LANES; ++i) {
    __m512 sum[Q];
    for (int j = 0; j < Q; ++j) sum[j] = _mm512_setzero_ps();
    for (int c = 0; c < kVectors; ++c) {
      const __m512 key = _mm512_loadu_ps(tile + i * dim + LANES * c);
      for (int j = 0; j < Q; ++j) sum[j] = _mm512_fmadd_ps(query[j][c], key, sum[j]);
    }
    pairs.add(i, sum, scores);
  }
#elif defined(__AVX2__) && defined(__FMA__)
  for (int j = 0; j < Q; ++j) {
    for (int first = 0; first < LANES; first += 4) {  // four keys at a time: lanes 0-7 and 8-15 of each
      __m256 sums[8];
      for (int i = 0; i < 8; ++i) sums[i] = _mm256_setzero_ps();
      for (int c = 0; c < dim; c += LANES) {
        const __m256 q_low = _mm256_loadu_ps(q[j] + c), q_high = _mm256_loadu_ps(q[j] + c + 8);
        for (int i = 0; i < 4; ++i) {
          const float* key = tile + (first + i) * dim + c;
          sums[i] = _mm256_fmadd_ps(q_low, _mm256_loadu_ps(key), sums[i]);
          sums[4 + i] = _mm256_fmadd_ps(q_high, _mm256_loadu_ps(key + 8), sums[4 + i]);
        }
      }
      const __m256 halves = pairwise_sums8(sums);  // lanes 0-7 summed for keys 0-3, then lanes 8-15
      _mm_storeu_ps(scores[j] + first, _mm_add_ps(_mm256_castps256_ps128(halves), _mm256_extractf128_ps(halves, 1)));
    }
  }
#else
  for (int j = 0; j < Q; ++j) {
    for (int i = 0; i < LANES; ++i) {
      float lanes[LANES] = {};
      for (int64_t c = 0; c < dim; c += LANES) {
        for (int l = 0; l < LANES; ++l) lanes[l] = std::fma(q[j][c + l], tile[i * dim + c + l], lanes[l]);
      }
      for (int n = LANES; n > 1; n /= 2) {
        for (int k = 0; k < n / 2; ++k) lanes[k] = lanes[2 * k] + lanes[2 * k + 1];
      }
      scores[j][i] = lanes[0];
    }
  }
#endif
}

// acc[q][d] += weights[q][p] * rows[p][d] for each of Q queries and the `count` rows [count][DIM] in order, one
// fma each, whatever the path: AVX-512 keeps 128 columns of every query's `acc` in registers while the rows
// stream by (each row loaded once for the Q queries), AVX2 64 columns of one query (32 where DIM is not in 64s).
template <int DIM, int Q>
inline void add_weighted(const float* const (&weights)[Q], const float* rows, int64_t count, float* const (&acc)[Q]) {
#if defined(__AVX512F__)
  constexpr int kWidth = DIM < 128 ? DIM : 128, kVectors = kWidth / 16;
  for (int h = 0; h < DIM; h += kWidth) {
    __m512 sums[Q][kVectors];
    for (int q = 0; q < Q; ++q)
      for (int j = 0; j < kVectors; ++j) sums[q][j] = _mm512_loadu_ps(acc[q] + h + 16 * j);
    for (int64_t p = 0; p < count; ++p) {
      const float* row = rows + p * DIM + h;
      __m512 weight[Q];
      for (int q = 0; q < Q; ++q) weight[q] = _mm512_set1_ps(weights[q][p]);
      for (int j = 0; j < kVectors; ++j) {
        const __m512 v = _mm512_loadu_ps(row + 16 * j);
        for (int q = 0; q < Q; ++q) sums[q][j] = _mm512_fmadd_ps(weight[q], v, sums[q][j]);
      }
    }
    for (int q = 0; q < Q; ++q)
      for (int j = 0; j < kVectors; ++j) _mm512_storeu_ps(acc[q] + h + 16 * j, sums[q][j]);
  }
#elif defined(__AVX2__) && defined(__FMA__)
  constexpr int kVectors = DIM % 64 == 0 ? 8 : 4;
  for (int q = 0; q < Q; ++q) {
    for (int h = 0; h < DIM; h += 8 * kVectors) {
      __m256 sums[kVectors];
      for (int j = 0; j < kVectors; ++j) sums[j] = _mm256_loadu_ps(acc[q] + h + 8 * j);
      for (int64_t p = 0; p < count; ++p) {
        const __m256 weight = _mm256_broadcast_ss(weights[q] + p);
        const float* row = rows + p * DIM + h;
        for (int j = 0; j < kVectors; ++j) sums[j] = _mm256_fmadd_ps(weight, _mm256_loadu_ps(row + 8 * j), sums[j]);
      }
      for (int j = 0; j < kVectors; ++j) _mm256_storeu_ps(acc[q] + h + 8 * j, sums[j]);
    }
  }
#else
  for (int q = 0; q < Q; ++q)
    for (int64_t p = 0; p < count; ++p)
      for (int d = 0; d < DIM; ++d) acc[q][d] = std::fma(weights[q][p], rows[p * DIM + d], acc[q][d]);
#endif
}

// row[0, n) = cap * tanh(row[0, n) / cap), Gemma 2's soft cap: tanh(a) = (0 - m) / (2 + m) with m = exp(-2|a|) - 1
// (expm1_approx: accurate near 0, where 1 - exp would cancel), the sign put back. Every value goes through the same
// vector code, the last ones padded to 16, so a value's bits do not depend on where it lies in the row; AVX-512, AVX2
// and the portable loops agree.
inline void soft_cap(float* row, int64_t n, float cap) {
  const float k = -2.0f / cap;
  for (int64_t p = 0; p < n; p += LANES) {
    float chunk[LANES] = {};
    const int64_t filled = std::min<int64_t>(LANES, n - p);
    std::copy_n(row + p, filled, chunk);
#if defined(__AVX512F__)
    const __m512 x = _mm512_loadu_ps(chunk), sign = _mm512_set1_ps(-0.0f);
    const __m512 m = expm1_16(_mm512_mul_ps(_mm512_andnot_ps(sign, x), _mm512_set1_ps(k)));
    const __m512 t = _mm512_div_ps(_mm512_sub_ps(_mm512_setzero_ps(), m), _mm512_add_ps(_mm512_set1_ps(2.0f), m));
    _mm512_storeu_ps(chunk, _mm512_or_ps(_mm512_mul_ps(t, _mm512_set1_ps(cap)), _mm512_and_ps(sign, x)));
#elif defined(__AVX2__) && defined(__FMA__)
    for (int h = 0; h < LANES; h += 8) {
      const __m256 x = _mm256_loadu_ps(chunk + h), sign = _mm256_set1_ps(-0.0f);
      const __m256 m = expm1_8(_mm256_mul_ps(_mm256_andnot_ps(sign, x), _mm256_set1_ps(k)));
      const __m256 t = _mm256_div_ps(_mm256_sub_ps(_mm256_setzero_ps(), m), _mm256_add_ps(_mm256_set1_ps(2.0f), m));
      _mm256_storeu_ps(chunk + h, _mm256_or_ps(_mm256_mul_ps(t, _mm256_set1_ps(cap)), _mm256_and_ps(sign, x)));
    }
#else
    for (int l = 0; l < LANES; ++l) {
      const float m = expm1_approx(std::fabs(chunk[l]) * k);
      chunk[l] = std::copysign((0.0f - m) / (2.0f + m) * cap, chunk[l]);
    }
#endif
    std::copy_n(chunk, filled, row + p);
  }
}

// row[0, n) = exp(row[0, n) - their maximum), soft-capped first where `cap` is not 0; returns the sum of those, kept
// in lanes by key index. The maximum is exact in any order; the exponentials go 16 keys at a time (exp16, or two
// exp8), the same bits as one by one.
inline float exponentials(float* row, int64_t n, float cap = 0.0f) {
  if (cap != 0.0f) soft_cap(row, n, cap);
  float lanes[LANES];
  int64_t p = 0;
#if defined(__AVX512F__)
  __m512 tops = _mm512_set1_ps(row[0]);
  for (; p + LANES <= n; p += LANES) tops = _mm512_max_ps(tops, _mm512_loadu_ps(row + p));
  _mm512_storeu_ps(lanes, tops);
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 low = _mm256_set1_ps(row[0]), high = low;
  for (; p + LANES <= n; p += LANES) {
    low = _mm256_max_ps(low, _mm256_loadu_ps(row + p)), high = _mm256_max_ps(high, _mm256_loadu_ps(row + p + 8));
  }
  _mm256_storeu_ps(lanes, low), _mm256_storeu_ps(lanes + 8, high);
#else
  std::fill_n(lanes, LANES, row[0]);
  for (; p + LANES <= n; p += LANES) {
    for (int l = 0; l < LANES; ++l) lanes[l] = std::max(lanes[l], row[p + l]);
  }
#endif
  for (int l = 0; p < n; ++p, ++l) lanes[l] = std::max(lanes[l], row[p]);
  const float top = *std::max_element(lanes, lanes + LANES);
  p = 0;
#if defined(__AVX512F__)
  __m512 sums = _mm512_setzero_ps();
  for (; p + LANES <= n; p += LANES) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(row + p), _mm512_set1_ps(top)));
    _mm512_storeu_ps(row + p, e);
    sums = _mm512_add_ps(sums, e);
  }
  _mm512_storeu_ps(lanes, sums);
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 sums_low = _mm256_setzero_ps(), sums_high = sums_low;
  for (; p + LANES <= n; p += LANES) {
    const __m256 e_low = exp8(_mm256_sub_ps(_mm256_loadu_ps(row + p), _mm256_set1_ps(top)));
    const __m256 e_high = exp8(_mm256_sub_ps(_mm256_loadu_ps(row + p + 8), _mm256_set1_ps(top)));
    _mm256_storeu_ps(row + p, e_low), _mm256_storeu_ps(row + p + 8, e_high);
    sums_low = _mm256_add_ps(sums_low, e_low), sums_high = _mm256_add_ps(sums_high, e_high);
  }
  _mm256_storeu_ps(lanes, sums_low), _mm256_storeu_ps(lanes + 8, sums_high);
#else
  std::fill_n(lanes, LANES, 0.0f);
  for (; p + LANES <= n; p += LANES) {
    for (int l = 0; l < LANES; ++l) {
      row[p + l] = exp_approx(row[p + l] - top);
      lanes[l] += row[p + l];
    }
  }
#endif
  for (int l = 0; p < n; ++p, ++l) {
    row[p] = exp_approx(row[p] - top);
    lanes[l] += row[p];
  }
  return lane_total(lanes);
}

// row[0, n) = softmax(row[0, n)).
inline void softmax(float* row, int64_t n, float cap) {
  const float inverse = 1.0f / exponentials(row, n, cap);
  for (int64_t q = 0; q < n; ++q) row[q] *= inverse;
}

// weights[0, n) = softmax(row[0, n)) rounded to bf16; row keeps the exponentials.
inline void softmax_bf16(float* row, int64_t n, float cap, uint16_t* weights) {
  bf16_dots::round_bf16(row, weights, n, 1.0f / exponentials(row, n, cap));
}

// f(i, Q) for the queries [first, last): Q at a time (one pass over a tile serves them all), then the rest by
// halves, Q = 3 leaving four as two pairs (a lone query's pass is the slowest per query); Q a
// std::integral_constant, so f instantiates its kernels for Q, Q / 2, ..., 1 queries.
template <int Q, typename F>
inline void queries_in(int64_t first, int64_t last, F&& f) {
  int64_t i = first;
  for (; i + Q <= last && !(Q == 3 && last - i == 4); i += Q) f(i, std::integral_constant<int, Q>{});
  if constexpr (Q > 1) queries_in<Q == 3 ? 2 : Q / 2>(i, last, f);
}

constexpr int64_t kPrefetchTiles = 4;  // how many tiles ahead a stream of cache rows is prefetched

// `rows_ahead` rows of `bytes_per_row` from `first` into L2 (the hardware prefetcher lags on these streams).
inline void prefetch_rows(const void* first, int64_t rows_ahead, int64_t bytes_per_row) {
  const char* ahead = static_cast<const char*>(first);
  for (int64_t byte = 0; byte < rows_ahead * bytes_per_row; byte += 64) __builtin_prefetch(ahead + byte, 0, 2);
}

// The longest of the rows' tails, and the scores' row width: the prefix plus that.
inline int64_t score_width(const std::vector<int64_t>* tails, int64_t prefix, int64_t rows) {
  int64_t longest = 0;
  for (int64_t r = 0; r < rows; ++r) longest = std::max<int64_t>(longest, static_cast<int64_t>(tails[r].size()));
  return prefix + longest;
}

// Attention of `rows` consecutive rows for one KV head's group of query heads (queries [rows][heads][DIM] fp32
// from the group's first head). Row r sees the cache slots [0, prefix) then tails[r]; the prefix keys are
// converted once for all rows. Per query, scores are computed key by key, the softmax sums lanes by key
// index, and the value sum runs over the keys in order: all fixed by the row's own keys.
template <typename T, int DIM>
void attend(const float* queries, const T* keys, const T* values, const std::vector<int64_t>* tails, int64_t prefix,
            int64_t rows, int64_t heads, int64_t group, float scale, float cap, T* out) {
  constexpr int64_t BLOCK = 4 * LANES;  // value rows converted at a time
  const int64_t count = rows * group;  // queries
  const int64_t width = score_width(tails, prefix, rows);
  std::vector<float> scores(count * width), tile(BLOCK * DIM), accumulator(count * DIM, 0.0f);
  float block[2 * LANES];
  auto query = [&](int64_t i) { return queries + ((i / group) * heads + i % group) * DIM; };
  // Rows first, first + 1, ... (`n` <= BLOCK of them; through `slots` when given) of a cache as fp32 [padded][DIM],
  // zeros after the n: read in place when they are consecutive fp32 rows, else converted into `tile`.
  auto rows_at = [&](const T* cache, const int64_t* slots, int64_t first, int64_t n, int64_t padded) -> const float* {
    if (!slots) prefetch_rows(cache + (first + kPrefetchTiles * padded) * DIM, padded, DIM * sizeof(T));
    if constexpr (std::is_same_v<T, float>) {
      if (!slots && n == padded) return cache + first * DIM;
    }
    for (int64_t i = 0; i < n; ++i) {
      const T* row = cache + (slots ? slots[first + i] : first + i) * DIM;
      for (int d = 0; d < DIM; ++d) tile[i * DIM + d] = load(row[d]);
    }
    std::fill(tile.begin() + n * DIM, tile.begin() + padded * DIM, 0.0f);
    return tile.data();
  };
  auto score_keys = [&](const int64_t* slots, int64_t n, int64_t first_query, int64_t last_query, int64_t offset) {
    for (int64_t b = 0; b < n; b += LANES) {
      const int64_t filled = std::min<int64_t>(LANES, n - b);
      const float* keys_tile = rows_at(keys, slots, b, filled, LANES);
      const auto keep = [&](int64_t i, const float* block) {
        float* row = scores.data() + i * width + offset + b;
        for (int64_t j = 0; j < filled; ++j) row[j] = block[j] * scale;
      };
      queries_in<2>(first_query, last_query, [&](int64_t i, auto count) {
        constexpr int Q = decltype(count)::value;
        const float* q[Q];
        float* out[Q];
        for (int j = 0; j < Q; ++j) q[j] = query(i + j), out[j] = block + j * LANES;
        dots16<DIM, Q>(q, keys_tile, out);
        for (int j = 0; j < Q; ++j) keep(i + j, out[j]);
      });
    }
  };
  auto add_values = [&](const int64_t* slots, int64_t n, int64_t first_query, int64_t last_query, int64_t offset) {
    for (int64_t b = 0; b < n; b += BLOCK) {
      const int64_t filled = std::min<int64_t>(BLOCK, n - b);
      const float* values_tile = rows_at(values, slots, b, filled, filled);
      const auto weights = [&](int64_t i) { return scores.data() + i * width + offset + b; };
      queries_in<2>(first_query, last_query, [&](int64_t i, auto count) {
        constexpr int Q = decltype(count)::value;
        const float* w[Q];
        float* acc[Q];
        for (int j = 0; j < Q; ++j) w[j] = weights(i + j), acc[j] = accumulator.data() + (i + j) * DIM;
        add_weighted<DIM, Q>(w, values_tile, filled, acc);
      });
    }
  };
  score_keys(nullptr, prefix, 0, count, 0);
  for (int64_t r = 0; r < rows; ++r) {
    score_keys(tails[r].data(), tails[r].size(), r * group, (r + 1) * group, prefix);
  }
  for (int64_t i = 0; i < count; ++i) softmax(scores.data() + i * width, prefix + tails[i / group].size(), cap);
  add_values(nullptr, prefix, 0, count, 0);
  for (int64_t r = 0; r < rows; ++r) {
    add_values(tails[r].data(), tails[r].size(), r * group, (r + 1) * group, prefix);
  }
  for (int64_t i = 0; i < count; ++i) {
    T* dst = out + ((i / group) * heads + i % group) * DIM;
    for (int d = 0; d < DIM; ++d) dst[d] = store<T>(accumulator[i * DIM + d]);
  }
}

// The value sums of a bf16 cache, in bf16 dot pairs (bf16_dots::add_pairs): each query's weights
// (bf16, [count][paired], in its row's key sequence: the prefix, then its tail) times the value rows, paired by
// their index in that sequence, so a tree row pairs its keys as a decode step at its position does: an odd
// prefix's last key pairs with the tail's first. `pair(a, b, out)` writes cache rows a and b (-1: a zero row)
// as DIM pairs; `prefetch(first, n)` is told of prefix rows about to be read.
template <int DIM, typename Pair, typename Prefetch>
void sum_value_pairs(const Pair& pair, const Prefetch& prefetch, const uint16_t* weights16, int64_t paired,
                     const std::vector<int64_t>* tails, int64_t prefix, int64_t rows, int64_t group,
                     float* accumulator) {
  constexpr int64_t PAIRS = 2 * LANES;  // value pairs made at a time
  std::vector<uint32_t> pair_tile(PAIRS * DIM);
  // The rows at sequence indices [start, start + n) (cache rows through `slots` when given, else consecutive
  // from `start`; n even, or odd with a zero row after the last) into the queries' sums.
  auto add_values = [&](const int64_t* slots, int64_t start, int64_t n, int64_t first_query, int64_t last_query) {
    for (int64_t b = 0; b < n; b += 2 * PAIRS) {
      const int64_t pairs = std::min<int64_t>(PAIRS, (n - b + 1) / 2);
      const auto slot = [&](int64_t i) -> int64_t { return i >= n ? -1 : slots ? slots[i] : start + i; };
      for (int64_t m = 0; m < pairs; ++m) {  // a pair at a time: a block's 256 lines at once would fill the
        if (!slots) prefetch(start + b + 2 * m + kPrefetchTiles * 2 * PAIRS, 2);  // miss buffers and stall
        pair(slot(b + 2 * m), slot(b + 2 * m + 1), pair_tile.data() + m * DIM);
      }
      queries_in<bf16_dots::QUERIES>(first_query, last_query, [&](int64_t i, auto count) {
        constexpr int Q = decltype(count)::value;
        const uint32_t* w[Q];
        float* acc[Q];
        for (int j = 0; j < Q; ++j) {
          w[j] = reinterpret_cast<const uint32_t*>(weights16 + (i + j) * paired + start + b);
          acc[j] = accumulator + (i + j) * DIM;
        }
        bf16_dots::add_pairs<DIM, Q>(w, pair_tile.data(), pairs, acc);
      });
    }
  };
  const int64_t even = prefix & ~int64_t{1};  // the prefix's whole pairs; an odd prefix's last key joins each tail
  add_values(nullptr, 0, even, 0, rows * group);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int64_t> sequence(prefix - even, prefix - 1);
    sequence.insert(sequence.end(), tails[r].begin(), tails[r].end());
    add_values(sequence.data(), even, sequence.size(), r * group, (r + 1) * group);
  }
}

// Each query's sum [DIM] fp32 into its row and head of `out` [rows][heads][DIM].
template <typename T, int DIM>
void store_sums(const float* accumulator, int64_t count, int64_t heads, int64_t group, T* out) {
  for (int64_t i = 0; i < count; ++i) {
    T* dst = out + ((i / group) * heads + i % group) * DIM;
    for (int d = 0; d < DIM; ++d) dst[d] = store<T>(accumulator[i * DIM + d]);
  }
}

// The `count` queries of a KV head's group (fp32 [rows][heads][DIM] from the group's first head) as bf16 [count][DIM].
template <int DIM>
std::vector<uint16_t> queries_bf16(const float* queries, int64_t count, int64_t heads, int64_t group) {
  std::vector<uint16_t> rounded(count * DIM);
  for (int64_t i = 0; i < count; ++i) {
    bf16_dots::round_bf16(queries + ((i / group) * heads + i % group) * DIM, rounded.data() + i * DIM, DIM);
  }
  return rounded;
}

// Sixteen bf16 keys [16][DIM] from sequence index b of n (cache rows through `slots` when given, else consecutive
// from 0): in place when they are 16 consecutive rows, else gathered into `tile` with zero rows after the n.
template <int DIM>
const uint16_t* key_rows(const uint16_t* keys, const int64_t* slots, int64_t b, int64_t n, uint16_t* tile) {
  constexpr int64_t KEYS = 16;
  if (!slots && n - b >= KEYS) return keys + b * DIM;
  for (int64_t i = 0; i < KEYS; ++i) {
    if (b + i < n) std::copy_n(keys + (slots ? slots[b + i] : b + i) * DIM, DIM, tile + i * DIM);
    else std::fill_n(tile + i * DIM, DIM, uint16_t{0});
  }
  return tile;
}

// A KV head's `count` queries (fp32 [rows][heads][DIM] from the group's first head) rounded to bf16, and their scores
// against tiles of 16 bf16 keys: each pass over a tile serves up to bf16_dots::QUERIES of them (`dots16`), or on
// AVX2, where a tile serves COLUMNS_FROM queries or more (a tree's rows), the tile is widened and transposed once
// and the queries, widened once here, read it eight keys a vector (`column_dots16`). The same bits either way.
template <int DIM>
class Bf16Scores {
 public:
  Bf16Scores(const float* queries, int64_t count, int64_t heads, int64_t group)
      : rounded_(queries_bf16<DIM>(queries, count, heads, group)) {
#ifdef BF16_DOTS_AVX2
    if (count >= bf16_dots::COLUMNS_FROM) {
      wide_.resize(rounded_.size());
      for (size_t k = 0; k < wide_.size(); ++k) wide_[k] = bf16_dots::widen(rounded_[k]);
    }
#endif
  }

  // The scores of queries [first, last) with the keys of `tile` [16][DIM]: query i's 16 at out(i). Under a
  // bf16_dots::Arithmetic.
  template <typename Out>
  void tile(const uint16_t* tile, int64_t first, int64_t last, const Out& out) const {
    // `kernel(q, scores)` for the Q queries from i, their operands rows of `operands`
    const auto pass = [&](int64_t i, auto count, const auto* operands, const auto& kernel) {
      constexpr int Q = decltype(count)::value;
      decltype(operands) q[Q];
      float* scores[Q];
      for (int j = 0; j < Q; ++j) q[j] = operands + (i + j) * DIM, scores[j] = out(i + j);
      kernel(q, scores);
    };
#ifdef BF16_DOTS_AVX2
    if (last - first >= bf16_dots::COLUMNS_FROM) {
      float columns[LANES * DIM];
      bf16_dots::key_columns<DIM>(tile, columns);
      return queries_in<4>(first, last, [&](int64_t i, auto count) {
        const auto kernel = [&](const auto& q, const auto& s) { bf16_dots::column_dots16<DIM>(q, columns, s); };
        pass(i, count, wide_.data(), kernel);
      });
    }
#endif
    queries_in<bf16_dots::QUERIES>(first, last, [&](int64_t i, auto count) {
      pass(i, count, rounded_.data(), [&](const auto& q, const auto& s) { bf16_dots::dots16<DIM>(q, tile, s); });
    });
  }

 private:
  std::vector<uint16_t> rounded_;
#ifdef BF16_DOTS_AVX2
  std::vector<float> wide_;  // rounded_ as fp32, where a tile may serve COLUMNS_FROM queries
#endif
};

// `attend` on a bf16 cache in bf16 dot-product arithmetic (bf16_dots.h): the query rounded to bf16 for the scores
// (`Bf16Scores`), the softmax weights rounded to bf16 for the value sums (`sum_value_pairs`), keys and values read from
// the cache in place. With `spread`, the unit's work goes over the threads (a decode step of fewer KV heads than
// threads: one thread would read the whole cache while the others wait): the prefix's scores by blocks of keys, the
// softmax by query, the value sums by parts of the head dimension. Every score and every output element is computed by
// the same operations in the same order either way, so the result is bitwise the same.
template <int DIM, typename T>
void attend_bf16(const float* queries, const at::BFloat16* key_cache, const at::BFloat16* value_cache,
                 const std::vector<int64_t>* tails, int64_t prefix, int64_t rows, int64_t heads, int64_t group,
                 float scale, float cap, T* out, bool spread = false) {
  const auto* keys = reinterpret_cast<const uint16_t*>(key_cache);
  const auto* values = reinterpret_cast<const uint16_t*>(value_cache);
  const int64_t count = rows * group;  // queries
  const int64_t width = score_width(tails, prefix, rows), paired = (width + 2) & ~int64_t{1};  // whole pairs
  std::vector<float> scores(count * width), accumulator(count * DIM, 0.0f);
  const Bf16Scores<DIM> query_scores(queries, count, heads, group);
  std::vector<uint16_t> weights16(count * paired, 0), zeros(DIM, 0);
  // keys [begin, end) of a sequence of n (cache rows through `slots` when given, else consecutive from 0)
  auto score_keys = [&](const int64_t* slots, int64_t n, int64_t first_query, int64_t last_query, int64_t offset,
                        int64_t begin, int64_t end) {
    std::vector<uint16_t> key_tile(LANES * DIM);
    std::vector<float> block((last_query - first_query) * LANES);  // a last part tile's scores, then copied out
    const bf16_dots::Arithmetic arithmetic;  // the dot products alone in their arithmetic, on this thread
    for (int64_t b = begin; b < end; b += LANES) {
      const int64_t filled = std::min<int64_t>(LANES, n - b);
      if (!slots) prefetch_rows(keys + (b + kPrefetchTiles * LANES) * DIM, LANES, DIM * 2);  // the hardware lags
      const uint16_t* tile = key_rows<DIM>(keys, slots, b, n, key_tile.data());
      float* const rows_at = scores.data() + offset + b;  // query i's scores of the tile at rows_at + i * width
      if (filled == LANES) {
        query_scores.tile(tile, first_query, last_query, [&](int64_t i) { return rows_at + i * width; });
        continue;
      }
      const auto in_block = [&](int64_t i) { return block.data() + (i - first_query) * LANES; };
      query_scores.tile(tile, first_query, last_query, in_block);
      for (int64_t i = first_query; i < last_query; ++i) std::copy_n(in_block(i), filled, rows_at + i * width);
    }
  };
  const auto score_prefix = [&](int64_t begin, int64_t end) {  // blocks of LANES keys
    score_keys(nullptr, prefix, 0, count, 0, begin * LANES, std::min(prefix, end * LANES));
  };
  const int64_t key_blocks = (prefix + LANES - 1) / LANES;
  spread ? at::parallel_for(0, key_blocks, 1, score_prefix) : score_prefix(0, key_blocks);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = tails[r].size();
    score_keys(tails[r].data(), n, r * group, (r + 1) * group, prefix, 0, n);
  }
  const auto normalize = [&](int64_t begin, int64_t end) {  // scale and softmax, in the usual environment
    for (int64_t i = begin; i < end; ++i) {
      const int64_t n = prefix + static_cast<int64_t>(tails[i / group].size());
      float* row = scores.data() + i * width;
      for (int64_t j = 0; j < n; ++j) row[j] *= scale;
      softmax_bf16(row, n, cap, weights16.data() + i * paired);
    }
  };
  spread ? at::parallel_for(0, count, 1, normalize) : normalize(0, count);
  // the value sums of head dims [first, first + PART): their own accumulator [count][PART], then in place
  const auto sum_values = [&](auto part, int64_t first) {
    constexpr int PART = decltype(part)::value;
    const auto pair = [&](int64_t a, int64_t b, uint32_t* pairs) {
      bf16_dots::interleave<PART>(a < 0 ? zeros.data() : values + a * DIM + first,
                                  b < 0 ? zeros.data() : values + b * DIM + first, pairs);
    };
    const auto prefetch = [&](int64_t row, int64_t n) { prefetch_rows(values + row * DIM + first, n, DIM * 2); };
    const bf16_dots::Arithmetic arithmetic;
    if (PART == DIM) {
      return sum_value_pairs<PART>(pair, prefetch, weights16.data(), paired, tails, prefix, rows, group,
                                   accumulator.data());  // fmt: skip
    }
    std::vector<float> sums(count * PART, 0.0f);
    sum_value_pairs<PART>(pair, prefetch, weights16.data(), paired, tails, prefix, rows, group, sums.data());
    for (int64_t i = 0; i < count; ++i) std::copy_n(sums.data() + i * PART, PART, accumulator.data() + i * DIM + first);
  };
  // spread: as many parts as threads, in powers of two, each whole 32s of dims (the AVX2 sums' width)
  const auto in_parts = [&](auto parts) {
    constexpr int PART = DIM / decltype(parts)::value;
    if constexpr (PART % 32 == 0) {
      at::parallel_for(0, decltype(parts)::value, 1, [&](int64_t begin, int64_t end) {
        for (int64_t part = begin; part < end; ++part) sum_values(std::integral_constant<int, PART>{}, part * PART);
      });
    }
  };
  const int64_t threads = spread ? at::get_num_threads() : 1;
  if (DIM % 256 == 0 && threads >= 8) in_parts(std::integral_constant<int, 8>{});
  else if (DIM % 128 == 0 && threads >= 4) in_parts(std::integral_constant<int, 4>{});
  else if (DIM % 64 == 0 && threads >= 2) in_parts(std::integral_constant<int, 2>{});
  else sum_values(std::integral_constant<int, DIM>{}, 0);
  store_sums<T, DIM>(accumulator.data(), count, heads, group, out);
}

#ifdef BF16_TILES
// `attend` on a bf16 cache in AMX tiles (bf16_tiles.h): the query rounded to bf16 for the scores, the softmax
// weights rounded to bf16 for the value sums, up to 16 queries a tile. A row's value sums run over its key
// sequence (the prefix, then its tail) 32 keys a step from the sequence's start: the prefix's whole steps in
// place for all rows, the rest gathered with each row's tail, the last step padded with zero rows.
template <int DIM, typename T>
void attend_bf16_tiles(const float* queries, const at::BFloat16* key_cache, const at::BFloat16* value_cache,
                       const std::vector<int64_t>* tails, int64_t prefix, int64_t rows, int64_t heads, int64_t group,
                       float scale, float cap, T* out) {
  using bf16_tiles::ROWS, bf16_tiles::STEP;
  constexpr int64_t PAIRS = 4 * ROWS;  // value pairs made at a time: four steps
  const auto* keys = reinterpret_cast<const uint16_t*>(key_cache);
  const auto* values = reinterpret_cast<const uint16_t*>(value_cache);
  const int64_t count = rows * group;  // queries; tiles read 16 rows from any query's, so ROWS more are kept
  const int64_t width = score_width(tails, prefix, rows), paired = (width + STEP - 1) / STEP * STEP;
  const int64_t whole = prefix / STEP * STEP;  // the prefix's whole steps; the rest joins each row's tail
  std::vector<float> scores(count * width), accumulator((count + ROWS) * DIM, 0.0f), block(ROWS * ROWS);
  const std::vector<uint16_t> query16 = queries_bf16<DIM>(queries, count, heads, group);
  std::vector<uint16_t> weights16((count + ROWS) * paired, 0), key_tile(ROWS * DIM), zeros(DIM, 0);
  std::vector<uint32_t> query_tiles, pair_tile(PAIRS * DIM);
  const amx::Tiles tiles;
  // Scores of the queries [first, last), 16 a tile, for keys at sequence indices [offset, offset + n) (cache rows
  // through `slots` when given, else consecutive from 0): each tile of keys read once for all the queries.
  auto score_keys = [&](const int64_t* slots, int64_t n, int64_t first, int64_t last, int64_t offset) {
    const int64_t groups = (last - first + ROWS - 1) / ROWS;
    query_tiles.resize(groups * DIM / 2 * ROWS);
    for (int64_t g = 0; g < groups; ++g) {
      const int in_group = static_cast<int>(std::min<int64_t>(ROWS, last - first - g * ROWS));
      bf16_tiles::query_pairs<DIM>(query16.data() + (first + g * ROWS) * DIM, in_group,
                                   query_tiles.data() + g * DIM / 2 * ROWS);
    }
    for (int64_t b = 0; b < n; b += ROWS) {
      const int64_t filled = std::min<int64_t>(ROWS, n - b);
      const uint16_t* tile = key_rows<DIM>(keys, slots, b, n, key_tile.data());
      if (!slots) prefetch_rows(keys + (b + kPrefetchTiles * ROWS) * DIM, ROWS, DIM * 2);  // the hardware lags here
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t q = first + g * ROWS;
        bf16_tiles::score_tile<DIM>(query_tiles.data() + g * DIM / 2 * ROWS, tile, DIM, block.data());
        bf16_tiles::transpose16(block.data(), static_cast<int>(std::min<int64_t>(ROWS, last - q)),
                                static_cast<int>(filled), scale, scores.data() + q * width + offset + b, width);
      }
    }
  };
  score_keys(nullptr, prefix, 0, count, 0);
  for (int64_t r = 0; r < rows; ++r) {
    score_keys(tails[r].data(), tails[r].size(), r * group, (r + 1) * group, prefix);
  }
  for (int64_t i = 0; i < count; ++i) {
    const int64_t n = prefix + static_cast<int64_t>(tails[i / group].size());
    softmax_bf16(scores.data() + i * width, n, cap, weights16.data() + i * paired);
  }
  // The value rows at sequence indices [start, start + n) (through `slots` when given, else consecutive from
  // `start`; zero rows after the n up to a whole step) into the sums of queries [first, last), 16 a tile: in
  // place where a tile's rows are those queries' or past the last query, else through a tile of their own.
  std::vector<float> own(ROWS * DIM);
  auto add_values = [&](const int64_t* slots, int64_t start, int64_t n, int64_t first, int64_t last) {
    for (int64_t b = 0; b < n; b += 2 * PAIRS) {
      const int64_t pairs = std::min<int64_t>(PAIRS, (n - b + 1) / 2), steps = (2 * pairs + STEP - 1) / STEP;
      const auto slot = [&](int64_t i) -> int64_t { return i >= n ? -1 : slots ? slots[i] : start + i; };
      for (int64_t m = 0; m < steps * ROWS; ++m) {
        const int64_t a = slot(b + 2 * m), c = slot(b + 2 * m + 1);
        if (!slots) prefetch_rows(values + (start + b + 2 * m + 2 * PAIRS) * DIM, 2, DIM * 2);
        bf16_dots::interleave<DIM>(a < 0 ? zeros.data() : values + a * DIM, c < 0 ? zeros.data() : values + c * DIM,
                                   pair_tile.data() + m * DIM);
      }
      for (int64_t q = first; q < last; q += ROWS) {
        const int64_t in_group = std::min<int64_t>(ROWS, last - q);
        const bool in_place = in_group == ROWS || q + in_group == count;
        float* acc = in_place ? accumulator.data() + q * DIM : own.data();
        if (!in_place) std::copy_n(accumulator.begin() + q * DIM, in_group * DIM, own.begin());
        bf16_tiles::add_value_tiles<DIM>(weights16.data() + q * paired + start + b, paired, pair_tile.data(),
                                         static_cast<int>(steps), acc);
        if (!in_place) std::copy_n(own.begin(), in_group * DIM, accumulator.begin() + q * DIM);
      }
    }
  };
  add_values(nullptr, 0, whole, 0, count);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int64_t> sequence(prefix - whole);
    std::iota(sequence.begin(), sequence.end(), whole);
    sequence.insert(sequence.end(), tails[r].begin(), tails[r].end());
    add_values(sequence.data(), whole, sequence.size(), r * group, (r + 1) * group);
  }
  store_sums<T, DIM>(accumulator.data(), count, heads, group, out);
}
#endif

// A tile of an int8 cache's value sums whose largest softmax weight is at least this has its weights quantized
// to two bytes: one byte's error of up to 1/510 of that weight on each of its keys' weights would otherwise show
// (the attention sink, the last few tokens); lighter tiles, most of a long context's, cost one pass.
constexpr float kFineWeight = 1.0f / 128;

// One KV head's part of an int8 cache (Int8Kv).
struct Int8Head {
  const uint8_t* keys;
  const int8_t* values;
  const float* scales;
};

// `attend` on an int8 cache (int8_dots.h): each query quantized like a key, its scores integer dot products of
// 16 keys a tile and block (vpdpbusd) times the query's and each key's block scale, summed over the blocks in
// order; the exponentials of the softmax times each value row's scale, as bytes under a scale per 16 keys of the
// row's key sequence, and the value sums integer sums a tile (vpdpbusd) times that scale, added over the tiles in
// order, then divided by the exponentials' total (one pass over the weights fewer than normalizing them first).
template <typename T, int DIM>
void attend_int8(const float* queries, const Int8Head& cache, const std::vector<int64_t>* tails, int64_t prefix,
                 int64_t rows, int64_t heads, int64_t group, float scale, float cap, T* out) {
  constexpr int QUERIES = 4;  // queries scored in one pass over a key tile
  constexpr int BLOCKS = DIM / int8_dots::BLOCK, ROWS = BLOCKS + 1;  // a tile's scale rows: the keys', the values'
  const int64_t count = rows * group;  // queries
  const int64_t width = score_width(tails, prefix, rows);
  std::vector<float> scores(count * width), accumulator(count * DIM, 0.0f), query_scales(count * BLOCKS);
  std::vector<uint32_t> codes(count * DIM / 4);
  std::vector<int32_t> starts(count * BLOCKS);
  std::vector<uint8_t> key_tile(LANES * DIM, 0);
  float tile_scales[ROWS * LANES] = {};
  float block[QUERIES][LANES];
  for (int64_t i = 0; i < count; ++i) {
    auto* query = reinterpret_cast<int8_t*>(codes.data() + i * DIM / 4);
    const float* x = queries + ((i / group) * heads + i % group) * DIM;
    for (int b = 0; b < BLOCKS; ++b) {
      const int first = b * int8_dots::BLOCK;
      query_scales[i * BLOCKS + b] = int8_dots::quantize(x + first, query + first, int8_dots::BLOCK) * scale;
      int32_t sum = 0;
      for (int d = first; d < first + int8_dots::BLOCK; ++d) sum += query[d];
      starts[i * BLOCKS + b] = -128 * sum;
    }
  }
  const auto value_scale = [&](int64_t slot) { return cache.scales[scale_index(slot, BLOCKS, DIM)]; };
  auto score_keys = [&](const int64_t* slots, int64_t n, int64_t first_query, int64_t last_query, int64_t offset) {
    for (int64_t b = 0; b < n; b += LANES) {
      const int64_t filled = std::min<int64_t>(LANES, n - b);
      const uint8_t* tile = key_tile.data();
      const float* key_scales = tile_scales;  // [BLOCKS][16]
      if (!slots) {  // a stream of whole tiles (the slots past the prefix in its last one are scored, not kept)
        prefetch_rows(cache.keys + (b + kPrefetchTiles * LANES) * DIM, LANES, DIM);
        tile = cache.keys + b * DIM;
        key_scales = cache.scales + scale_index(b, 0, DIM);
      } else {
        for (int64_t i = 0; i < filled; ++i) {
          int8_dots::gather_key(cache.keys, slots[b + i], key_tile.data(), static_cast<int>(i), DIM);
          for (int r = 0; r < BLOCKS; ++r) tile_scales[r * LANES + i] = cache.scales[scale_index(slots[b + i], r, DIM)];
        }
      }
      queries_in<QUERIES>(first_query, last_query, [&](int64_t i, auto count) {
        constexpr int Q = decltype(count)::value;
        const uint32_t* q[Q];
        const int32_t* start[Q];
        const float* query_scale[Q];
        float* out[Q];  // a whole tile's scores straight into their rows, a last part tile's through `block`
        for (int j = 0; j < Q; ++j) {
          q[j] = codes.data() + (i + j) * DIM / 4, start[j] = starts.data() + (i + j) * BLOCKS;
          query_scale[j] = query_scales.data() + (i + j) * BLOCKS;
          out[j] = filled == LANES ? scores.data() + (i + j) * width + offset + b : block[j];
        }
        int8_dots::scores16<DIM, Q>(q, start, query_scale, tile, key_scales, out);
        if (filled == LANES) return;
        for (int j = 0; j < Q; ++j) std::copy(block[j], block[j] + filled, scores.data() + (i + j) * width + offset + b);
      });
    }
  };
  score_keys(nullptr, prefix, 0, count, 0);
  for (int64_t r = 0; r < rows; ++r) {
    score_keys(tails[r].data(), tails[r].size(), r * group, (r + 1) * group, prefix);
  }
  // Each query's exponentials times their value rows' scales, by tiles of 16 keys of its key sequence (the
  // prefix, then its row's tail), as bytes under a scale a tile (int8_dots::quantize_weights), to two bytes in a
  // tile that holds a softmax weight of at least kFineWeight; zeros past its keys.
  const int64_t tiles = (width + LANES - 1) / LANES;
  std::vector<uint8_t> weight_codes(count * tiles * LANES, 0), fine_codes(count * tiles * LANES, 0);
  std::vector<float> weight_scales(count * tiles, 0.0f), fine_scales(count * tiles, 0.0f), totals(count);
  for (int64_t i = 0; i < count; ++i) {
    const auto& tail = tails[i / group];
    const int64_t n = prefix + static_cast<int64_t>(tail.size());
    float* p = scores.data() + i * width;  // exponentials; each query's sums are divided by their total at the end
    totals[i] = exponentials(p, n, cap);
    for (int64_t t = 0; t * LANES < n; ++t) {
      float w[LANES];
      const int64_t first = t * LANES, at = i * tiles + t;
      float top = 0.0f;
      if (first + LANES <= prefix) {  // a whole tile of the prefix: its value scales lie side by side
        const float* row_scales = cache.scales + scale_index(first, BLOCKS, DIM);
        for (int l = 0; l < LANES; ++l) w[l] = p[first + l] * row_scales[l];
        top = int8_dots::largest(p + first);
      } else {
        for (int64_t k = first; k < first + LANES; ++k) {
          w[k - first] = k < n ? p[k] * value_scale(k < prefix ? k : tail[k - prefix]) : 0.0f;
          if (k < n) top = std::max(top, p[k]);
        }
      }
      const bool fine = top >= kFineWeight * totals[i];
      weight_scales[at] = int8_dots::quantize_weights(w, weight_codes.data() + at * LANES,
                                                      fine ? fine_codes.data() + at * LANES : nullptr);
      if (fine) fine_scales[at] = weight_scales[at] / 255.0f;
    }
  }
  // The value tiles [first, first + n) of the key sequence, laid out at `values`, into the queries' sums.
  const auto add_values = [&](const int8_t* values, int64_t first, int64_t n, int64_t first_query, int64_t last_query) {
    queries_in<2>(first_query, last_query, [&](int64_t i, auto count) {
      constexpr int Q = decltype(count)::value;
      const uint32_t *w[Q], *w_fine[Q];
      const float *tile_scale[Q], *fine_scale[Q];
      float* acc[Q];
      for (int j = 0; j < Q; ++j) {
        const int64_t at = (i + j) * tiles + first;
        w[j] = reinterpret_cast<const uint32_t*>(weight_codes.data() + at * LANES), tile_scale[j] = &weight_scales[at];
        w_fine[j] = reinterpret_cast<const uint32_t*>(fine_codes.data() + at * LANES), fine_scale[j] = &fine_scales[at];
        acc[j] = accumulator.data() + (i + j) * DIM;
      }
      int8_dots::add_value_tiles<DIM, Q>(w, tile_scale, w_fine, fine_scale, values, n, acc);
    });
  };
  constexpr int64_t TILES = 4;  // prefix tiles summed at a time for all queries (8 KB at D = 128: they stay in L1)
  const int64_t whole = prefix / LANES;  // the prefix's whole tiles, read in place
  for (int64_t t = 0; t < whole; t += TILES) {
    prefetch_rows(cache.values + (t + kPrefetchTiles) * LANES * DIM, TILES * LANES, DIM);
    add_values(cache.values + t * LANES * DIM, t, std::min(TILES, whole - t), 0, count);
  }
  std::vector<int8_t> gathered(LANES * DIM);  // the rest of a row's sequence: the prefix's last keys, its tail
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int64_t> sequence;
    for (int64_t k = whole * LANES; k < prefix; ++k) sequence.push_back(k);
    sequence.insert(sequence.end(), tails[r].begin(), tails[r].end());
    const int64_t n = (static_cast<int64_t>(sequence.size()) + LANES - 1) / LANES;
    gathered.resize(n * LANES * DIM);  // lanes past the sequence keep what they held: their weights are 0
    for (size_t k = 0; k < sequence.size(); ++k) {
      int8_dots::gather_value(cache.values, sequence[k], gathered.data() + (k / LANES) * LANES * DIM, k % LANES, DIM);
    }
    add_values(gathered.data(), whole, n, r * group, (r + 1) * group);
  }
  for (int64_t i = 0; i < count; ++i) {
    const float inverse = 1.0f / totals[i];
    for (int d = 0; d < DIM; ++d) accumulator[i * DIM + d] *= inverse;
  }
  store_sums<T, DIM>(accumulator.data(), count, heads, group, out);
}

// Causal rows (a prefill) attend in chunks of this many: a chunk's rows read the keys before it as their prefix
// and the chunk's rows up to their own as their tails, so each row gets bitwise what a decode step at its
// position gets. Larger chunks read the prefix fewer times; smaller ones gather fewer tail keys row by row.
constexpr int64_t kCausalChunk = 64;

constexpr int64_t kUnitRows = 8;  // rows a unit takes at most: more, and their scores outgrow the caches

// The rows' attention (queries [rows][heads][D] fp32) over the cache, row r seeing slots [0, prefix) then
// tails[r]: units of a KV head's query group and a chunk of the rows, spread over the threads. Each unit reads its
// head's prefix once for all its rows, so the rows are cut into as few chunks of at most kUnitRows as give every
// thread the same number of units (up to 8 rows: one chunk with 2 KV heads on 2 threads, two with 3 heads).

constexpr int64_t kSpreadFromKeys = 1024;  // below, a unit's work is too small to share out

template <typename T, typename Kv>
void attend_rows(const float* queries, const Kv& cache, int64_t prefix, const std::vector<int64_t>* tails,
                 int64_t rows, T* out, const Decoder& decoder) {
  const int64_t heads = decoder.heads, kv_heads = decoder.kv_heads, dim = decoder.head_dim;
  const int64_t slots = cache.slots, group = heads / kv_heads;
  const int64_t threads = at::get_num_threads();
  const int64_t balanced = threads / std::gcd(kv_heads, threads);  // chunks that give each thread as many units
  const int64_t wanted = std::min(rows, balanced * ((rows + balanced * kUnitRows - 1) / (balanced * kUnitRows)));
  const int64_t chunk = (rows + wanted - 1) / wanted;
  const int64_t chunks = (rows + chunk - 1) / chunk;
  const int64_t cost = (prefix + rows) * group * std::min(rows, chunk);  // key-query pairs in a unit
#ifdef BF16_TILES
  const bool tiles = amx::ready();
#else
  constexpr bool tiles = false;
#endif
  // fewer units than threads (a decode step of a model with few KV heads) over a long prefix: each unit's work spread
  // over the threads (`attend_bf16`), the units one after another
  const bool spread = std::is_same_v<Kv, PlainKv<at::BFloat16>> && !tiles && kv_heads * chunks < threads &&
                      prefix >= kSpreadFromKeys;
  const auto run = [&](int64_t begin, int64_t end) {
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t g = unit / chunks, first = (unit % chunks) * chunk, n = std::min(chunk, rows - first);
      const float* q = queries + (first * heads + g * group) * dim;
      const auto* rows_tails = tails + first;
      T* o = out + (first * heads + g * group) * dim;
      const float s = static_cast<float>(decoder.scale), cap = decoder.attention_cap;
      with_head_dim(dim, [&](auto head_dim) {
        constexpr int DIM = decltype(head_dim)::value;
        if constexpr (std::is_same_v<Kv, Int8Kv>) {
          const Int8Head head{cache.keys + g * slots * dim, cache.values + g * slots * dim, cache.head_scales(g, dim)};
          attend_int8<T, DIM>(q, head, rows_tails, prefix, n, heads, group, s, cap, o);
        } else {
          const auto* k = cache.keys + g * slots * dim;
          const auto* v = cache.values + g * slots * dim;
          if constexpr (std::is_same_v<Kv, PlainKv<at::BFloat16>>) {
#ifdef BF16_TILES
            if constexpr (DIM % 64 == 0) {  // the tiles' passes take 64 dims
              if (tiles) return attend_bf16_tiles<DIM>(q, k, v, rows_tails, prefix, n, heads, group, s, cap, o);
            }
#endif
            attend_bf16<DIM>(q, k, v, rows_tails, prefix, n, heads, group, s, cap, o, spread);
          } else {
            attend<T, DIM>(q, k, v, rows_tails, prefix, n, heads, group, s, cap, o);
          }
        }
      });
    }
  };
  if (spread) return run(0, kv_heads * chunks);
  at::parallel_for(0, kv_heads * chunks, cost > 1024 ? 1 : kv_heads * chunks, run);
}

// `cache` seen from slot `first` on: the same heads, their slots numbered from there.
template <typename C>
PlainKv<C> from_slot(const PlainKv<C>& cache, int64_t first, int64_t dim) {
  return {cache.keys + first * dim, cache.values + first * dim, cache.slots};
}

// `attend_rows` in a sliding window: row r (at position prefix + tails[r].size() - 1; its tail's k-th key at
// position prefix + k) sees the keys from position p - window + 1 on. Its key sequence starts there, so the cache
// is read from that key's slot, as a decode step at p reads it: runs of rows whose windows start together attend
// in one call. The cache's slot 0 holds position `first` (a window's cache keeps only the last positions).
template <typename T, typename Kv>
void attend_window(const float* queries, const Kv& cache, int64_t prefix, const std::vector<int64_t>* tails,
                   int64_t rows, T* out, const Decoder& decoder, int64_t window, int64_t first) {
  if constexpr (std::is_same_v<Kv, Int8Kv>) {
    TORCH_CHECK(false, "an int8 cache does not run sliding-window layers");
  } else {
    const int64_t stride = decoder.heads * decoder.head_dim;
    const auto first_key = [&](int64_t r) {
      const int64_t position = prefix + static_cast<int64_t>(tails[r].size()) - 1;
      return std::max<int64_t>(0, position - window + 1);
    };
    for (int64_t r = 0; r < rows;) {
      const int64_t seen_from = first_key(r), shift = std::min(seen_from, prefix);
      TORCH_CHECK(shift >= first, "a window's cache no longer holds the keys a row sees");
      int64_t end = r + 1;
      while (end < rows && first_key(end) == seen_from) ++end;
      std::vector<std::vector<int64_t>> seen(end - r);
      for (int64_t i = r; i < end; ++i) {
        for (size_t k = 0; k < tails[i].size(); ++k) {
          if (prefix + static_cast<int64_t>(k) >= seen_from) seen[i - r].push_back(tails[i][k] - shift);
        }
      }
      attend_rows<T>(queries + r * stride, from_slot(cache, shift - first, decoder.head_dim), prefix - shift,
                     seen.data(), end - r, out + r * stride, decoder);
      r = end;
    }
  }
}

// Rotate the rows' queries and keys, write keys and values to the cache at positions [written, written + rows),
// and attend: through `tails` (a tree: one per row), else causally (written = prefix). The cache's slot 0 holds
// position `first` (0 but in a sliding window's cache).
template <typename T, typename Kv>
void attention(const Layer& layer, const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
               const Kv& cache, int64_t first, int64_t prefix, int64_t written,
               const std::vector<std::vector<int64_t>>* tails, at::Tensor& out, const Decoder& decoder,
               float* kept_queries) {
  const int64_t rows = qkv.size(0), heads = decoder.heads, kv_heads = decoder.kv_heads, dim = decoder.head_dim;
  std::vector<float> queries(rows * heads * dim);
  const at::Tensor& c = cos.dim() == 3 ? cos[layer.rope] : cos;
  const at::Tensor& s = sin.dim() == 3 ? sin[layer.rope] : sin;
  rotate_and_cache<T>(qkv.data_ptr<T>(), c.data_ptr<float>(), s.data_ptr<float>(), queries.data(), cache,
                      written - first, rows, heads, kv_heads, dim, decoder.rotary_dims, layer.q_norm, layer.k_norm,
                      static_cast<float>(decoder.eps));
  if (kept_queries) std::copy(queries.begin(), queries.end(), kept_queries);
  T* out_data = out.data_ptr<T>();
  const auto attend = [&](const float* q, int64_t first_prefix, const std::vector<int64_t>* row_tails, int64_t n,
                          T* o) {
    if (layer.window) return attend_window<T>(q, cache, first_prefix, row_tails, n, o, decoder, layer.window, first);
    attend_rows<T>(q, cache, first_prefix, row_tails, n, o, decoder);
  };
  if (tails) return attend(queries.data(), prefix, tails->data(), rows, out_data);
  for (int64_t start = 0; start < rows; start += kCausalChunk) {
    const int64_t n = std::min(kCausalChunk, rows - start), offset = start * heads * dim;
    const auto causal = tails_of(n, prefix + start, std::nullopt);
    attend(queries.data() + offset, prefix + start, causal.data(), n, out_data + offset);
  }
}

}  // namespace cpu_decoder
