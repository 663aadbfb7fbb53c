// GGUF's block-quantized weights times a few activation rows, each weight block read once for all rows.
//
// Every block type is unpacked into one integer form, a weight row at a time, into a buffer that stays in L1:
//   w[i] = A[g] * S[j] * u[i] + B[g] * M[j]
// with u[i] a small unsigned code (signed for Q8_0), S and M integers per 16 values (j) and A, B floats per
// group g (32 values for the legacy types, 256 for the K-quants). Activations are quantized per row to int8
// over the same groups (x = D[g] * a, as llama.cpp quantizes them for these types), so a dot product is
//   sum_g D[g] * (A[g] * sum_j S[j] * (u . a)_j + B[g] * sum_j M[j] * sum(a)_j)
// whose inner sums are integers: exact in any order. Each row's float steps (8 lanes, a fixed final sum) are
// the same whichever rows share the call, and the AVX-512 VNNI, AVX2 and portable paths perform the same float
// operations, so results are bitwise the same across row counts and code paths (tests/test_gguf_kernels.py).
#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define GGUF_AVX2 1
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
#define GGUF_VNNI 1  // AVX-512 VNNI: four byte products summed into an int32 lane in one step
#endif
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#ifdef __linux__
#include <sys/mman.h>
#endif

namespace gguf {

// ggml's type ids, as GGUF files store them; the TILES, each block type repacked in tiles of eight rows
// (100 + the block type); and the PAIRS, in tiles of 16 rows: two 8-row tiles whose groups alternate (`tile`).
enum Type : int64_t {
  Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14,
  Q4_0_TILES = 102, Q4_1_TILES = 103, Q5_0_TILES = 106, Q5_1_TILES = 107,
  Q8_0_TILES = 108, Q4_K_TILES = 112, Q5_K_TILES = 113, Q6_K_TILES = 114,
  Q4_0_PAIRS = 202, Q4_1_PAIRS = 203, Q5_0_PAIRS = 206, Q5_1_PAIRS = 207,
  Q8_0_PAIRS = 208, Q4_K_PAIRS = 212, Q5_K_PAIRS = 213, Q6_K_PAIRS = 214
};

constexpr int64_t kTileRows = 8;  // weight rows per tile (a pair holds two)

inline bool is_tileable(int64_t type) {
  return type == Q4_0 || type == Q4_1 || type == Q5_0 || type == Q5_1 || type == Q8_0 || type == Q4_K || type == Q5_K ||
         type == Q6_K;
}

// The block type a tiled type repacks, or 0 for any other type.
inline int64_t tiled_block_type(int64_t type) {
  const int64_t block = type % 100;
  return type > 100 && type < 300 && is_tileable(block) ? block : 0;
}
inline bool is_tiled(int64_t type) { return tiled_block_type(type) != 0; }
// 8-row tiles side by side in a unit of a tiled type: 1, or 2 in a pair.
inline int64_t tiles_per_unit(int64_t type) { return type > 200 ? 2 : 1; }
inline bool is_q4_k_tiles(int64_t type) { return tiled_block_type(type) == Q4_K; }

// Which code path computes the products: the fastest this build has, AVX2, or the portable loops. All give
// bitwise the same results; tests pick each in turn.
enum class Path { Best, Avx2, Portable };

inline Path path_named(const std::string& name) {
  if (name == "best") return Path::Best;
  if (name == "avx2") return Path::Avx2;
  if (name == "portable") return Path::Portable;
  TORCH_CHECK(false, "no kernel path named '", name, "' (best, avx2, portable)");
}

struct Layout {
  int64_t values, bytes;  // per block
  bool is_signed;         // codes are int8 (Q8_0, and Q4_0 / Q5_0 once centred), else unsigned
};

inline Layout layout(int64_t type) {
  switch (type) {
    case Q4_0: return {32, 18, true};
    case Q4_1: return {32, 20, false};
    case Q5_0: return {32, 22, true};
    case Q5_1: return {32, 24, false};
    case Q8_0: return {32, 34, true};
    case Q4_K: return {256, 144, false};
    case Q5_K: return {256, 176, false};
    case Q6_K: return {256, 210, false};
    case Q4_0_TILES: return {32, 8 * 18, true};  // a tile's 8 rows, the same bytes rearranged
    case Q4_0_PAIRS: return {32, 16 * 18, true};
    case Q4_1_TILES: return {32, 8 * 20, false};
    case Q4_1_PAIRS: return {32, 16 * 20, false};
    case Q5_0_TILES: return {32, 8 * 22, true};
    case Q5_0_PAIRS: return {32, 16 * 22, true};
    case Q5_1_TILES: return {32, 8 * 24, false};
    case Q5_1_PAIRS: return {32, 16 * 24, false};
    case Q8_0_TILES: return {32, 8 * 34, true};
    case Q8_0_PAIRS: return {32, 16 * 34, true};
    case Q4_K_TILES: return {256, 8 * 148, false};  // a tile's 8 rows (148 = 144 + the scales unpacked)
    case Q6_K_TILES: return {256, 8 * 210, false};  // a tile's 8 rows, the same bytes rearranged
    case Q4_K_PAIRS: return {256, 16 * 148, false};  // a pair's 16 rows
    case Q5_K_TILES: return {256, 8 * 180, false};  // a Q4_K tile and the 8 rows' fifth bits
    case Q5_K_PAIRS: return {256, 16 * 180, false};
    case Q6_K_PAIRS: return {256, 16 * 210, false};
    default: TORCH_CHECK(false, "no kernel for GGUF block type ", type);
  }
}

inline float half(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
#ifdef GGUF_AVX2
  return _cvtsh_ss(bits);  // F16C: exact, like the portable conversion
#else
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
#endif
}

// One weight row in the integer form. `pair_scales` holds S once per pair of codes (the AVX2 multiply-add
// pairs them), so a chunk of 32 codes has 16 of them.
struct Unpacked {
  std::vector<uint8_t> codes;
  std::vector<int16_t> pair_scales, mins;  // [cols / 2], [cols / 16]
  std::vector<float> a, b;                 // [cols / values per block]
  void resize(int64_t cols, int64_t groups) {
    codes.resize(cols);
    pair_scales.resize(cols / 2);
    mins.resize(cols / 16);
    a.resize(groups);
    b.resize(groups);
  }
};

// ---- unpacking: the codes of 32 values at a time, natural order -------------------------------------------

// 16 bytes of nibbles: the low nibbles are values 0..15, the high ones 16..31 (legacy types).
inline void nibbles_32(const uint8_t* q, uint8_t* out) {
#ifdef GGUF_AVX2
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  const __m128i low = _mm_and_si128(bytes, _mm_set1_epi8(15));
  const __m128i high = _mm_and_si128(_mm_srli_epi16(bytes, 4), _mm_set1_epi8(15));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_set_m128i(high, low));
#else
  for (int l = 0; l < 16; ++l) {
    out[l] = q[l] & 15;
    out[l + 16] = q[l] >> 4;
  }
#endif
}

// 32 bytes of nibbles: low nibbles are values 0..31, high ones 32..63 (K-quants).
inline void nibbles_64(const uint8_t* q, uint8_t* out) {
#ifdef GGUF_AVX2
  const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
  const __m256i mask = _mm256_set1_epi8(15);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_and_si256(bytes, mask));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32), _mm256_and_si256(_mm256_srli_epi16(bytes, 4), mask));
#else
  for (int l = 0; l < 32; ++l) {
    out[l] = q[l] & 15;
    out[l + 32] = q[l] >> 4;
  }
#endif
}

#ifdef GGUF_AVX2
// 16 in byte l where bit l of `bits` is set, else 0 (Q5_0 / Q5_1's fifth bits).
inline __m256i fifth_bits_vector(uint32_t bits) {
  // byte l of `spread` is byte l / 8 of `bits`; then bit l % 8 of it, as a byte mask
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)),
                                             _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                              2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(16));
}
#endif

// Adds 16 to code l (of 32) where bit l of `bits` is set (Q5_0 / Q5_1's fifth bits).
inline void fifth_bits_32(uint32_t bits, uint8_t* codes) {
#ifdef GGUF_AVX2
  const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes), _mm256_or_si256(c, fifth_bits_vector(bits)));
#else
  for (int l = 0; l < 32; ++l) codes[l] |= ((bits >> l) & 1) << 4;
#endif
}

#ifdef GGUF_AVX2
// 16 in byte l where bit `shift` of byte l of `high` is set, else 0 (Q5_K's fifth bits).
inline __m256i fifth_bits_k_vector(__m256i high, int shift) {
  const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << shift));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(high, bit), bit), _mm256_set1_epi8(16));
}
#endif

// Adds 16 to code l (of 32) where bit `shift` of high[l] is set (Q5_K's fifth bits).
inline void fifth_bits_k(const uint8_t* high, int shift, uint8_t* codes) {
#ifdef GGUF_AVX2
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(high));
  const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes), _mm256_or_si256(c, fifth_bits_k_vector(h, shift)));
#else
  for (int l = 0; l < 32; ++l) codes[l] |= ((high[l] >> shift) & 1) << 4;
#endif
}

// Q6_K: 64 low-nibble bytes and 32 bytes of 2-bit pairs -> 128 codes in 0..63.
inline void six_bits_128(const uint8_t* ql, const uint8_t* qh, uint8_t* out) {
#ifdef GGUF_AVX2
  const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
  const __m256i low0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
  const __m256i low1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
  const auto high = [&](int shift) {  // bits (shift, shift + 1) of each byte, moved to bits 4 and 5
    const __m256i two = _mm256_and_si256(_mm256_srli_epi16(h, shift), m2);
    return _mm256_slli_epi16(two, 4);
  };
  const __m256i hi0 = _mm256_and_si256(_mm256_srli_epi16(low0, 4), m4);
  const __m256i hi1 = _mm256_and_si256(_mm256_srli_epi16(low1, 4), m4);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_or_si256(_mm256_and_si256(low0, m4), high(0)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32), _mm256_or_si256(_mm256_and_si256(low1, m4), high(2)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 64), _mm256_or_si256(hi0, high(4)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 96), _mm256_or_si256(hi1, high(6)));
#else
  for (int l = 0; l < 32; ++l) {
    out[l] = (ql[l] & 15) | ((qh[l] & 3) << 4);
    out[l + 32] = (ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4);
    out[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
    out[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
  }
#endif
}

// Q4_K / Q5_K: the eight 6-bit scales (bytes 0-7 of `out`) and mins (8-15) from the 12 packed bytes.
inline void scales_mins_k4(const uint8_t* q, uint8_t* out) {
  uint32_t w[4];
  std::memcpy(w, q, 12);
  constexpr uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, low2 = 0x03030303;
  w[3] = ((w[2] >> 4) & low4) | (((w[1] >> 6) & low2) << 4);  // mins 4-7
  const uint32_t mins = w[1] & low6;                           // mins 0-3
  w[1] = (w[2] & low4) | (((w[0] >> 6) & low2) << 4);          // scales 4-7
  w[2] = mins;
  w[0] &= low6;                                                // scales 0-3
  std::memcpy(out, w, 16);
}

// Q4_K / Q5_K: sub-block j's 6-bit scale and min from the 12 packed bytes.
inline void scale_min_k4(int j, const uint8_t* q, int& scale, int& min) {
  if (j < 4) {
    scale = q[j] & 63;
    min = q[j + 4] & 63;
  } else {
    scale = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
    min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// S and M of the 16-value sub-block `j`, both halves of a 32-value sub-block alike where they come in 32s.
inline void set_sub(Unpacked& u, int64_t j, int s, int m) {
  std::fill_n(u.pair_scales.data() + 8 * j, 8, static_cast<int16_t>(s));
  u.mins[j] = static_cast<int16_t>(m);
}

inline void unpack_row(const uint8_t* row, int64_t type, int64_t cols, Unpacked& u) {
  const Layout l = layout(type);
  const int64_t blocks = cols / l.values;
  u.resize(cols, blocks);
  for (int64_t k = 0; k < blocks; ++k) {
    const uint8_t* b = row + k * l.bytes;
    uint8_t* codes = u.codes.data() + k * l.values;
    const int64_t sub = k * l.values / 16;  // first 16-value sub-block
    switch (type) {
      case Q4_0:
      case Q4_1:
      case Q5_0:
      case Q5_1: {
        const bool five = type == Q5_0 || type == Q5_1, with_min = type == Q4_1 || type == Q5_1;
        const float d = half(b);
        const int64_t head = (with_min ? 4 : 2) + (five ? 4 : 0);
        nibbles_32(b + head, codes);
        if (five) {
          uint32_t bits;
          std::memcpy(&bits, b + head - 4, 4);
          fifth_bits_32(bits, codes);
        }
        u.a[k] = d;
        if (with_min) {
          u.b[k] = half(b + 2);
        } else {  // w = d (u - 8) or d (u - 16): signed codes, so no offset term (which costs a pass per row)
          const uint8_t middle = five ? 16 : 8;
          for (int i = 0; i < 32; ++i) codes[i] = static_cast<uint8_t>(codes[i] - middle);
          u.b[k] = 0.0f;
        }
        set_sub(u, sub, 1, with_min);
        set_sub(u, sub + 1, 1, with_min);
        break;
      }
      case Q8_0:
        std::memcpy(codes, b + 2, 32);
        u.a[k] = half(b);
        u.b[k] = 0.0f;
        set_sub(u, sub, 1, 0);
        set_sub(u, sub + 1, 1, 0);
        break;
      case Q4_K:
      case Q5_K: {
        const uint8_t* scales = b + 4;
        const uint8_t* high = b + 16;  // Q5_K only
        const uint8_t* qs = b + (type == Q5_K ? 48 : 16);
        for (int c = 0; c < 4; ++c) {  // 64 values: sub-blocks 2c (low nibbles) and 2c + 1 (high)
          nibbles_64(qs + 32 * c, codes + 64 * c);
          if (type == Q5_K) {
            fifth_bits_k(high, 2 * c, codes + 64 * c);
            fifth_bits_k(high, 2 * c + 1, codes + 64 * c + 32);
          }
          for (int h = 0; h < 2; ++h) {
            int s, m;
            scale_min_k4(2 * c + h, scales, s, m);
            set_sub(u, sub + 4 * c + 2 * h, s, m);
            set_sub(u, sub + 4 * c + 2 * h + 1, s, m);
          }
        }
        u.a[k] = half(b);
        u.b[k] = -half(b + 2);
        break;
      }
      case Q6_K: {
        const uint8_t* ql = b;
        const uint8_t* qh = b + 128;
        const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
        six_bits_128(ql, qh, codes);
        six_bits_128(ql + 64, qh + 32, codes + 128);
        for (int j = 0; j < 16; ++j) set_sub(u, sub + j, scales[j], scales[j]);
        const float d = half(b + 208);
        u.a[k] = d;
        u.b[k] = -32.0f * d;  // w = d S (u - 32) = d S u - 32 d S
        break;
      }
      default: layout(type);
    }
  }
}

// ---- activations -----------------------------------------------------------------------------------------

// Rows of x quantized to int8 per group of `group` values: x = scale * q; sums of q per 16 values.
struct Quantized {
  int64_t rows = 0, cols = 0, group = 0;
  std::vector<int8_t> q;
  std::vector<float> scale;
  std::vector<int16_t> sums, sums32;  // sums of q per 16 and per 32 values

  Quantized(const float* x, int64_t rows_, int64_t cols_, int64_t group_)
      : rows(rows_), cols(cols_), group(group_), q(rows_ * cols_), scale(rows_ * cols_ / group_),
        sums(rows_ * cols_ / 16), sums32(rows_ * cols_ / 32) {
    for (int64_t g = 0; g < rows * cols / group; ++g) {
      const float* in = x + g * group;
      float amax = 0.0f;
      for (int64_t i = 0; i < group; ++i) amax = std::max(amax, std::fabs(in[i]));
      const float d = amax / 127.0f, inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
      scale[g] = d;
      int8_t* out = q.data() + g * group;
      for (int64_t i = 0; i < group; ++i) out[i] = static_cast<int8_t>(std::nearbyint(in[i] * inverse));
    }
    for (int64_t j = 0; j < rows * cols / 16; ++j) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += q[j * 16 + i];
      sums[j] = static_cast<int16_t>(sum);
    }
    for (int64_t j = 0; j < rows * cols / 32; ++j) sums32[j] = static_cast<int16_t>(sums[2 * j] + sums[2 * j + 1]);
  }
};

// ---- the dot products --------------------------------------------------------------------------------------
//
// Per row and group g: P = sum_j S[j] (u . a)_j and Q = sum_j M[j] sum(a)_j, each in 8 int32 lanes (lane l
// holds code pairs 2l, 2l + 1 of every 32 codes, and sub-blocks 2l, 2l + 1 of the group), then
//   acc += float(P) * (D[g] A[g]),  offset += float(Q) * (D[g] B[g])   lane by lane, fused multiply-adds,
// and the result is lane_sum(acc) + lane_sum(offset). Every path below performs exactly these operations.

// The eight float lanes summed in one fixed order (the AVX2 path's).
inline float lane_sum(const float* v) {
  return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

// Q lanes of group g for activation row r.
inline void offset_lanes(const Unpacked& u, const Quantized& x, int64_t r, int64_t g, int64_t values,
                         int32_t* lanes) {
  const int64_t per = values / 16, first = g * per;
  const int16_t* sums = x.sums.data() + r * x.cols / 16;
  for (int l = 0; l < 8; ++l) {
    int32_t q = 0;
    for (int64_t j = first + 2 * l; j < std::min(first + 2 * l + 2, first + per); ++j) q += u.mins[j] * sums[j];
    lanes[l] = q;
  }
}

// Portable: out[r] for rows [first, first + n).
template <bool SIGNED>
void dots_portable(const Unpacked& u, const Quantized& x, int64_t first, int64_t n, int64_t values, float* out) {
  const int64_t cols = x.cols, groups = cols / values;
  for (int64_t r = first; r < first + n; ++r) {
    const int8_t* a = x.q.data() + r * cols;
    float acc[8] = {}, offset[8] = {};
    for (int64_t g = 0; g < groups; ++g) {
      int32_t lanes[8] = {};
      for (int64_t c = g * values; c < (g + 1) * values; c += 32) {
        for (int k = 0; k < 16; ++k) {  // k: a pair of codes
          const int64_t i = c + 2 * k;
          const int32_t w0 = SIGNED ? static_cast<int8_t>(u.codes[i]) : u.codes[i];
          const int32_t w1 = SIGNED ? static_cast<int8_t>(u.codes[i + 1]) : u.codes[i + 1];
          lanes[k / 2] += (w0 * a[i] + w1 * a[i + 1]) * u.pair_scales[i / 2];
        }
      }
      const float d = x.scale[r * groups + g];
      const float s = d * u.a[g];
      for (int l = 0; l < 8; ++l) acc[l] = std::fma(static_cast<float>(lanes[l]), s, acc[l]);
      if (u.b[g] != 0.0f) {
        offset_lanes(u, x, r, g, values, lanes);
        const float t = d * u.b[g];
        for (int l = 0; l < 8; ++l) offset[l] = std::fma(static_cast<float>(lanes[l]), t, offset[l]);
      }
    }
    out[r] = lane_sum(acc) + lane_sum(offset);
  }
}

#ifdef GGUF_AVX2
inline float lane_sum(__m256 v) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  return lane_sum(lanes);
}

// codes (unsigned, or int8 with SIGNED) times int8 activations in pairs, times the pairs' scales, into lanes.
template <bool SIGNED>
inline __m256i pair_products(__m256i codes, __m256i a, __m256i scales) {
  if (SIGNED) return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(codes, codes), _mm256_sign_epi8(a, codes)), scales);
  return _mm256_madd_epi16(_mm256_maddubs_epi16(codes, a), scales);
}

inline __m256i load256(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// AVX2 over the unpacked row (any type): ROWS rows share each load of the codes and scales.
template <bool SIGNED, int ROWS>
void dots_avx2(const Unpacked& u, const Quantized& x, int64_t first, int64_t values, float* out) {
  const int64_t cols = x.cols, groups = cols / values;
  __m256 acc[ROWS], offset[ROWS];
  const int8_t* a[ROWS];
  for (int r = 0; r < ROWS; ++r) {
    acc[r] = offset[r] = _mm256_setzero_ps();
    a[r] = x.q.data() + (first + r) * cols;
  }
  for (int64_t g = 0; g < groups; ++g) {
    __m256i lanes[ROWS];
    for (int r = 0; r < ROWS; ++r) lanes[r] = _mm256_setzero_si256();
    for (int64_t c = g * values; c < (g + 1) * values; c += 32) {
      const __m256i w = load256(u.codes.data() + c), s = load256(u.pair_scales.data() + c / 2);
      for (int r = 0; r < ROWS; ++r) lanes[r] = _mm256_add_epi32(lanes[r], pair_products<SIGNED>(w, load256(a[r] + c), s));
    }
    for (int r = 0; r < ROWS; ++r) {
      const float d = x.scale[(first + r) * groups + g];
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes[r]), _mm256_set1_ps(d * u.a[g]), acc[r]);
      if (u.b[g] != 0.0f) {
        alignas(32) int32_t q[8];
        offset_lanes(u, x, first + r, g, values, q);
        offset[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(load256(q)), _mm256_set1_ps(d * u.b[g]), offset[r]);
      }
    }
  }
  for (int r = 0; r < ROWS; ++r) out[first + r] = lane_sum(acc[r]) + lane_sum(offset[r]);
}

// An activation row as the K-quant kernels walk it: its int8 values, per-group scales and per-16 sums.
struct RowCursor {
  const int8_t* q = nullptr;
  const float* scale = nullptr;
  const int16_t* sums = nullptr;
};

template <int ROWS>
inline void k_cursors(const Quantized& x, int64_t first, RowCursor (&rows)[ROWS]) {
  for (int r = 0; r < ROWS; ++r)
    rows[r] = {x.q.data() + (first + r) * x.cols, x.scale.data() + (first + r) * (x.cols / 256),
               x.sums.data() + (first + r) * x.cols / 16};
}

// The end of K-quant group g (256 values) for one activation row: P lanes into acc, the 16 sub-blocks' M[j]
// (`mins`, int16) times the row's sums into the offset lanes, as the paths above do (D[g] A[g] and D[g] B[g]
// are the same float products in every lane).
inline void close_k_group(const RowCursor& row, int64_t g, __m256i lanes, __m256i mins, __m256 da, __m256 db,
                          __m256& acc, __m256& offset) {
  const __m256 d = _mm256_broadcast_ss(row.scale + g);
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_mul_ps(d, da), acc);
  const __m256i q = _mm256_madd_epi16(mins, load256(row.sums + g * 16));
  offset = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), _mm256_mul_ps(d, db), offset);
}

// vpshufb patterns that copy int16 word k of each 128-bit half to all eight words of that half.
alignas(32) inline constexpr uint8_t broadcast_word[8][32] = {
#define GGUF_WORD(k) {2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, \
  2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, \
  2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1, 2 * k, 2 * k + 1}
    GGUF_WORD(0), GGUF_WORD(1), GGUF_WORD(2), GGUF_WORD(3), GGUF_WORD(4), GGUF_WORD(5), GGUF_WORD(6), GGUF_WORD(7),
#undef GGUF_WORD
};

// vpshufb patterns that copy int16 word 2c to the low half's eight words and word 2c + 1 to the high half's.
alignas(32) inline constexpr uint8_t word_pair[4][32] = {
#define GGUF_PAIR(c) {4 * c, 4 * c + 1, 4 * c, 4 * c + 1, 4 * c, 4 * c + 1, 4 * c, 4 * c + 1, 4 * c, 4 * c + 1, \
  4 * c, 4 * c + 1, 4 * c, 4 * c + 1, 4 * c, 4 * c + 1, 4 * c + 2, 4 * c + 3, 4 * c + 2, 4 * c + 3, 4 * c + 2, \
  4 * c + 3, 4 * c + 2, 4 * c + 3, 4 * c + 2, 4 * c + 3, 4 * c + 2, 4 * c + 3, 4 * c + 2, 4 * c + 3, 4 * c + 2, 4 * c + 3}
    GGUF_PAIR(0), GGUF_PAIR(1), GGUF_PAIR(2), GGUF_PAIR(3),
#undef GGUF_PAIR
};

// Q4_K, or Q5_K with FIVE, straight from its blocks (no unpacked copy): the same operations as the paths above.
// The chunk loop stays rolled: unrolled, the compiler keeps every product live at once and spills them (15% slower).
template <bool FIVE, int ROWS>
void dots_q4_k(const uint8_t* row, const Quantized& x, int64_t first, float* out) {
  const int64_t groups = x.cols / 256;
  const __m256i m4 = _mm256_set1_epi8(15);
  const __m128i twice = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  __m256 acc[ROWS], offset[ROWS];
  RowCursor rows[ROWS];
  k_cursors(x, first, rows);
  for (int r = 0; r < ROWS; ++r) acc[r] = offset[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* b = row + g * (FIVE ? 176 : 144);
    const uint8_t* qs = b + (FIVE ? 48 : 16);
    alignas(16) uint8_t scales[16];  // then the mins
    scales_mins_k4(b + 4, scales);
    const __m128i packed = _mm_load_si128(reinterpret_cast<const __m128i*>(scales));
    const __m256i s16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(packed));  // the eight scales, each half
    __m256i lanes[ROWS];
    for (int r = 0; r < ROWS; ++r) lanes[r] = _mm256_setzero_si256();
#pragma GCC unroll 1
    for (int c = 0; c < 4; ++c) {
      const __m256i q = load256(qs + 32 * c);
      __m256i low = _mm256_and_si256(q, m4), high = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      if (FIVE) {  // Q5_K's fifth bits: bit 2c of byte l in b + 16 for the low nibbles, bit 2c + 1 for the high
        low = _mm256_or_si256(low, fifth_bits_k_vector(load256(b + 16), 2 * c));
        high = _mm256_or_si256(high, fifth_bits_k_vector(load256(b + 16), 2 * c + 1));
      }
      const __m256i s_low = _mm256_shuffle_epi8(s16, load256(broadcast_word[2 * c]));
      const __m256i s_high = _mm256_shuffle_epi8(s16, load256(broadcast_word[2 * c + 1]));
      for (int r = 0; r < ROWS; ++r) {
        const int8_t* a = rows[r].q + g * 256 + 64 * c;
        lanes[r] = _mm256_add_epi32(lanes[r], pair_products<false>(low, load256(a), s_low));
        lanes[r] = _mm256_add_epi32(lanes[r], pair_products<false>(high, load256(a + 32), s_high));
      }
    }
    const __m256i m16 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(_mm_srli_si128(packed, 8), twice));
    const __m256 da = _mm256_set1_ps(half(b)), db = _mm256_set1_ps(-half(b + 2));
    for (int r = 0; r < ROWS; ++r) close_k_group(rows[r], g, lanes[r], m16, da, db, acc[r], offset[r]);
  }
  for (int r = 0; r < ROWS; ++r) out[first + r] = lane_sum(acc[r]) + lane_sum(offset[r]);
}

// Q6_K straight from its blocks.
template <int ROWS>
void dots_q6_k(const uint8_t* row, const Quantized& x, int64_t first, float* out) {
  const int64_t groups = x.cols / 256;
  alignas(32) uint8_t codes[128];
  __m256 acc[ROWS], offset[ROWS];
  RowCursor rows[ROWS];
  k_cursors(x, first, rows);
  for (int r = 0; r < ROWS; ++r) acc[r] = offset[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* b = row + g * 210;
    const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
    const __m128i s8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales));
    const __m256i s16 = _mm256_cvtepi8_epi16(s8);
    const __m256i halves[2] = {_mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(s8)),
                               _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_srli_si128(s8, 8)))};
    __m256i lanes[ROWS];
    for (int r = 0; r < ROWS; ++r) lanes[r] = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      six_bits_128(b + 64 * h, b + 128 + 32 * h, codes);
#pragma GCC unroll 1
      for (int c = 0; c < 4; ++c) {
        const __m256i s = _mm256_shuffle_epi8(halves[h], load256(word_pair[c]));  // S[j], S[j + 1]
        const __m256i w = load256(codes + 32 * c);
        for (int r = 0; r < ROWS; ++r)
          lanes[r] = _mm256_add_epi32(lanes[r], pair_products<false>(w, load256(rows[r].q + g * 256 + 128 * h + 32 * c), s));
      }
    }
    const __m256 da = _mm256_set1_ps(half(b + 208)), db = _mm256_set1_ps(-32.0f * half(b + 208));
    for (int r = 0; r < ROWS; ++r) close_k_group(rows[r], g, lanes[r], s16, da, db, acc[r], offset[r]);
  }
  for (int r = 0; r < ROWS; ++r) out[first + r] = lane_sum(acc[r]) + lane_sum(offset[r]);
}

// A legacy block's 32 codes in natural order, as `unpack_row` leaves them: Q4_0 and Q5_0 centred (u - 8, u - 16),
// Q4_1 and Q5_1 unsigned, Q8_0 as stored.
template <int64_t TYPE>
inline __m256i codes_32(const uint8_t* b) {
  if (TYPE == Q8_0) return load256(b + 2);
  constexpr bool five = TYPE == Q5_0 || TYPE == Q5_1, with_min = TYPE == Q4_1 || TYPE == Q5_1;
  constexpr int head = (with_min ? 4 : 2) + (five ? 4 : 0);
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + head));
  const __m128i m4 = _mm_set1_epi8(15);
  __m256i codes = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(bytes, 4), m4), _mm_and_si128(bytes, m4));
  if (five) {
    uint32_t bits;
    std::memcpy(&bits, b + head - 4, 4);
#ifdef GGUF_VNNI  // the fifth bits as a byte mask: where one is clear, u - 16 is the nibble less 16, else the nibble
    if (!with_min) return _mm256_mask_sub_epi8(codes, _cvtu32_mask32(~bits), codes, _mm256_set1_epi8(16));
    return _mm256_mask_add_epi8(codes, _cvtu32_mask32(bits), codes, _mm256_set1_epi8(16));
#else
    codes = _mm256_or_si256(codes, fifth_bits_vector(bits));
#endif
  }
  return with_min ? codes : _mm256_sub_epi8(codes, _mm256_set1_epi8(five ? 16 : 8));
}

// The 8 lanes of 4 products each of 32 codes `w` (int8 with SIGNED, then `magnitude` = |w|) and int8 activations.
template <bool SIGNED>
inline __m256i products_32(__m256i w, __m256i magnitude, __m256i a) {
#ifdef GGUF_VNNI  // the same integers in one step: vpdpbusd sums four byte products into each int32 lane
  const __m256i zero = _mm256_setzero_si256();
  return SIGNED ? _mm256_dpbusd_epi32(zero, magnitude, _mm256_sign_epi8(a, w)) : _mm256_dpbusd_epi32(zero, w, a);
#else
  (void)magnitude;
  return pair_products<SIGNED>(w, a, _mm256_set1_epi16(1));
#endif
}

// The legacy types (groups of 32) straight from their blocks: the generic path's operations with S = 1, and for
// Q4_1 / Q5_1 an offset whose first lane alone is not zero (M = 1 on both of a group's sub-blocks).
template <int64_t TYPE, int ROWS>
void dots_32(const uint8_t* row, const Quantized& x, int64_t first, float* out) {
  constexpr bool with_min = TYPE == Q4_1 || TYPE == Q5_1;
  const int64_t cols = x.cols, groups = cols / 32, bytes = layout(TYPE).bytes;
  __m256 acc[ROWS], offset[ROWS];
  for (int r = 0; r < ROWS; ++r) acc[r] = offset[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* b = row + g * bytes;
    const __m256i w = codes_32<TYPE>(b), magnitude = _mm256_sign_epi8(w, w);
    const float a = half(b), m = with_min ? half(b + 2) : 0.0f;
    for (int r = 0; r < ROWS; ++r) {
      const __m256i lanes = products_32<!with_min>(w, magnitude, load256(x.q.data() + (first + r) * cols + g * 32));
      const float d = x.scale[(first + r) * groups + g];
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_set1_ps(d * a), acc[r]);
      if (with_min && m != 0.0f) {
        const __m256i sum = _mm256_setr_epi32(x.sums32[(first + r) * groups + g], 0, 0, 0, 0, 0, 0, 0);
        offset[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(d * m), offset[r]);
      }
    }
  }
  for (int r = 0; r < ROWS; ++r) out[first + r] = lane_sum(acc[r]) + lane_sum(offset[r]);
}

// Rows in fours, then a pair, then one; each row's operations the same either way.
template <typename Kernel>
inline void by_fours(int64_t rows, Kernel kernel) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) kernel(std::integral_constant<int, 4>{}, r);
  if (r + 2 <= rows) kernel(std::integral_constant<int, 2>{}, r), r += 2;
  if (r < rows) kernel(std::integral_constant<int, 1>{}, r);
}
#endif

// ---- Q4_K in tiles of eight rows ---------------------------------------------------------------------------
//
// At load a Q4_K matrix whose rows come in eights is repacked (`tile_q4_k`): per group of 256 values, its eight
// rows' codes interleaved four values at a time, so that one 32-byte vector holds 4 values of each of the 8
// rows, and 4 values of an activation row, broadcast, multiply all 8 rows at once. On AVX2 a sub-block's 8 such
// products sum in int16 (|sum| <= 8 * 2 * 15 * 127 < 2^15) before its scale's one multiply-add: 9 integer
// multiplies per 256 products where the row-at-a-time kernel takes 16; with AVX-512 VNNI they sum into int32
// lanes four at a time. Either way each weight row's sum ends in a lane of its own.
// Per weight row i, activation row r and group g:
//   P = sum_j S[i][j] (u . a)_j,  Q = sum_j M[i][j] sum(a)_j        (integers: exact in any order)
//   acc = fma(float(P), D[g] * d[i], acc),  offset = fma(float(Q), D[g] * (0 - dmin[i]), offset)
// and the result is acc + offset, in every path alike.

struct TileQ4K {  // one group of 256 values of 8 rows
  // sub-block j: 4 vectors of 32 bytes; byte 4i + c of vector p holds row i's code of value 8p + c (low
  // nibble) and of value 8p + 4 + c (high nibble)
  uint8_t codes[8][128];
  uint8_t scales[8][8];  // [sub-block][row]
  uint8_t mins[4][16];   // [pair of sub-blocks][row][which of the pair]
  uint16_t d[8], dmin[8];  // fp16, per row
};
static_assert(sizeof(TileQ4K) == 8 * 148, "a tile group is its 8 rows' 148 bytes");

// Q5_K in the same tiles, its fifth bits beside them: bit 4i + c of fifth[j][p][0] is row i's for value 8p + c of
// sub-block j, of fifth[j][p][1] for value 8p + 4 + c (the codes of the low and high nibbles of vector p).
struct TileQ5K {
  TileQ4K k4;
  uint32_t fifth[8][4][2];
};
static_assert(sizeof(TileQ5K) == 8 * 180, "a Q5_K tile group is its 8 rows' 176 bytes and their scales unpacked");

inline const TileQ4K& k4_part(const TileQ4K& t) { return t; }
inline const TileQ4K& k4_part(const TileQ5K& t) { return t.k4; }

// A uint8 tensor [rows, cols], its bytes left for the caller to write, in memory that asks for 2 MB pages (Linux,
// `madvise`): every decode step streams the whole model, and in 4 KB pages each 4 KB of weights is a TLB miss of its own. A matrix under 2 MB
// takes ordinary pages: rounded up to whole 2 MB pages, the 1.5B's small matrices held 142 MB more.
inline at::Tensor huge_page_bytes(int64_t rows, int64_t cols) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t bytes = static_cast<size_t>(rows * cols), size = (bytes + kHuge - 1) / kHuge * kHuge;
  if (bytes < kHuge) return at::empty({rows, cols}, at::TensorOptions().dtype(at::kByte));
  void* memory = std::aligned_alloc(kHuge, size);
  TORCH_CHECK(memory, "out of memory for ", bytes, " bytes of tiles");
#ifdef __linux__
  madvise(memory, size, MADV_HUGEPAGE);
#endif
  return at::from_blob(memory, {rows, cols}, [](void* p) { std::free(p); }, at::TensorOptions().dtype(at::kByte));
}

// Blocks [rows, groups * block_bytes] (groups of VALUES values) -> units of `per_unit` 8-row tiles [rows / (8
// per_unit), groups * per_unit * sizeof(Tile)], each tile group zeroed, then `fill(tile_group, i, block)` for each of its 8 rows i: the repacking
// both tile kinds share. The threads that fill the memory are the first to touch it (a serial pass zeroing 1 GB
// first took a third of a 1.5B's load). In a pair (per_unit 2) the two tiles' groups alternate: group g of the first
// tile, of the second, then group g + 1 of each, so the pair is read as one stream.
template <typename Tile, int64_t VALUES = 256, typename Fill>
inline at::Tensor repack_tiles(const at::Tensor& blocks, int64_t cols, int64_t block_bytes, int64_t per_unit, Fill fill) {
  const int64_t unit_rows = kTileRows * per_unit;
  TORCH_CHECK(blocks.dim() == 2 && blocks.size(0) % unit_rows == 0, "tiles of ", unit_rows, " take rows in ", unit_rows, "s");
  const int64_t tiles = blocks.size(0) / kTileRows, groups = cols / VALUES, row_bytes = groups * block_bytes;
  TORCH_CHECK(blocks.size(1) == row_bytes, "blocks do not fit the type");
  const at::Tensor in = blocks.contiguous();
  at::Tensor out = huge_page_bytes(tiles / per_unit, groups * per_unit * static_cast<int64_t>(sizeof(Tile)));
  const uint8_t* src = in.data_ptr<uint8_t>();
  auto* dst = reinterpret_cast<Tile*>(out.data_ptr<uint8_t>());
  at::parallel_for(0, tiles * groups, 64, [&](int64_t begin, int64_t end) {
    for (int64_t index = begin; index < end; ++index) {
      const int64_t tile = index / groups, g = index % groups;
      Tile& group = dst[(tile / per_unit * groups + g) * per_unit + tile % per_unit];
      std::memset(&group, 0, sizeof(Tile));
      for (int i = 0; i < 8; ++i) fill(group, i, src + (tile * kTileRows + i) * row_bytes + g * block_bytes);
    }
  });
  return out;
}

// Row i of a tile from a Q4_K or Q5_K block `b` whose nibbles are at `qs`.
inline void fill_k4_tile(TileQ4K& t, int i, const uint8_t* b, const uint8_t* qs) {
    std::memcpy(&t.d[i], b, 2);
    std::memcpy(&t.dmin[i], b + 2, 2);
    uint8_t scales[16];
    scales_mins_k4(b + 4, scales);
    for (int j = 0; j < 8; ++j) {
      t.scales[j][i] = scales[j];
      t.mins[j / 2][2 * i + j % 2] = scales[8 + j];
    }
    uint8_t codes[256];
    for (int c = 0; c < 4; ++c) nibbles_64(qs + 32 * c, codes + 64 * c);
    for (int j = 0; j < 8; ++j)
      for (int p = 0; p < 4; ++p)
        for (int c = 0; c < 4; ++c)
          t.codes[j][32 * p + 4 * i + c] = codes[32 * j + 8 * p + c] | (codes[32 * j + 8 * p + 4 + c] << 4);
}

// Q4_K blocks [rows, groups * 144] -> units of `per_unit` tiles (`repack_tiles`).
inline at::Tensor tile_q4_k(const at::Tensor& blocks, int64_t cols, int64_t per_unit) {
  return repack_tiles<TileQ4K>(blocks, cols, 144, per_unit,
                               [](TileQ4K& t, int i, const uint8_t* b) { fill_k4_tile(t, i, b, b + 16); });
}

// Q5_K blocks [rows, groups * 176] -> units of `per_unit` tiles: the Q4_K tile of their nibbles, and value v's fifth
// bit, bit v / 32 of byte v % 32 of the block's 32 high-bit bytes, moved to where the tile's code of v lies.
inline at::Tensor tile_q5_k(const at::Tensor& blocks, int64_t cols, int64_t per_unit) {
  return repack_tiles<TileQ5K>(blocks, cols, 176, per_unit, [](TileQ5K& t, int i, const uint8_t* b) {
    fill_k4_tile(t.k4, i, b, b + 48);
    const uint8_t* high = b + 16;
    for (int j = 0; j < 8; ++j)
      for (int p = 0; p < 4; ++p)
        for (int c = 0; c < 4; ++c)
          for (int half_ = 0; half_ < 2; ++half_)
            t.fifth[j][p][half_] |= static_cast<uint32_t>((high[8 * p + 4 * half_ + c] >> j) & 1) << (4 * i + c);
  });
}

// Row i's fifth bit (0 or 16) for value 8p + 4h + c of sub-block j: none in a Q4_K tile.
inline int fifth_of(const TileQ4K&, int, int, int, int, int) { return 0; }
inline int fifth_of(const TileQ5K& t, int j, int p, int h, int i, int c) { return ((t.fifth[j][p][h] >> (4 * i + c)) & 1) << 4; }

// Row i of a Q4_K or Q5_K tile in the integer form (`dequantize_rows`); its groups `stride` groups apart (2 in a
// pair).
template <typename Tile>
inline void unpack_tile_row(const uint8_t* tile, int64_t i, int64_t cols, int64_t stride, Unpacked& u) {
  const int64_t groups = cols / 256;
  u.resize(cols, groups);
  for (int64_t g = 0; g < groups; ++g) {
    const Tile& whole = reinterpret_cast<const Tile*>(tile)[g * stride];
    const TileQ4K& t = k4_part(whole);
    for (int j = 0; j < 8; ++j) {
      for (int p = 0; p < 4; ++p)
        for (int c = 0; c < 4; ++c) {
          const uint8_t byte = t.codes[j][32 * p + 4 * i + c];
          u.codes[g * 256 + 32 * j + 8 * p + c] = (byte & 15) + fifth_of(whole, j, p, 0, i, c);
          u.codes[g * 256 + 32 * j + 8 * p + 4 + c] = (byte >> 4) + fifth_of(whole, j, p, 1, i, c);
        }
      set_sub(u, g * 16 + 2 * j, t.scales[j][i], t.mins[j / 2][2 * i + j % 2]);
      set_sub(u, g * 16 + 2 * j + 1, t.scales[j][i], t.mins[j / 2][2 * i + j % 2]);
    }
    u.a[g] = half(reinterpret_cast<const uint8_t*>(&t.d[i]));
    u.b[g] = -half(reinterpret_cast<const uint8_t*>(&t.dmin[i]));
  }
}

// Portable: out[i * x.rows + r] for the tile's rows i and activation rows r in [first, first + n); the tile's
// groups `stride` groups apart.
template <typename Tile>
inline void tile_dots_portable(const uint8_t* tile, const Quantized& x, int64_t first, int64_t n, int64_t stride,
                               float* out) {
  const int64_t cols = x.cols, groups = cols / 256;
  const auto* tiles = reinterpret_cast<const Tile*>(tile);
  for (int64_t r = first; r < first + n; ++r) {
    const int8_t* a = x.q.data() + r * cols;
    const int16_t* sums = x.sums32.data() + r * cols / 32;
    for (int i = 0; i < 8; ++i) {
      float acc = 0.0f, offset = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        const TileQ4K& t = k4_part(tiles[g * stride]);
        int32_t p = 0, q = 0;
        for (int j = 0; j < 8; ++j) {
          int32_t dot = 0;
          for (int k = 0; k < 16; ++k) {
            const uint8_t byte = t.codes[j][32 * (k / 4) + 4 * i + k % 4];
            const int low = (byte & 15) + fifth_of(tiles[g * stride], j, k / 4, 0, i, k % 4);
            const int high = (byte >> 4) + fifth_of(tiles[g * stride], j, k / 4, 1, i, k % 4);
            dot += low * a[g * 256 + 32 * j + 8 * (k / 4) + k % 4];
            dot += high * a[g * 256 + 32 * j + 8 * (k / 4) + 4 + k % 4];
          }
          p += t.scales[j][i] * dot;
          q += t.mins[j / 2][2 * i + j % 2] * sums[g * 8 + j];
        }
        const float d = x.scale[r * groups + g];
        acc = std::fma(static_cast<float>(p), d * half(reinterpret_cast<const uint8_t*>(&t.d[i])), acc);
        offset = std::fma(static_cast<float>(q), d * (0.0f - half(reinterpret_cast<const uint8_t*>(&t.dmin[i]))), offset);
      }
      out[i * x.rows + r] = acc + offset;
    }
  }
}

#ifdef GGUF_AVX2
// Unsigned codes times int8 activations added to `sums`: AVX2 in pairs into int16 lanes, VNNI in fours into
// int32 lanes.
template <bool VNNI>
inline __m256i products(__m256i sums, __m256i codes, __m256i a) {
#ifdef GGUF_VNNI
  if constexpr (VNNI) return _mm256_dpbusd_epi32(sums, codes, a);
#endif
  return _mm256_add_epi16(sums, _mm256_maddubs_epi16(codes, a));
}

// A sub-block's `products` times its scales, in int32 lanes: AVX2 widens pairs of int16 lanes in the
// multiply-add, VNNI's lanes are int32 already.
template <bool VNNI>
inline __m256i scaled(__m256i sums, __m256i scales) {
#ifdef GGUF_VNNI
  if constexpr (VNNI) return _mm256_mullo_epi32(sums, scales);
#endif
  return _mm256_madd_epi16(sums, scales);
}

// The end of tile group g for activation row r: P (row i's in int32 lane i) and the mins' Q into the float lanes,
// as `tile_dots_portable` does. Shared by the AVX2 and VNNI kernels, which differ only in how they sum P.
inline void close_tile_group(const TileQ4K& t, const Quantized& x, int64_t r, int64_t g, __m256i p, __m256 d,
                             __m256 neg_min, __m256& acc, __m256& offset) {
  const int64_t groups = x.cols / 256;
  const int16_t* sums = x.sums32.data() + r * x.cols / 32 + g * 8;
  __m256i q = _mm256_setzero_si256();
  for (int pair = 0; pair < 4; ++pair) {
    int32_t both;
    std::memcpy(&both, sums + 2 * pair, 4);
    const __m256i mins = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t.mins[pair])));
    q = _mm256_add_epi32(q, _mm256_madd_epi16(mins, _mm256_set1_epi32(both)));
  }
  const __m256 da = _mm256_broadcast_ss(x.scale.data() + r * groups + g);
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(da, d), acc);
  offset = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), _mm256_mul_ps(da, neg_min), offset);
}

// The tile's 8 rows' fp16 scales d and 0 - dmin, a row a lane.
inline __m256 tile_d(const TileQ4K& t) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t.d))); }
inline __m256 tile_neg_min(const TileQ4K& t) {
  return _mm256_sub_ps(_mm256_setzero_ps(), _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t.dmin))));
}

// `bytes` at `p` into L2, a line at a time (a prefetch past the matrix's end is harmless). The kernels ask for
// what they will read about 9 KB on in their stream of tiles (8 groups of one tile, 4 of a pair): on the 1.5B
// (2 threads) the hardware prefetcher alone left a one-row product 10-15% slower, and 2 groups ahead left 8 rows
// at 43 ms a forward's matrices where 8 take 34 ms. Into L2, not L1: on a Zen 4 prefetches into L1 made a
// forward's matrices 2.2x slower at one row (72 ms against 32) and 1.9x at eight, while 4 KB ahead or 18 KB
// made no difference there.
inline void prefetch(const void* p, int64_t bytes) {
  for (int64_t k = 0; k < bytes; k += 64) _mm_prefetch(reinterpret_cast<const char*>(p) + k, _MM_HINT_T1);
}
constexpr int64_t kPrefetchGroups = 8;

// Every activation row's 8 lanes stored out, lane i to weight row i's column.
template <int ROWS>
inline void store_tile_rows(const __m256 (&acc)[ROWS], const __m256 (&offset)[ROWS], const Quantized& x,
                            int64_t first, float* out) {
  for (int r = 0; r < ROWS; ++r) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, _mm256_add_ps(acc[r], offset[r]));
    for (int i = 0; i < 8; ++i) out[i * x.rows + first + r] = lanes[i];
  }
}

// The walk both 256-bit tile kernels take: a unit's HALVES tiles (2 in a pair) group by group, as they lie in
// memory, each group prefetched ahead; `group(t, g, acc, offset)` adds tile group t (group g of its tile) into that
// tile's ROWS accumulators. out[i * x.rows + r] for tile h's rows 8h + i.
template <typename Tile, int ROWS, int HALVES, typename Group>
inline void walk_tile_groups(const uint8_t* unit, const Quantized& x, int64_t first, float* out, Group group) {
  const auto* tiles = reinterpret_cast<const Tile*>(unit);
  __m256 acc[HALVES][ROWS], offset[HALVES][ROWS];
  for (int h = 0; h < HALVES; ++h)
    for (int r = 0; r < ROWS; ++r) acc[h][r] = offset[h][r] = _mm256_setzero_ps();
  for (int64_t index = 0; index < x.cols / 256 * HALVES; ++index) {
    prefetch(tiles + index + kPrefetchGroups, sizeof(Tile));
    const int h = HALVES == 1 ? 0 : index % HALVES;
    group(tiles[index], index / HALVES, acc[h], offset[h]);
  }
  for (int h = 0; h < HALVES; ++h) store_tile_rows(acc[h], offset[h], x, first, out + h * kTileRows * x.rows);
}

// ROWS activation rows share each load of the tile's codes. AVX2 sums a sub-block's pair products in int16
// (|sum| <= 8 * 2 * 15 * 127 < 2^15) and widens them in the scale's multiply-add; AVX-512 VNNI sums them
// straight into int32 lanes, four products at a time (vpdpbusd), then multiplies by the scale once. The integer
// P is the same either way, and so is every float step after it. A unit's HALVES tiles go as `walk_tile_groups`.
//
// Q5_K tiles (Tile = TileQ5K) add each code's fifth bit: on VNNI through a byte mask, on AVX2 as a vector of 16s.
// Their codes reach 31, so AVX2's int16 sums are widened after every two vectors (|sum| <= 4 * 2 * 31 * 127).
template <int ROWS, bool VNNI, int HALVES, typename Tile = TileQ4K>
void tile_dots(const uint8_t* unit, const Quantized& x, int64_t first, float* out) {
  constexpr bool five = std::is_same_v<Tile, TileQ5K>;
  const int64_t cols = x.cols;
  const __m256i m4 = _mm256_set1_epi8(15);
  walk_tile_groups<Tile, ROWS, HALVES>(unit, x, first, out, [&](const Tile& whole, int64_t g, __m256 (&acc)[ROWS],
                                                                 __m256 (&offset)[ROWS]) {
    const TileQ4K& t = k4_part(whole);
    __m256i p[ROWS];
    for (int r = 0; r < ROWS; ++r) p[r] = _mm256_setzero_si256();
#pragma GCC unroll 1
    for (int j = 0; j < 8; ++j) {
      uint64_t packed;
      std::memcpy(&packed, t.scales[j], 8);
      const __m128i s8 = _mm_cvtsi64_si128(static_cast<int64_t>(packed));
      // row i's scale: AVX2 in int16 lanes 2i, 2i + 1, VNNI in int32 lane i
      const __m256i scales = VNNI ? _mm256_cvtepu8_epi32(s8) : _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(s8, s8));
      __m256i dot[ROWS];  // AVX2: int16, row i's two pair sums in lanes 2i, 2i + 1; VNNI: int32, row i's in lane i
      for (int r = 0; r < ROWS; ++r) dot[r] = _mm256_setzero_si256();
      const int8_t* a = x.q.data() + first * cols + g * 256 + 32 * j;
      // rolled: unrolled, GCC computes every row's 8 products of the sub-block first and spills them (AVX2, 4 rows:
      // the step's matmuls 15% slower)
#pragma GCC unroll 1
      for (int v = 0; v < 4; ++v) {
        const __m256i codes = load256(t.codes[j] + 32 * v);
        __m256i low = _mm256_and_si256(codes, m4), high = _mm256_and_si256(_mm256_srli_epi16(codes, 4), m4);
        if constexpr (five) {
          const uint32_t* bits = whole.fifth[j][v];
#ifdef GGUF_VNNI
          if constexpr (VNNI) {
            low = _mm256_mask_add_epi8(low, _cvtu32_mask32(bits[0]), low, _mm256_set1_epi8(16));
            high = _mm256_mask_add_epi8(high, _cvtu32_mask32(bits[1]), high, _mm256_set1_epi8(16));
          }
#endif
          if constexpr (!VNNI) {
            low = _mm256_or_si256(low, fifth_bits_vector(bits[0]));
            high = _mm256_or_si256(high, fifth_bits_vector(bits[1]));
          }
        }
        for (int r = 0; r < ROWS; ++r) {
          int32_t front, back;  // activation values 8v .. 8v + 3 and 8v + 4 .. 8v + 7 of the sub-block
          std::memcpy(&front, a + r * cols + 8 * v, 4);
          std::memcpy(&back, a + r * cols + 8 * v + 4, 4);
          dot[r] = products<VNNI>(dot[r], low, _mm256_set1_epi32(front));
          dot[r] = products<VNNI>(dot[r], high, _mm256_set1_epi32(back));
        }
        if (five && !VNNI && v == 1) {  // widen before the int16 sums could overflow
          for (int r = 0; r < ROWS; ++r) {
            p[r] = _mm256_add_epi32(p[r], scaled<VNNI>(dot[r], scales));
            dot[r] = _mm256_setzero_si256();
          }
        }
      }
      for (int r = 0; r < ROWS; ++r) p[r] = _mm256_add_epi32(p[r], scaled<VNNI>(dot[r], scales));
    }
    const __m256 d = tile_d(t), neg_min = tile_neg_min(t);
    for (int r = 0; r < ROWS; ++r) close_tile_group(t, x, first + r, g, p[r], d, neg_min, acc[r], offset[r]);
  });
}
#endif

#ifdef GGUF_VNNI
// 32 bytes of each of a pair's two tiles, one vector (the first tile's in the low half).
inline __m512i pair_bytes(const void* a, const void* b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(load256(a)), load256(b), 1);
}

// 8 fp16 of each of a pair's two tiles, as 16 floats.
inline __m512 pair_halves(const void* a, const void* b) {
  return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
                                                 _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1));
}

// A pair's two tiles side by side in 512-bit vectors (lanes 0-7 the first tile's rows, 8-15 the second's): half the
// instructions of two calls of `tile_dots<ROWS, true>`, and every lane's integer and float steps the same as there.
// Q5_K tiles (`Tile` TileQ5K) add their fifth bits by a byte mask. out[i * x.rows + r] for the 16 weight rows i.
template <int ROWS, typename Tile = TileQ4K>
void tile_pair_dots_vnni(const uint8_t* pair, const Quantized& x, int64_t first, float* out) {
  const int64_t cols = x.cols, groups = cols / 256;
  const auto* tiles = reinterpret_cast<const Tile*>(pair);
  const __m512i m4 = _mm512_set1_epi8(15), sixteen = _mm512_set1_epi8(16);
  __m512 acc[ROWS], offset[ROWS];
  for (int r = 0; r < ROWS; ++r) acc[r] = offset[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const Tile &wa = tiles[2 * g], &wb = tiles[2 * g + 1];
    const TileQ4K &ta = k4_part(wa), &tb = k4_part(wb);
    prefetch(tiles + 2 * (g + kPrefetchGroups * sizeof(TileQ4K) / sizeof(Tile) / 2), 2 * sizeof(Tile));
    __m512i p[ROWS];
    for (int r = 0; r < ROWS; ++r) p[r] = _mm512_setzero_si512();
#pragma GCC unroll 1
    for (int j = 0; j < 8; ++j) {
      __m512i dot[ROWS];  // int32: weight row i's sub-block sum in lane i
      for (int r = 0; r < ROWS; ++r) dot[r] = _mm512_setzero_si512();
      const int8_t* a = x.q.data() + first * cols + g * 256 + 32 * j;
      for (int v = 0; v < 4; ++v) {
        const __m512i codes = pair_bytes(ta.codes[j] + 32 * v, tb.codes[j] + 32 * v);
        __m512i low = _mm512_and_si512(codes, m4), high = _mm512_and_si512(_mm512_srli_epi16(codes, 4), m4);
        if constexpr (std::is_same_v<Tile, TileQ5K>) {
          const auto bits = [&](int h) { return _cvtu64_mask64(wa.fifth[j][v][h] | uint64_t{wb.fifth[j][v][h]} << 32); };
          low = _mm512_mask_add_epi8(low, bits(0), low, sixteen);
          high = _mm512_mask_add_epi8(high, bits(1), high, sixteen);
        }
        for (int r = 0; r < ROWS; ++r) {
          int32_t front, back;
          std::memcpy(&front, a + r * cols + 8 * v, 4);
          std::memcpy(&back, a + r * cols + 8 * v + 4, 4);
          dot[r] = _mm512_dpbusd_epi32(dot[r], low, _mm512_set1_epi32(front));
          dot[r] = _mm512_dpbusd_epi32(dot[r], high, _mm512_set1_epi32(back));
        }
      }
      uint64_t sa, sb;
      std::memcpy(&sa, ta.scales[j], 8);
      std::memcpy(&sb, tb.scales[j], 8);
      const __m512i scales = _mm512_cvtepu8_epi32(_mm_set_epi64x(static_cast<int64_t>(sb), static_cast<int64_t>(sa)));
      for (int r = 0; r < ROWS; ++r) p[r] = _mm512_add_epi32(p[r], _mm512_mullo_epi32(dot[r], scales));
    }
    const __m512 d = pair_halves(ta.d, tb.d);
    const __m512 neg_min = _mm512_sub_ps(_mm512_setzero_ps(), pair_halves(ta.dmin, tb.dmin));
    __m512i mins[4];
    for (int pair = 0; pair < 4; ++pair)
      mins[pair] = _mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ta.mins[pair])))),
          _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tb.mins[pair]))), 1);
    for (int r = 0; r < ROWS; ++r) {
      const int16_t* sums = x.sums32.data() + (first + r) * cols / 32 + g * 8;
      __m512i q = _mm512_setzero_si512();
      for (int pair = 0; pair < 4; ++pair) {
        int32_t two;
        std::memcpy(&two, sums + 2 * pair, 4);
        q = _mm512_add_epi32(q, _mm512_madd_epi16(mins[pair], _mm512_set1_epi32(two)));
      }
      const __m512 da = _mm512_set1_ps(x.scale[(first + r) * groups + g]);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p[r]), _mm512_mul_ps(da, d), acc[r]);
      offset[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), _mm512_mul_ps(da, neg_min), offset[r]);
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, _mm512_add_ps(acc[r], offset[r]));
    for (int i = 0; i < 16; ++i) out[i * x.rows + first + r] = lanes[i];
  }
}

// Rows in eights, then the rest in one call; each row's operations the same either way. The rest went as
// fours, a pair and one, and each call unpacks the codes again: on a Zen 4 (2 threads) a forward's matrices took
// 1.22x / 1.33x / 1.62x one row's time at 5 / 6 / 7 rows (8: 1.46x); in one call 1.06x / 1.20x / 1.30x.
template <typename Kernel>
inline void by_eights(int64_t rows, Kernel kernel) {
  int64_t r = 0;
  for (; r + 8 <= rows; r += 8) kernel(std::integral_constant<int, 8>{}, r);
  switch (rows - r) {
    case 7: return kernel(std::integral_constant<int, 7>{}, r);
    case 6: return kernel(std::integral_constant<int, 6>{}, r);
    case 5: return kernel(std::integral_constant<int, 5>{}, r);
    case 4: return kernel(std::integral_constant<int, 4>{}, r);
    case 3: return kernel(std::integral_constant<int, 3>{}, r);
    case 2: return kernel(std::integral_constant<int, 2>{}, r);
    case 1: return kernel(std::integral_constant<int, 1>{}, r);
  }
}
#endif

// ---- Q6_K in tiles of eight rows -----------------------------------------------------------------------------
//
// The same idea for Q6_K (the 1.5B's output head and half its down projections): per group of 256 values and
// sub-block j of 16, one 32-byte vector per quarter of the sub-block holds 4 values of each of the 8 rows, so
// 4 activation values, broadcast, multiply all 8 rows at once. The bytes are the file's, rearranged (210 per row
// and group): no more to read than row by row. Per weight row i, activation row r and group g:
//   P = sum_j S[i][j] (u . a)_j,  Q = sum_j S[i][j] sum(a)_j        (integers: exact in any order)
//   acc = fma(float(P), D[g] * d[i], acc),  offset = fma(float(Q), D[g] * (-32 d[i]), offset)
// and the result is acc + offset (w = d S (u - 32)), in every path alike.

struct TileQ6K {  // one group of 256 values of 8 rows
  // sub-block j: byte 4i + c of low[j][32p .. 32p + 31] holds the low 4 bits of row i's value 4p + c (low
  // nibble) and of its value 8 + 4p + c (high nibble); byte 4i + c of high[j] the top 2 bits of its values
  // c, 4 + c, 8 + c, 12 + c (bits 0-1, 2-3, 4-5, 6-7)
  uint8_t low[16][64];
  uint8_t high[16][32];
  int8_t scales[8][16];  // [pair of sub-blocks][row][which of the pair]
  uint16_t d[8];         // fp16, per row
};
static_assert(sizeof(TileQ6K) == 8 * 210, "a Q6_K tile group is its 8 rows' 210 bytes");

// Row i's 6-bit code of value v (0..15) of sub-block j.
inline int q6_tile_code(const TileQ6K& t, int j, int i, int v) {
  const int quarter = v / 4, c = v % 4;
  const int low = (t.low[j][32 * (quarter % 2) + 4 * i + c] >> (4 * (quarter / 2))) & 15;
  return low | (((t.high[j][4 * i + c] >> (2 * quarter)) & 3) << 4);
}

// Q6_K blocks [rows, groups * 210] -> units of `per_unit` tiles (`repack_tiles`).
inline at::Tensor tile_q6_k(const at::Tensor& blocks, int64_t cols, int64_t per_unit) {
  return repack_tiles<TileQ6K>(blocks, cols, 210, per_unit, [](TileQ6K& t, int i, const uint8_t* b) {
    alignas(32) uint8_t codes[256];
    six_bits_128(b, b + 128, codes);
    six_bits_128(b + 64, b + 160, codes + 128);
    std::memcpy(&t.d[i], b + 208, 2);
    for (int j = 0; j < 16; ++j) {
      t.scales[j / 2][2 * i + j % 2] = static_cast<int8_t>(b[192 + j]);
      for (int v = 0; v < 16; ++v) {
        const int code = codes[16 * j + v], quarter = v / 4, c = v % 4;
        t.low[j][32 * (quarter % 2) + 4 * i + c] |= static_cast<uint8_t>((code & 15) << (4 * (quarter / 2)));
        t.high[j][4 * i + c] |= static_cast<uint8_t>((code >> 4) << (2 * quarter));
      }
    }
  });
}

// Row i of a Q6_K tile in the integer form (`dequantize_rows`); its groups `stride` groups apart.
inline void unpack_q6_tile_row(const uint8_t* tile, int64_t i, int64_t cols, int64_t stride, Unpacked& u) {
  const int64_t groups = cols / 256;
  u.resize(cols, groups);
  for (int64_t g = 0; g < groups; ++g) {
    const TileQ6K& t = reinterpret_cast<const TileQ6K*>(tile)[g * stride];
    for (int j = 0; j < 16; ++j) {
      for (int v = 0; v < 16; ++v) u.codes[g * 256 + 16 * j + v] = static_cast<uint8_t>(q6_tile_code(t, j, i, v));
      const int s = t.scales[j / 2][2 * i + j % 2];
      set_sub(u, g * 16 + j, s, s);
    }
    const float d = half(reinterpret_cast<const uint8_t*>(&t.d[i]));
    u.a[g] = d;
    u.b[g] = -32.0f * d;
  }
}

// Portable: out[i * x.rows + r] for the tile's rows i and activation rows r in [first, first + n).
inline void q6_tile_dots_portable(const uint8_t* tile, const Quantized& x, int64_t first, int64_t n, int64_t stride,
                                  float* out) {
  const int64_t cols = x.cols, groups = cols / 256;
  const auto* tiles = reinterpret_cast<const TileQ6K*>(tile);
  for (int64_t r = first; r < first + n; ++r) {
    const int8_t* a = x.q.data() + r * cols;
    const int16_t* sums = x.sums.data() + r * cols / 16;
    for (int i = 0; i < 8; ++i) {
      float acc = 0.0f, offset = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        const TileQ6K& t = tiles[g * stride];
        int32_t p = 0, q = 0;
        for (int j = 0; j < 16; ++j) {
          int32_t dot = 0;
          for (int v = 0; v < 16; ++v) dot += q6_tile_code(t, j, i, v) * a[g * 256 + 16 * j + v];
          const int32_t s = t.scales[j / 2][2 * i + j % 2];
          p += s * dot;
          q += s * sums[g * 16 + j];
        }
        const float d = x.scale[r * groups + g], di = half(reinterpret_cast<const uint8_t*>(&t.d[i]));
        acc = std::fma(static_cast<float>(p), d * di, acc);
        offset = std::fma(static_cast<float>(q), d * (-32.0f * di), offset);
      }
      out[i * x.rows + r] = acc + offset;
    }
  }
}

#ifdef GGUF_AVX2
// The four vectors of sub-block j's codes, quarter by quarter: vector k holds values 4k .. 4k + 3 of every row.
inline void q6_tile_codes(const TileQ6K& t, int j, __m256i (&codes)[4]) {
  const __m256i m4 = _mm256_set1_epi8(15), top = _mm256_set1_epi8(0x30);
  const __m256i low0 = load256(t.low[j]), low1 = load256(t.low[j] + 32), high = load256(t.high[j]);
  codes[0] = _mm256_or_si256(_mm256_and_si256(low0, m4), _mm256_and_si256(_mm256_slli_epi16(high, 4), top));
  codes[1] = _mm256_or_si256(_mm256_and_si256(low1, m4), _mm256_and_si256(_mm256_slli_epi16(high, 2), top));
  codes[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(low0, 4), m4), _mm256_and_si256(high, top));
  codes[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(low1, 4), m4),
                             _mm256_and_si256(_mm256_srli_epi16(high, 2), top));
}

// Activation values 4k .. 4k + 3 of a sub-block, broadcast to every lane.
inline __m256i quad(const int8_t* a, int k) {
  int32_t four;
  std::memcpy(&four, a + 4 * k, 4);
  return _mm256_set1_epi32(four);
}

// The end of a Q6_K tile group for one activation row (P and Q summed, row i's in lane i).
inline void close_q6_tile_group(const TileQ6K& t, const Quantized& x, int64_t r, int64_t g, __m256i p, __m256i q,
                                __m256& acc, __m256& offset) {
  const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t.d)));
  const __m256 da = _mm256_broadcast_ss(x.scale.data() + r * (x.cols / 256) + g);
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(da, d), acc);
  offset = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), _mm256_mul_ps(da, _mm256_mul_ps(_mm256_set1_ps(-32.0f), d)), offset);
}

// Q: a pair of sub-blocks' scales (int16 lanes 2i, 2i + 1: row i's) times the row's two sums.
inline __m256i q6_pair_offset(__m256i scales16, const int16_t* sums) {
  int32_t both;
  std::memcpy(&both, sums, 4);
  return _mm256_madd_epi16(scales16, _mm256_set1_epi32(both));
}

// ROWS activation rows share each tile's codes. AVX2 sums two quarters' products in int16 (at most
// 4 * 63 * 127 < 2^15) before the scale's widening multiply-add; VNNI sums a sub-block's four quarters straight
// into int32 lanes, then multiplies by the scale once. The integers P and Q are the same either way.
template <int ROWS, bool VNNI, int HALVES>
void q6_tile_dots(const uint8_t* unit, const Quantized& x, int64_t first, float* out) {
  const int64_t cols = x.cols;
  walk_tile_groups<TileQ6K, ROWS, HALVES>(unit, x, first, out, [&](const TileQ6K& t, int64_t g, __m256 (&acc)[ROWS],
                                                                    __m256 (&offset)[ROWS]) {
    __m256i p[ROWS], q[ROWS];
    for (int r = 0; r < ROWS; ++r) p[r] = q[r] = _mm256_setzero_si256();
#pragma GCC unroll 1
    for (int pair = 0; pair < 8; ++pair) {
      const __m256i both = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t.scales[pair])));
      // row i's scale of the pair's first (second) sub-block: VNNI in int32 lane i, AVX2 in int16 lanes 2i, 2i + 1
      const __m256i scales[2] = {
          VNNI ? _mm256_srai_epi32(_mm256_slli_epi32(both, 16), 16) : _mm256_blend_epi16(both, _mm256_slli_epi32(both, 16), 0xAA),
          VNNI ? _mm256_srai_epi32(both, 16) : _mm256_blend_epi16(_mm256_srli_epi32(both, 16), both, 0xAA)};
      for (int h = 0; h < 2; ++h) {
        __m256i codes[4];
        q6_tile_codes(t, 2 * pair + h, codes);
        for (int r = 0; r < ROWS; ++r) {
          const int8_t* a = x.q.data() + (first + r) * cols + g * 256 + 16 * (2 * pair + h);
          const __m256i front = products<VNNI>(products<VNNI>(_mm256_setzero_si256(), codes[0], quad(a, 0)), codes[1], quad(a, 1));
          if constexpr (VNNI) {
            const __m256i sum = products<VNNI>(products<VNNI>(front, codes[2], quad(a, 2)), codes[3], quad(a, 3));
            p[r] = _mm256_add_epi32(p[r], scaled<VNNI>(sum, scales[h]));
          } else {  // two quarters at a time in int16, each pair widened by the scale's multiply-add
            const __m256i back = products<VNNI>(products<VNNI>(_mm256_setzero_si256(), codes[2], quad(a, 2)), codes[3], quad(a, 3));
            p[r] = _mm256_add_epi32(p[r], _mm256_add_epi32(scaled<VNNI>(front, scales[h]), scaled<VNNI>(back, scales[h])));
          }
        }
      }
      for (int r = 0; r < ROWS; ++r)
        q[r] = _mm256_add_epi32(q[r], q6_pair_offset(both, x.sums.data() + (first + r) * cols / 16 + g * 16 + 2 * pair));
    }
    for (int r = 0; r < ROWS; ++r) close_q6_tile_group(t, x, first + r, g, p[r], q[r], acc[r], offset[r]);
  });
}
#endif

#ifdef GGUF_VNNI
// `quad` in 512 bits. Each quad its own 4-byte load: one 16-byte copy of all four went through general registers
// (a 64-bit load, a shift, a broadcast from a register), and left the Q6_K pair kernel 13% slower.
inline __m512i quad512(const int8_t* a, int k) {
  int32_t four;
  std::memcpy(&four, a + 4 * k, 4);
  return _mm512_set1_epi32(four);
}

// A pair of Q6_K tiles side by side in 512-bit vectors (lanes 0-7 the first tile's rows, 8-15 the second's), as
// `tile_pair_dots_vnni` does for Q4_K: every lane's integer and float steps those of `q6_tile_dots<ROWS, true>`.
template <int ROWS>
void q6_tile_pair_dots_vnni(const uint8_t* pair, const Quantized& x, int64_t first, float* out) {
  const int64_t cols = x.cols, groups = cols / 256;
  const auto* tiles = reinterpret_cast<const TileQ6K*>(pair);
  const __m512i m4 = _mm512_set1_epi8(15), top = _mm512_set1_epi8(0x30);
  __m512 acc[ROWS], offset[ROWS];
  for (int r = 0; r < ROWS; ++r) acc[r] = offset[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const TileQ6K &ta = tiles[2 * g], &tb = tiles[2 * g + 1];
    prefetch(tiles + 2 * (g + kPrefetchGroups / 2), 2 * sizeof(TileQ6K));
    __m512i p[ROWS], q[ROWS];
    for (int r = 0; r < ROWS; ++r) p[r] = q[r] = _mm512_setzero_si512();
#pragma GCC unroll 1
    for (int pair = 0; pair < 8; ++pair) {
      const __m512i scales16 = _mm512_cvtepi8_epi16(
          _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ta.scales[pair]))),
                                  _mm_loadu_si128(reinterpret_cast<const __m128i*>(tb.scales[pair])), 1));
      const __m512i scales[2] = {_mm512_srai_epi32(_mm512_slli_epi32(scales16, 16), 16), _mm512_srai_epi32(scales16, 16)};
      for (int h = 0; h < 2; ++h) {
        const int j = 2 * pair + h;
        const __m512i low0 = pair_bytes(ta.low[j], tb.low[j]), low1 = pair_bytes(ta.low[j] + 32, tb.low[j] + 32);
        const __m512i high = pair_bytes(ta.high[j], tb.high[j]);
        const __m512i codes[4] = {
            _mm512_or_si512(_mm512_and_si512(low0, m4), _mm512_and_si512(_mm512_slli_epi16(high, 4), top)),
            _mm512_or_si512(_mm512_and_si512(low1, m4), _mm512_and_si512(_mm512_slli_epi16(high, 2), top)),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(low0, 4), m4), _mm512_and_si512(high, top)),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(low1, 4), m4),
                            _mm512_and_si512(_mm512_srli_epi16(high, 2), top))};
        for (int r = 0; r < ROWS; ++r) {
          const int8_t* a = x.q.data() + (first + r) * cols + g * 256 + 16 * j;
          __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes[0], quad512(a, 0));
          dot = _mm512_dpbusd_epi32(dot, codes[1], quad512(a, 1));
          dot = _mm512_dpbusd_epi32(dot, codes[2], quad512(a, 2));
          dot = _mm512_dpbusd_epi32(dot, codes[3], quad512(a, 3));
          p[r] = _mm512_add_epi32(p[r], _mm512_mullo_epi32(dot, scales[h]));
        }
      }
      for (int r = 0; r < ROWS; ++r) {
        int32_t two;
        std::memcpy(&two, x.sums.data() + (first + r) * cols / 16 + g * 16 + 2 * pair, 4);
        q[r] = _mm512_add_epi32(q[r], _mm512_madd_epi16(scales16, _mm512_set1_epi32(two)));
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ta.d))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(tb.d)), 1));
    const __m512 neg32d = _mm512_mul_ps(_mm512_set1_ps(-32.0f), d);
    for (int r = 0; r < ROWS; ++r) {
      const __m512 da = _mm512_set1_ps(x.scale[(first + r) * groups + g]);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p[r]), _mm512_mul_ps(da, d), acc[r]);
      offset[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q[r]), _mm512_mul_ps(da, neg32d), offset[r]);
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, _mm512_add_ps(acc[r], offset[r]));
    for (int i = 0; i < 16; ++i) out[i * x.rows + first + r] = lanes[i];
  }
}
#endif

// ---- Q8_0 in tiles of eight rows ---------------------------------------------------------------------------
//
// At load a Q8_0 matrix whose rows come in eights is repacked (`tile_q8_0`) as Q4_K is: per group of 32 values,
// its eight rows' codes interleaved four values at a time, so that one 32-byte vector holds 4 values of each of
// the 8 rows and 4 values of an activation row, broadcast, multiply all 8 rows at once; each weight row's sum
// ends in a lane of its own. Per weight row i, activation row r and group g:
//   P = sum_v c[i][v] a[v]   (an integer: exact in any order),   acc = fma(float(P), D[g] * d[i], acc)
// and the result is acc, in every path alike. The codes are stored plus 128 (unsigned bytes): AVX-512 VNNI
// multiplies them straight into int32 lanes and takes 128 sum(a) back once a group; AVX2 turns them back into
// int8 and multiplies |c| by a with c's sign, as the row-at-a-time kernel does (unsigned, a pair of products
// could pass int16's range).
struct TileQ8_0 {  // one group of 32 values of 8 rows
  uint8_t codes[8][32];  // codes[k][4i + b]: row i's value 4k + b, plus 128
  uint16_t d[8];         // fp16, per row
};
static_assert(sizeof(TileQ8_0) == 8 * 34, "a Q8_0 tile group is its 8 rows' 34 bytes");

// Q8_0 blocks [rows, groups * 34] -> units of `per_unit` tiles (`repack_tiles`).
inline at::Tensor tile_q8_0(const at::Tensor& blocks, int64_t cols, int64_t per_unit) {
  return repack_tiles<TileQ8_0, 32>(blocks, cols, 34, per_unit, [](TileQ8_0& t, int i, const uint8_t* b) {
    std::memcpy(&t.d[i], b, 2);
    for (int v = 0; v < 32; ++v) t.codes[v / 4][4 * i + v % 4] = static_cast<uint8_t>(b[2 + v] ^ 0x80);
  });
}

// Row i of a Q8_0 tile in the integer form (`dequantize_rows`); its groups `stride` groups apart.
inline void unpack_q8_tile_row(const uint8_t* tile, int64_t i, int64_t cols, int64_t stride, Unpacked& u) {
  const int64_t groups = cols / 32;
  u.resize(cols, groups);
  for (int64_t g = 0; g < groups; ++g) {
    const TileQ8_0& t = reinterpret_cast<const TileQ8_0*>(tile)[g * stride];
    for (int v = 0; v < 32; ++v) u.codes[g * 32 + v] = static_cast<uint8_t>(t.codes[v / 4][4 * i + v % 4] ^ 0x80);
    u.a[g] = half(reinterpret_cast<const uint8_t*>(&t.d[i]));
    u.b[g] = 0.0f;
    set_sub(u, 2 * g, 1, 0);
    set_sub(u, 2 * g + 1, 1, 0);
  }
}

// Portable: out[i * x.rows + r] for the tile's rows i and activation rows r in [first, first + n); the tile's
// groups `stride` groups apart.
inline void q8_tile_dots_portable(const uint8_t* tile, const Quantized& x, int64_t first, int64_t n, int64_t stride,
                                  float* out) {
  const int64_t cols = x.cols, groups = cols / 32;
  const auto* tiles = reinterpret_cast<const TileQ8_0*>(tile);
  for (int64_t r = first; r < first + n; ++r) {
    const int8_t* a = x.q.data() + r * cols;
    for (int i = 0; i < 8; ++i) {
      float acc = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        const TileQ8_0& t = tiles[g * stride];
        int32_t p = 0;
        for (int v = 0; v < 32; ++v) p += (t.codes[v / 4][4 * i + v % 4] - 128) * a[g * 32 + v];
        acc = std::fma(static_cast<float>(p), x.scale[r * groups + g] * half(reinterpret_cast<const uint8_t*>(&t.d[i])), acc);
      }
      out[i * x.rows + r] = acc;
    }
  }
}

#ifdef GGUF_AVX2
// ROWS activation rows share each load of a unit's HALVES tiles (2 in a pair), group by group as they lie in memory,
// prefetched about as far ahead as the K-quant tiles are. out[i * x.rows + r] for tile h's rows 8h + i.
template <int ROWS, bool VNNI, int HALVES>
void q8_tile_dots(const uint8_t* unit, const Quantized& x, int64_t first, float* out) {
  constexpr int64_t ahead = kPrefetchGroups * sizeof(TileQ4K) / sizeof(TileQ8_0);
  const int64_t cols = x.cols, groups = cols / 32;
  const auto* tiles = reinterpret_cast<const TileQ8_0*>(unit);
  const __m256i ones = _mm256_set1_epi16(1), bias = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256 acc[HALVES][ROWS];
  for (int h = 0; h < HALVES; ++h)
    for (int r = 0; r < ROWS; ++r) acc[h][r] = _mm256_setzero_ps();
  for (int64_t index = 0; index < groups * HALVES; ++index) {
    prefetch(tiles + index + ahead, sizeof(TileQ8_0));
    const TileQ8_0& t = tiles[index];
    const int h = HALVES == 1 ? 0 : index % HALVES;
    const int64_t g = index / HALVES;
    __m256i p[ROWS];
    for (int r = 0; r < ROWS; ++r) p[r] = _mm256_setzero_si256();
    for (int k = 0; k < 8; ++k) {
      const __m256i codes = load256(t.codes[k]);
      const __m256i c = _mm256_xor_si256(codes, bias), magnitude = _mm256_sign_epi8(c, c);  // AVX2: int8 again
      for (int r = 0; r < ROWS; ++r) {
        int32_t four;  // activation values 4k .. 4k + 3 of the group
        std::memcpy(&four, x.q.data() + (first + r) * cols + g * 32 + 4 * k, 4);
        const __m256i a = _mm256_set1_epi32(four);
#ifdef GGUF_VNNI
        if constexpr (VNNI) {
          p[r] = _mm256_dpbusd_epi32(p[r], codes, a);
          continue;
        }
#endif
        p[r] = _mm256_add_epi32(p[r], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(a, c)), ones));
      }
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t.d)));
    for (int r = 0; r < ROWS; ++r) {
      if (VNNI) {  // take back the codes' bias: 128 times the sum of the group's activation values, in every lane
        const __m256i taken = _mm256_set1_epi32(128 * x.sums32[(first + r) * groups + g]);
        p[r] = _mm256_sub_epi32(p[r], taken);
      }
      const __m256 da = _mm256_broadcast_ss(x.scale.data() + (first + r) * groups + g);
      acc[h][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p[r]), _mm256_mul_ps(da, d), acc[h][r]);
    }
  }
  for (int h = 0; h < HALVES; ++h)
    for (int r = 0; r < ROWS; ++r) {
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, acc[h][r]);
      for (int i = 0; i < 8; ++i) out[(8 * h + i) * x.rows + first + r] = lanes[i];
    }
}
#endif

// ---- Q4_0, Q4_1, Q5_0 and Q5_1 in tiles of eight rows --------------------------------------------------------
//
// At load these legacy matrices are repacked as a Q4_K sub-block is (`tile_legacy`), in the file's bytes: per group
// of 32 values, byte 4i + c of vector p holds row i's codes of values 8p + c (low nibble) and 8p + 4 + c (high),
// so that one 32-byte vector, its nibbles apart, times four activation values broadcast multiplies all 8 rows;
// Q5_0 / Q5_1's fifth bits lie beside them as Q5_K's do. Per weight row i, activation row r and group g, with u
// the unsigned code and S the group's sum of activation values:
//   P = sum_v u[i][v] a[v] - bias S   (bias 8 for Q4_0, 16 for Q5_0, 0 with a min: an integer),
//   acc = fma(float(P), D[g] * d[i], acc),   then with Q4_1 / Q5_1's min   acc = fma(float(S), D[g] * m[i], acc)
// and the result is acc, in every path alike (one accumulator a row: a second left 8 rows of Q5_1 short of
// registers).
struct TileQ4_0 {  // one group of 32 values of 8 rows, as the blocks' 8 * 18 bytes
  uint8_t codes[4][32];
  uint16_t d[8];
};
struct TileQ4_1 {
  uint8_t codes[4][32];
  uint16_t d[8], m[8];
};
struct TileQ5_0 {
  uint8_t codes[4][32];
  uint32_t fifth[4][2];  // bit 4i + c of fifth[p][h]: row i's fifth bit of value 8p + 4h + c
  uint16_t d[8];
};
struct TileQ5_1 {
  uint8_t codes[4][32];
  uint32_t fifth[4][2];
  uint16_t d[8], m[8];
};
static_assert(sizeof(TileQ4_0) == 8 * 18 && sizeof(TileQ4_1) == 8 * 20, "a legacy tile group is its rows' bytes");
static_assert(sizeof(TileQ5_0) == 8 * 22 && sizeof(TileQ5_1) == 8 * 24, "a legacy tile group is its rows' bytes");

// What a legacy tile's codes mean: its block type, whether it has fifth bits and a min, the codes' bias.
template <typename Tile> struct Legacy;
template <> struct Legacy<TileQ4_0> { static constexpr int64_t type = Q4_0, bias = 8; static constexpr bool five = false, min = false; };
template <> struct Legacy<TileQ4_1> { static constexpr int64_t type = Q4_1, bias = 0; static constexpr bool five = false, min = true; };
template <> struct Legacy<TileQ5_0> { static constexpr int64_t type = Q5_0, bias = 16; static constexpr bool five = true, min = false; };
template <> struct Legacy<TileQ5_1> { static constexpr int64_t type = Q5_1, bias = 0; static constexpr bool five = true, min = true; };

// Row i's unsigned code of value v of a legacy tile group.
template <typename Tile>
inline int legacy_code(const Tile& t, int i, int v) {
  const int p = v / 8, h = v % 8 / 4, c = v % 4;
  int code = (t.codes[p][4 * i + c] >> (4 * h)) & 15;
  if constexpr (Legacy<Tile>::five) code |= ((t.fifth[p][h] >> (4 * i + c)) & 1) << 4;
  return code;
}

// Legacy blocks [rows, groups * bytes] -> units of `per_unit` tiles (`repack_tiles`). A block is d (fp16), then m
// (fp16) with a min, the 32 fifth bits (bit v for value v) with five bits, and 16 bytes of nibbles (values 0-15
// low, 16-31 high).
template <typename Tile>
inline at::Tensor tile_legacy(const at::Tensor& blocks, int64_t cols, int64_t per_unit) {
  using L = Legacy<Tile>;
  return repack_tiles<Tile, 32>(blocks, cols, layout(L::type).bytes, per_unit, [](Tile& t, int i, const uint8_t* b) {
    std::memcpy(&t.d[i], b, 2);
    const uint8_t* rest = b + 2;
    if constexpr (L::min) std::memcpy(&t.m[i], b + 2, 2), rest += 2;
    uint32_t bits = 0;
    if constexpr (L::five) std::memcpy(&bits, rest, 4), rest += 4;
    for (int v = 0; v < 32; ++v) {
      const int code = v < 16 ? rest[v] & 15 : rest[v - 16] >> 4, p = v / 8, h = v % 8 / 4, c = v % 4;
      t.codes[p][4 * i + c] |= static_cast<uint8_t>(code << (4 * h));
      if constexpr (L::five) t.fifth[p][h] |= ((bits >> v) & 1) << (4 * i + c);
    }
  });
}

// Row i of a legacy tile in the integer form (`dequantize_rows`), as `unpack_row` has its blocks; its groups
// `stride` groups apart.
template <typename Tile>
inline void unpack_legacy_tile_row(const uint8_t* tile, int64_t i, int64_t cols, int64_t stride, Unpacked& u) {
  using L = Legacy<Tile>;
  const int64_t groups = cols / 32;
  u.resize(cols, groups);
  for (int64_t g = 0; g < groups; ++g) {
    const Tile& t = reinterpret_cast<const Tile*>(tile)[g * stride];
    for (int v = 0; v < 32; ++v) u.codes[g * 32 + v] = static_cast<uint8_t>(legacy_code(t, i, v) - L::bias);
    u.a[g] = half(reinterpret_cast<const uint8_t*>(&t.d[i]));
    u.b[g] = 0.0f;
    if constexpr (L::min) u.b[g] = half(reinterpret_cast<const uint8_t*>(&t.m[i]));
    set_sub(u, 2 * g, 1, L::min);
    set_sub(u, 2 * g + 1, 1, L::min);
  }
}

// Portable: out[i * x.rows + r] for the tile's rows i and activation rows r in [first, first + n); the tile's
// groups `stride` groups apart.
template <typename Tile>
inline void legacy_tile_dots_portable(const uint8_t* tile, const Quantized& x, int64_t first, int64_t n,
                                      int64_t stride, float* out) {
  using L = Legacy<Tile>;
  const int64_t cols = x.cols, groups = cols / 32;
  const auto* tiles = reinterpret_cast<const Tile*>(tile);
  for (int64_t r = first; r < first + n; ++r) {
    const int8_t* a = x.q.data() + r * cols;
    for (int i = 0; i < 8; ++i) {
      float acc = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        const Tile& t = tiles[g * stride];
        const int32_t s = x.sums32[r * groups + g];
        int32_t p = -L::bias * s;
        for (int v = 0; v < 32; ++v) p += legacy_code(t, i, v) * a[g * 32 + v];
        const float d = x.scale[r * groups + g];
        acc = std::fma(static_cast<float>(p), d * half(reinterpret_cast<const uint8_t*>(&t.d[i])), acc);
        if constexpr (L::min)
          acc = std::fma(static_cast<float>(s), d * half(reinterpret_cast<const uint8_t*>(&t.m[i])), acc);
      }
      out[i * x.rows + r] = acc;
    }
  }
}

#ifdef GGUF_AVX2
// ROWS activation rows share each load of a unit's HALVES tiles (2 in a pair), group by group as they lie in
// memory, as `q8_tile_dots` reads Q8_0's. AVX2 sums a vector's two products in int16 (|sum| <= 2 * 2 * 31 * 128
// < 2^15), VNNI in int32 lanes. out[i * x.rows + r] for tile h's rows 8h + i.
template <typename Tile, int ROWS, bool VNNI, int HALVES>
void legacy_tile_dots(const uint8_t* unit, const Quantized& x, int64_t first, float* out) {
  using L = Legacy<Tile>;
  constexpr int64_t ahead = kPrefetchGroups * sizeof(TileQ4K) / sizeof(Tile);
  const int64_t cols = x.cols, groups = cols / 32;
  const auto* tiles = reinterpret_cast<const Tile*>(unit);
  const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
  __m256 acc[HALVES][ROWS];
  for (int h = 0; h < HALVES; ++h)
    for (int r = 0; r < ROWS; ++r) acc[h][r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    for (int h = 0; h < HALVES; ++h) {  // unrolled: each tile's accumulators stay in registers
      prefetch(tiles + HALVES * g + h + ahead, sizeof(Tile));
      const Tile& t = tiles[HALVES * g + h];
      __m256i p[ROWS], high_p[ROWS];
      for (int r = 0; r < ROWS; ++r) p[r] = high_p[r] = _mm256_setzero_si256();
      for (int v = 0; v < 4; ++v) {
        const __m256i codes = load256(t.codes[v]);
        __m256i low = _mm256_and_si256(codes, m4), high = _mm256_and_si256(_mm256_srli_epi16(codes, 4), m4);
        if constexpr (L::five) {
#ifdef GGUF_VNNI
          if constexpr (VNNI) {
            low = _mm256_mask_add_epi8(low, _cvtu32_mask32(t.fifth[v][0]), low, _mm256_set1_epi8(16));
            high = _mm256_mask_add_epi8(high, _cvtu32_mask32(t.fifth[v][1]), high, _mm256_set1_epi8(16));
          }
#endif
          if constexpr (!VNNI) {
            low = _mm256_or_si256(low, fifth_bits_vector(t.fifth[v][0]));
            high = _mm256_or_si256(high, fifth_bits_vector(t.fifth[v][1]));
          }
        }
        for (int r = 0; r < ROWS; ++r) {
          int32_t front, back;  // activation values 8v .. 8v + 3 and 8v + 4 .. 8v + 7 of the group
          std::memcpy(&front, x.q.data() + (first + r) * cols + g * 32 + 8 * v, 4);
          std::memcpy(&back, x.q.data() + (first + r) * cols + g * 32 + 8 * v + 4, 4);
#ifdef GGUF_VNNI
          if constexpr (VNNI) {  // two chains a row: one of 8 dependent products left 4 rows latency-bound
            p[r] = _mm256_dpbusd_epi32(p[r], low, _mm256_set1_epi32(front));
            high_p[r] = _mm256_dpbusd_epi32(high_p[r], high, _mm256_set1_epi32(back));
            continue;
          }
#endif
          const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(low, _mm256_set1_epi32(front)),
                                                 _mm256_maddubs_epi16(high, _mm256_set1_epi32(back)));
          p[r] = _mm256_add_epi32(p[r], _mm256_madd_epi16(pairs, ones));
        }
      }
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t.d)));
      for (int r = 0; r < ROWS; ++r) {
        const int32_t s = x.sums32[(first + r) * groups + g];
        if constexpr (VNNI) p[r] = _mm256_add_epi32(p[r], high_p[r]);
        if constexpr (L::bias != 0) p[r] = _mm256_sub_epi32(p[r], _mm256_set1_epi32(L::bias * s));
        const __m256 da = _mm256_broadcast_ss(x.scale.data() + (first + r) * groups + g);
        acc[h][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p[r]), _mm256_mul_ps(da, d), acc[h][r]);
        if constexpr (L::min) {
          const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t.m)));
          acc[h][r] = _mm256_fmadd_ps(_mm256_set1_ps(static_cast<float>(s)), _mm256_mul_ps(da, m), acc[h][r]);
        }
      }
    }
  }
  for (int h = 0; h < HALVES; ++h)
    for (int r = 0; r < ROWS; ++r) {
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, acc[h][r]);
      for (int i = 0; i < 8; ++i) out[(8 * h + i) * x.rows + first + r] = lanes[i];
    }
}
#endif

#ifdef GGUF_VNNI
// A pair's two legacy tiles side by side in 512-bit vectors (lanes 0-7 the first tile's rows, 8-15 the second's),
// as `tile_pair_dots_vnni` reads Q4_K: every lane's integer and float steps those of `legacy_tile_dots`. Through
// 256 bits a tile at a time, a forward's Q4_0 matrices of the 1.5B took 1.5x one row's time at 4 rows.
template <typename Tile, int ROWS>
void legacy_pair_dots_vnni(const uint8_t* pair, const Quantized& x, int64_t first, float* out) {
  using L = Legacy<Tile>;
  constexpr int64_t ahead = kPrefetchGroups * sizeof(TileQ4K) / sizeof(Tile);
  const int64_t cols = x.cols, groups = cols / 32;
  const auto* tiles = reinterpret_cast<const Tile*>(pair);
  const __m512i m4 = _mm512_set1_epi8(15), sixteen = _mm512_set1_epi8(16);
  __m512 acc[ROWS];
  for (int r = 0; r < ROWS; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const Tile &ta = tiles[2 * g], &tb = tiles[2 * g + 1];
    prefetch(tiles + 2 * g + ahead, 2 * sizeof(Tile));
    __m512i p[ROWS], high_p[ROWS];  // two chains a row, as in `legacy_tile_dots`
    for (int r = 0; r < ROWS; ++r) p[r] = high_p[r] = _mm512_setzero_si512();
    for (int v = 0; v < 4; ++v) {
      const __m512i codes = pair_bytes(ta.codes[v], tb.codes[v]);
      __m512i low = _mm512_and_si512(codes, m4), high = _mm512_and_si512(_mm512_srli_epi16(codes, 4), m4);
      if constexpr (L::five) {
        const auto bits = [&](int h) { return _cvtu64_mask64(ta.fifth[v][h] | uint64_t{tb.fifth[v][h]} << 32); };
        low = _mm512_mask_add_epi8(low, bits(0), low, sixteen);
        high = _mm512_mask_add_epi8(high, bits(1), high, sixteen);
      }
      for (int r = 0; r < ROWS; ++r) {
        int32_t front, back;
        std::memcpy(&front, x.q.data() + (first + r) * cols + g * 32 + 8 * v, 4);
        std::memcpy(&back, x.q.data() + (first + r) * cols + g * 32 + 8 * v + 4, 4);
        p[r] = _mm512_dpbusd_epi32(p[r], low, _mm512_set1_epi32(front));
        high_p[r] = _mm512_dpbusd_epi32(high_p[r], high, _mm512_set1_epi32(back));
      }
    }
    const __m512 d = pair_halves(ta.d, tb.d);
    for (int r = 0; r < ROWS; ++r) {
      const int32_t s = x.sums32[(first + r) * groups + g];
      __m512i sum = _mm512_add_epi32(p[r], high_p[r]);
      if constexpr (L::bias != 0) sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(L::bias * s));
      const __m512 da = _mm512_set1_ps(x.scale[(first + r) * groups + g]);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(da, d), acc[r]);
      if constexpr (L::min)
        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(static_cast<float>(s)), _mm512_mul_ps(da, pair_halves(ta.m, tb.m)), acc[r]);
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, acc[r]);
    for (int i = 0; i < 16; ++i) out[i * x.rows + first + r] = lanes[i];
  }
}
#endif

// ---- units of tiles ------------------------------------------------------------------------------------------

// The tiled form of a block-quantized matrix [rows, bytes] and its type: pairs where AVX-512 VNNI reads a pair's 16
// rows at once and the rows come in sixteens, else 8-row tiles where they come in eights; any other matrix as
// it is. `per_unit` 1 or 2 asks for tiles or pairs (the tests hold every path to both).
//
// Measured on the 1.5B (2 threads, a forward's matrices, against 8-row tiles in one process): 4 activation rows
// 24.1-24.6 ms -> 17.5-18.0 ms, 8 rows 33 -> 31 ms, 1 and 2 rows the same. Read as two streams (two 8-row tiles
// apart in memory, as before) pairs had lost to a tile at a time below 8 rows.
inline std::tuple<at::Tensor, int64_t> tile(const at::Tensor& blocks, int64_t type, int64_t cols, int64_t per_unit) {
  if (per_unit == 0) {
#ifdef GGUF_VNNI
    per_unit = blocks.size(0) % (2 * kTileRows) == 0 ? 2 : 1;
#else
    per_unit = 1;
#endif
  }
  TORCH_CHECK(per_unit == 1 || per_unit == 2, "a unit holds 1 or 2 tiles");
  if (!is_tileable(type) || blocks.size(0) % (per_unit * kTileRows) != 0) return {blocks, type};
  const int64_t tiled = 100 * per_unit + type;
  switch (type) {
    case Q4_0: return {tile_legacy<TileQ4_0>(blocks, cols, per_unit), tiled};
    case Q4_1: return {tile_legacy<TileQ4_1>(blocks, cols, per_unit), tiled};
    case Q5_0: return {tile_legacy<TileQ5_0>(blocks, cols, per_unit), tiled};
    case Q5_1: return {tile_legacy<TileQ5_1>(blocks, cols, per_unit), tiled};
    case Q8_0: return {tile_q8_0(blocks, cols, per_unit), tiled};
    case Q4_K: return {tile_q4_k(blocks, cols, per_unit), tiled};
    case Q5_K: return {tile_q5_k(blocks, cols, per_unit), tiled};
    default: return {tile_q6_k(blocks, cols, per_unit), tiled};
  }
}

#ifdef GGUF_AVX2
// A kernel templated on a unit's tiles (1, or 2 in a pair), called with the unit's count.
template <typename Kernel>
inline void by_halves(int64_t per_unit, Kernel kernel) {
  if (per_unit == 2) return kernel(std::integral_constant<int, 2>{});
  kernel(std::integral_constant<int, 1>{});
}
#endif

#ifdef GGUF_AVX2
// The kernel of the tiles read in 256-bit vectors on every path (Q8_0, Q5_K and the legacy types); on VNNI their
// pairs, but Q8_0's, may take 512 instead (`unit_dots_256`).
template <typename Tile, int ROWS, bool VNNI, int HALVES>
inline void tile_dots_256(const uint8_t* unit, const Quantized& x, int64_t first, float* out) {
  if constexpr (std::is_same_v<Tile, TileQ8_0>) q8_tile_dots<ROWS, VNNI, HALVES>(unit, x, first, out);
  else if constexpr (std::is_same_v<Tile, TileQ5K>) tile_dots<ROWS, VNNI, HALVES, TileQ5K>(unit, x, first, out);
  else legacy_tile_dots<Tile, ROWS, VNNI, HALVES>(unit, x, first, out);
}
#endif

// `unit_dots` for a unit of such tiles: a pair's two tiles group by group.
template <typename Tile>
inline void unit_dots_256(const uint8_t* unit, const Quantized& x, Path path, int64_t per_unit, float* out) {
#ifdef GGUF_VNNI
  // VNNI reads pairs of Q5_K and legacy tiles through 512 bits; Q5_K from 3 rows (at one row 8-20% slower)
  if constexpr (std::is_same_v<Tile, TileQ5K>) {
    if (path == Path::Best && per_unit == 2 && x.rows >= 3)
      return by_eights(x.rows, [&](auto rows, int64_t r) { tile_pair_dots_vnni<rows(), TileQ5K>(unit, x, r, out); });
  } else if constexpr (!std::is_same_v<Tile, TileQ8_0>) {
    if (path == Path::Best && per_unit == 2)
      return by_eights(x.rows, [&](auto rows, int64_t r) { legacy_pair_dots_vnni<Tile, rows()>(unit, x, r, out); });
  }
  if (path == Path::Best)
    return by_halves(per_unit, [&](auto halves) {
      by_eights(x.rows, [&](auto rows, int64_t r) { tile_dots_256<Tile, rows(), true, halves()>(unit, x, r, out); });
    });
#endif
#ifdef GGUF_AVX2
  if (path != Path::Portable)
    return by_halves(per_unit, [&](auto halves) {
      by_fours(x.rows, [&](auto rows, int64_t r) { tile_dots_256<Tile, rows(), false, halves()>(unit, x, r, out); });
    });
#endif
  (void)path;
  for (int64_t h = 0; h < per_unit; ++h) {
    const uint8_t* tile = unit + h * sizeof(Tile);
    float* part = out + h * kTileRows * x.rows;
    if constexpr (std::is_same_v<Tile, TileQ8_0>) q8_tile_dots_portable(tile, x, 0, x.rows, per_unit, part);
    else if constexpr (std::is_same_v<Tile, TileQ5K>) tile_dots_portable<TileQ5K>(tile, x, 0, x.rows, per_unit, part);
    else legacy_tile_dots_portable<Tile>(tile, x, 0, x.rows, per_unit, part);
  }
}

// out[i * x.rows + r]: a unit's weight rows i (8, or 16 in a pair) dotted with every activation row r. On VNNI a
// pair's two tiles go side by side through 512-bit vectors (`tile_pair_dots_vnni`), at any row count: measured on
// the 1.5B (2 threads, a forward's matrices, 7 rounds), one row 21.6-22.2 ms against 22.9-24.3 group by group
// through 256 bits, two rows the same, from three rows 3-5 ms less.
inline void unit_dots(int64_t type, const uint8_t* unit, const Quantized& x, Path path, float* out) {
  const bool q4 = is_q4_k_tiles(type);
  const int64_t per_unit = tiles_per_unit(type);
  switch (tiled_block_type(type)) {
    case Q4_0: return unit_dots_256<TileQ4_0>(unit, x, path, per_unit, out);
    case Q4_1: return unit_dots_256<TileQ4_1>(unit, x, path, per_unit, out);
    case Q5_0: return unit_dots_256<TileQ5_0>(unit, x, path, per_unit, out);
    case Q5_1: return unit_dots_256<TileQ5_1>(unit, x, path, per_unit, out);
    case Q8_0: return unit_dots_256<TileQ8_0>(unit, x, path, per_unit, out);
    case Q5_K: return unit_dots_256<TileQ5K>(unit, x, path, per_unit, out);
  }
#ifdef GGUF_VNNI
  if (per_unit == 2 && path == Path::Best) {
    if (q4) return by_eights(x.rows, [&](auto rows, int64_t r) { tile_pair_dots_vnni<rows()>(unit, x, r, out); });
    return by_eights(x.rows, [&](auto rows, int64_t r) { q6_tile_pair_dots_vnni<rows()>(unit, x, r, out); });
  }
  if (path == Path::Best)
    return by_eights(x.rows, [&](auto rows, int64_t r) {
      q4 ? tile_dots<rows(), true, 1>(unit, x, r, out) : q6_tile_dots<rows(), true, 1>(unit, x, r, out);
    });
#endif
#ifdef GGUF_AVX2
  if (path != Path::Portable)
    return by_halves(per_unit, [&](auto halves) {
      by_fours(x.rows, [&](auto rows, int64_t r) {
        q4 ? tile_dots<rows(), false, halves()>(unit, x, r, out) : q6_tile_dots<rows(), false, halves()>(unit, x, r, out);
      });
    });
#endif
  (void)path;
  const int64_t tile_bytes = q4 ? sizeof(TileQ4K) : sizeof(TileQ6K);
  for (int64_t h = 0; h < per_unit; ++h) {
    float* part = out + h * kTileRows * x.rows;
    if (q4) tile_dots_portable<TileQ4K>(unit + h * tile_bytes, x, 0, x.rows, per_unit, part);
    else q6_tile_dots_portable(unit + h * tile_bytes, x, 0, x.rows, per_unit, part);
  }
}

// Whether a weight row of `type` goes through `unpack_row` first (else a kernel reads its blocks directly).
inline bool needs_unpacking(int64_t type, Path path) {
#ifdef GGUF_AVX2
  return path == Path::Portable || (type != Q4_K && type != Q5_K && type != Q6_K && layout(type).values != 32);
#else
  (void)type, (void)path;
  return true;
#endif
}

// out[r] = a weight row dotted with activation rows r in [0, rows): `u` holds it unpacked when
// `needs_unpacking`, else `row` is read directly.
inline void dots(const uint8_t* row, const Unpacked& u, const Quantized& x, int64_t type, Path path, float* out) {
  const Layout l = layout(type);
#ifdef GGUF_AVX2
  if (path != Path::Portable) {
    if (type == Q4_K) return by_fours(x.rows, [&](auto rows, int64_t r) { dots_q4_k<false, rows()>(row, x, r, out); });
    if (type == Q5_K) return by_fours(x.rows, [&](auto rows, int64_t r) { dots_q4_k<true, rows()>(row, x, r, out); });
    if (type == Q6_K) return by_fours(x.rows, [&](auto rows, int64_t r) { dots_q6_k<rows()>(row, x, r, out); });
    if (type == Q4_0) return by_fours(x.rows, [&](auto rows, int64_t r) { dots_32<Q4_0, rows()>(row, x, r, out); });
    if (type == Q4_1) return by_fours(x.rows, [&](auto rows, int64_t r) { dots_32<Q4_1, rows()>(row, x, r, out); });
    if (type == Q5_0) return by_fours(x.rows, [&](auto rows, int64_t r) { dots_32<Q5_0, rows()>(row, x, r, out); });
    if (type == Q5_1) return by_fours(x.rows, [&](auto rows, int64_t r) { dots_32<Q5_1, rows()>(row, x, r, out); });
    if (type == Q8_0) return by_fours(x.rows, [&](auto rows, int64_t r) { dots_32<Q8_0, rows()>(row, x, r, out); });
    if (l.is_signed) return by_fours(x.rows, [&](auto rows, int64_t r) { dots_avx2<true, rows()>(u, x, r, l.values, out); });
    return by_fours(x.rows, [&](auto rows, int64_t r) { dots_avx2<false, rows()>(u, x, r, l.values, out); });
  }
#endif
  (void)row;
  l.is_signed ? dots_portable<true>(u, x, 0, x.rows, l.values, out)
              : dots_portable<false>(u, x, 0, x.rows, l.values, out);
}

// ---- matrices ----------------------------------------------------------------------------------------------

// One quantized matrix: its blocks [out, bytes per row] as the file stores them.
struct Matrix {
  at::Tensor blocks;
  int64_t type = 0, cols = 0;
  int64_t unit_rows() const { return is_tiled(type) ? kTileRows * tiles_per_unit(type) : 1; }  // a row, a tile or a pair
  int64_t rows() const { return blocks.size(0) * unit_rows(); }
};

constexpr int64_t kRowChunk = 64;  // activation rows per pass over the weights

// x [n, cols] (any float dtype) times the matrices stacked along their rows -> [n, total rows] float32. One
// parallel loop over all their rows per chunk of kRowChunk activation rows, quantized once per group size.
inline at::Tensor matmul(const at::Tensor& x, const std::vector<Matrix>& matrices, Path path) {
  TORCH_CHECK(x.dim() == 2, "x must be [rows, cols]");
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const int64_t n = xf.size(0), cols = xf.size(1);
  std::vector<int64_t> starts{0}, units{0};  // per matrix: its first output row, its first unit (`unit_rows`)
  for (const auto& m : matrices) {
    TORCH_CHECK(m.cols == cols, "matrix of ", m.cols, " columns times rows of ", cols);
    TORCH_CHECK(m.blocks.scalar_type() == at::kByte && m.blocks.is_contiguous(), "blocks must be contiguous uint8");
    const Layout l = layout(m.type);
    TORCH_CHECK(cols % l.values == 0 && m.blocks.size(1) == cols / l.values * l.bytes, "blocks do not fit the type");
    starts.push_back(starts.back() + m.rows());
    units.push_back(units.back() + m.blocks.size(0));
  }
  const int64_t total = starts.back();
  at::Tensor out = at::empty({n, total}, xf.options());
  float* out_data = out.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1));
  std::vector<const uint8_t*> bases;  // read once: data_ptr is checked on every call
  for (const auto& m : matrices) bases.push_back(m.blocks.data_ptr<uint8_t>());
  // Activation rows a chunk at a time, so that their int8 values stay in cache while every weight row passes
  // by (a 512-row prefill re-read 0.8 MB of them per weight row). Each row is quantized and dotted on its own,
  // so chunking changes no result.
  for (int64_t chunk = 0; chunk < n; chunk += kRowChunk) {
    const int64_t rows = std::min(kRowChunk, n - chunk);
    const float* x_rows = xf.data_ptr<float>() + chunk * cols;
    const Quantized* by_group[2] = {nullptr, nullptr};  // groups of 32, 256
    std::vector<std::unique_ptr<Quantized>> held;
    for (const auto& m : matrices) {
      const int64_t values = layout(m.type).values, slot = values == 32 ? 0 : 1;
      if (!by_group[slot]) {
        held.push_back(std::make_unique<Quantized>(x_rows, rows, cols, values));
        by_group[slot] = held.back().get();
      }
    }
    float* out_rows = out_data + chunk * total;
    at::parallel_for(0, units.back(), grain, [&](int64_t begin, int64_t end) {
      Unpacked u;
      std::vector<float> column(2 * kTileRows * rows);
      size_t part = 0;
      for (int64_t unit = begin; unit < end; ++unit) {
        while (unit >= units[part + 1]) ++part;
        const Matrix& m = matrices[part];
        const uint8_t* blocks = bases[part] + (unit - units[part]) * m.blocks.size(1);
        const Quantized& x = *by_group[layout(m.type).values == 32 ? 0 : 1];
        const int64_t done = m.unit_rows(), first = starts[part] + (unit - units[part]) * done;
        if (is_tiled(m.type)) {
          unit_dots(m.type, blocks, x, path, column.data());
        } else {
          if (needs_unpacking(m.type, path)) unpack_row(blocks, m.type, cols, u);
          dots(blocks, u, x, m.type, path, column.data());
        }
        for (int64_t r = 0; r < rows; ++r)  // weight rows: a run of outputs per row r
          for (int64_t i = 0; i < done; ++i) out_rows[r * total + first + i] = column[i * rows + r];
      }
    });
  }
  return out;
}

// Rows `ids` of a matrix, dequantized to float32 [ids, cols] (embedding lookups).
inline at::Tensor dequantize_rows(const Matrix& m, const at::Tensor& ids) {
  const at::Tensor idx = ids.to(at::kLong).contiguous();
  const int64_t n = idx.numel(), cols = m.cols, values = layout(m.type).values;
  const bool is_signed = layout(m.type).is_signed;
  at::Tensor out = at::empty({n, cols}, at::TensorOptions().dtype(at::kFloat));
  Unpacked u;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t id = idx.data_ptr<int64_t>()[r];
    TORCH_CHECK(id >= 0 && id < m.rows(), "row ", id, " out of range");
    if (is_tiled(m.type)) {  // tile id % unit_rows / 8 of unit id / unit_rows, its groups per_unit apart
      const int64_t per_unit = tiles_per_unit(m.type), within = id % m.unit_rows();
      const int64_t block = tiled_block_type(m.type);
      const uint8_t* unit = m.blocks.data_ptr<uint8_t>() + id / m.unit_rows() * m.blocks.size(1);
      const int64_t i = within % kTileRows, h = within / kTileRows;
      switch (block) {
        case Q4_0: unpack_legacy_tile_row<TileQ4_0>(unit + h * sizeof(TileQ4_0), i, cols, per_unit, u); break;
        case Q4_1: unpack_legacy_tile_row<TileQ4_1>(unit + h * sizeof(TileQ4_1), i, cols, per_unit, u); break;
        case Q5_0: unpack_legacy_tile_row<TileQ5_0>(unit + h * sizeof(TileQ5_0), i, cols, per_unit, u); break;
        case Q5_1: unpack_legacy_tile_row<TileQ5_1>(unit + h * sizeof(TileQ5_1), i, cols, per_unit, u); break;
        case Q8_0: unpack_q8_tile_row(unit + h * sizeof(TileQ8_0), i, cols, per_unit, u); break;
        case Q4_K: unpack_tile_row<TileQ4K>(unit + h * sizeof(TileQ4K), i, cols, per_unit, u); break;
        case Q5_K: unpack_tile_row<TileQ5K>(unit + h * sizeof(TileQ5K), i, cols, per_unit, u); break;
        default: unpack_q6_tile_row(unit + h * sizeof(TileQ6K), i, cols, per_unit, u);
      }
    } else {
      unpack_row(m.blocks.data_ptr<uint8_t>() + id * m.blocks.size(1), m.type, cols, u);
    }
    float* dst = out.data_ptr<float>() + r * cols;
    for (int64_t i = 0; i < cols; ++i) {
      const int64_t g = i / values, j = i / 16;
      const float code = is_signed ? static_cast<int8_t>(u.codes[i]) : u.codes[i];
      dst[i] = u.a[g] * u.pair_scales[i / 2] * code + u.b[g] * u.mins[j];
    }
  }
  return out;
}

}  // namespace gguf
