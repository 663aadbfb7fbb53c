// Attention's two products on a bf16 cache in bf16 dot-product arithmetic (AVX-512 BF16's vdpbf16ps): scores
// as query . key with the query rounded to bf16, and value sums with the softmax weights rounded to bf16.
//
// One vdpbf16ps lane adds two products of bf16 pairs to an fp32 sum: the odd element's product first, then the
// even one's, each an exact product (8-bit by 8-bit mantissas) rounded once into the sum, with bf16 denormal
// inputs read as zero and denormal results flushed to zero. That is 32 multiplies an instruction against 16 for
// an fp32 fma, and the keys and values are read as they lie in the cache, not converted first.
//
// AVX2 has no such instruction but performs the same arithmetic at its full fma rate: a bf16 widens to fp32 by
// a shift (the even element) or a mask (the odd one) of its dword, an fp32 fma of two widened bf16 is the exact
// product rounded once into the sum, and MXCSR's DAZ and FTZ bits (set by `Arithmetic` around a pass) read
// denormals as zero and flush denormal sums. So the AVX-512, AVX2 and portable paths give the same bits; the
// portable one runs the arithmetic a lane at a time (`dot_step`). AVX-512 without BF16 (Intel's Skylake-SP, Cascade
// Lake and Ice Lake Xeons) runs AVX2's arithmetic sixteen lanes a vector in `dots16` and `add_pairs`, in the native
// path's layout and with its three queries a pass (`BF16_DOTS_AVX512`). Where many queries read a tile of keys (a
// tree's rows), AVX2 widens and transposes the tile once (`key_columns`) and sums eight keys a vector
// (`column_dots16`), which spares each query the widening and the lanes' horizontal pairing (on AVX-512 too: sixteen
// keys a vector need a load for every fma, the query's broadcast value, and run slower there).
//
// Layouts: a query and a key are DIM bf16; lane l of a key's sum holds dims 32c + 2l (even) and 32c + 2l + 1
// (odd) for c = 0, 1, ...; the 16 lanes are then paired down, adjacent lanes first. Value
// rows go in pairs (rows 2m and 2m + 1 of a row sequence) interleaved into DIM dwords, dim d's dword holding
// row 2m's bf16 in its low half and row 2m + 1's in its high half; a weight pair is one dword laid out alike.

#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>
#define BF16_DOTS_NATIVE 1
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define BF16_DOTS_AVX2 1
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define BF16_DOTS_AVX512 1  // the AVX2 arithmetic's scores and value sums sixteen lanes a vector
#endif
#endif

#include "lane_pairs.h"

namespace bf16_dots {

constexpr int LANES = 16;
#if defined(BF16_DOTS_NATIVE) || defined(BF16_DOTS_AVX512)
constexpr int QUERIES = 3;  // queries a pass over a tile serves: their sums and lane pairs fill AVX-512's registers
#else
constexpr int QUERIES = 2;  // the AVX2 kernels take one or two
#endif

// The floating-point environment of the kernels below for as long as it lives: on AVX2, MXCSR with DAZ and FTZ
// set and rounding to nearest even, which makes an fp32 fma round as a vdpbf16ps step does (the other paths
// need nothing). Held around a pass of dots16 or add_pairs, not around a softmax.
class Arithmetic {
#ifdef BF16_DOTS_AVX2
 public:
  Arithmetic() : saved_(_mm_getcsr()) { _mm_setcsr((saved_ & ~0x6000u) | 0x8040u); }
  ~Arithmetic() { _mm_setcsr(saved_); }
  Arithmetic(const Arithmetic&) = delete;
  Arithmetic& operator=(const Arithmetic&) = delete;

 private:
  unsigned saved_;
#endif
};

#ifdef BF16_DOTS_AVX2
inline __m256i load256(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
// The odd (high) and even (low) bf16 of eight dwords as fp32.
inline __m256 odd_halves(__m256i v) { return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(-65536))); }
inline __m256 even_halves(__m256i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }

#ifdef BF16_DOTS_AVX512  // the same of sixteen dwords
inline __m512 odd_halves(__m512i v) { return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(-65536))); }
inline __m512 even_halves(__m512i v) { return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)); }
#endif

// Eight floats rounded to bf16 as round_bf16 rounds them, each in the low half of its dword.
inline __m256i round_bf16_8(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(rounded, quiet, nan);
}
#endif

// Round to nearest even, as vcvtneps2bf16 does (NaN stays NaN).
inline uint16_t round_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// out[i] = x[i] * factor rounded to bf16 (the product rounded to fp32 first).
inline void round_bf16(const float* x, uint16_t* out, int64_t count, float factor = 1.0f) {
  int64_t i = 0;
#ifdef BF16_DOTS_NATIVE
  const __m512 f = _mm512_set1_ps(factor);
  for (; i + LANES <= count; i += LANES) {
    const __m512 scaled = _mm512_mul_ps(_mm512_loadu_ps(x + i), f);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), (__m256i)_mm512_cvtneps_pbh(scaled));
  }
#elif defined(BF16_DOTS_AVX2)
  const __m256 f = _mm256_set1_ps(factor);
  for (; i + LANES <= count; i += LANES) {  // packed [0-3, 8-11 | 4-7, 12-15], then put in order
    const __m256i low = round_bf16_8(_mm256_mul_ps(_mm256_loadu_ps(x + i), f));
    const __m256i packed = _mm256_packus_epi32(low, round_bf16_8(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8), f)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_permute4x64_epi64(packed, 0xd8));
  }
#endif
  for (; i < count; ++i) out[i] = round_bf16(x[i] * factor);
}

// The bf16 as fp32, denormals read as zero.
inline float widen(uint16_t h) {
  if ((h & 0x7f80u) == 0) h &= 0x8000u;
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

// sum + a * b rounded once, a denormal result flushed to zero: one of vdpbf16ps' two steps.
inline float dot_step(float sum, uint16_t a, uint16_t b) {
  const float r = std::fma(widen(a), widen(b), sum);
  return std::fpclassify(r) == FP_SUBNORMAL ? std::copysign(0.0f, r) : r;
}

// One vdpbf16ps lane: sum + the odd pair's product, then + the even pair's.
inline float dot_pair(float sum, uint32_t a, uint32_t b) {
  sum = dot_step(sum, static_cast<uint16_t>(a >> 16), static_cast<uint16_t>(b >> 16));
  return dot_step(sum, static_cast<uint16_t>(a), static_cast<uint16_t>(b));
}

// scores[j][i] = q[j] . tile[i] for a tile of 16 keys [16][DIM] bf16, for each of Q queries (bf16 [DIM]).
template <int DIM, int Q>
inline void dots16(const uint16_t* const (&q)[Q], const uint16_t* tile, float* const (&scores)[Q]) {
  static_assert(DIM % 32 == 0, "a key is whole 32-value vectors");
#ifdef BF16_DOTS_NATIVE
  constexpr int kVectors = DIM / 32;
  LanePairs<Q> pairs;
  __m512bh query[Q][kVectors];
  for (int j = 0; j < Q; ++j)
    for (int c = 0; c < kVectors; ++c) query[j][c] = (__m512bh)_mm512_loadu_si512(q[j] + 32 * c);
#pragma GCC unroll 16
  for (int i = 0; i < LANES; ++i) {
    __m512 sum[Q];
    for (int j = 0; j < Q; ++j) sum[j] = _mm512_setzero_ps();
    for (int c = 0; c < kVectors; ++c) {
      const __m512bh key = (__m512bh)_mm512_loadu_si512(tile + i * DIM + 32 * c);
      for (int j = 0; j < Q; ++j) sum[j] = _mm512_dpbf16_ps(sum[j], query[j][c], key);
    }
    pairs.add(i, sum, scores);
  }
#elif defined(BF16_DOTS_AVX512)
  // The native path's lanes, each vdpbf16ps two fmas of widened halves (the odd one first); each query widened
  // once a call, each key vector once for the Q queries.
  constexpr int kVectors = DIM / 32;
  LanePairs<Q> pairs;
  __m512 odd[Q][kVectors], even[Q][kVectors];
  for (int j = 0; j < Q; ++j) {
    for (int c = 0; c < kVectors; ++c) {
      const __m512i v = _mm512_loadu_si512(q[j] + 32 * c);
      odd[j][c] = odd_halves(v), even[j][c] = even_halves(v);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < LANES; ++i) {
    __m512 sum[Q];
    for (int j = 0; j < Q; ++j) sum[j] = _mm512_setzero_ps();
    for (int c = 0; c < kVectors; ++c) {
      const __m512i key = _mm512_loadu_si512(tile + i * DIM + 32 * c);
      const __m512 key_odd = odd_halves(key), key_even = even_halves(key);
      for (int j = 0; j < Q; ++j) {
        sum[j] = _mm512_fmadd_ps(odd[j][c], key_odd, sum[j]);
        sum[j] = _mm512_fmadd_ps(even[j][c], key_even, sum[j]);
      }
    }
    pairs.add(i, sum, scores);
  }
#elif defined(BF16_DOTS_AVX2)
  // KEYS keys at a time, each key vector widened once for the Q queries: sums[4h + KEYS j + i] holds query j's
  // lanes 8h .. 8h + 7 of key i (a chunk of 32 values is two vectors of eight dwords, h = 0 then 1), each lane
  // the odd product, then the even one, into the sum. Eight sums in flight keep both fma pipes busy.
  static_assert(Q == 1 || Q == 2, "one or two queries a call");
  constexpr int KEYS = 4 / Q, kVectors = DIM / 16;  // kVectors: vectors of eight dwords in a key
  __m256 odd[Q][kVectors], even[Q][kVectors];
  for (int j = 0; j < Q; ++j) {
    for (int c = 0; c < kVectors; ++c) {
      const __m256i v = load256(q[j] + 16 * c);
      odd[j][c] = odd_halves(v), even[j][c] = even_halves(v);
    }
  }
  for (int first = 0; first < LANES; first += KEYS) {
    __m256 sums[8];
    for (int k = 0; k < 8; ++k) sums[k] = _mm256_setzero_ps();
#pragma GCC unroll 8
    for (int c = 0; c < kVectors; ++c) {
      for (int i = 0; i < KEYS; ++i) {
        const __m256i key = load256(tile + (first + i) * DIM + 16 * c);
        const __m256 key_odd = odd_halves(key), key_even = even_halves(key);
        for (int j = 0; j < Q; ++j) {
          __m256& sum = sums[4 * (c % 2) + KEYS * j + i];
          sum = _mm256_fmadd_ps(odd[j][c], key_odd, sum);
          sum = _mm256_fmadd_ps(even[j][c], key_even, sum);
        }
      }
    }
    const __m256 halves = pairwise_sums8(sums);  // lanes 0-7 summed, then lanes 8-15
    alignas(16) float four[4];
    _mm_store_ps(four, _mm_add_ps(_mm256_castps256_ps128(halves), _mm256_extractf128_ps(halves, 1)));
    for (int j = 0; j < Q; ++j)
      for (int i = 0; i < KEYS; ++i) scores[j][first + i] = four[KEYS * j + i];
  }
#else
  for (int j = 0; j < Q; ++j) {
    for (int i = 0; i < LANES; ++i) {
      float lanes[LANES] = {};
      uint32_t qs[DIM / 2], ks[DIM / 2];
      std::memcpy(qs, q[j], sizeof(qs));
      std::memcpy(ks, tile + i * DIM, sizeof(ks));
      for (int c = 0; c < DIM / 2; c += LANES)
        for (int l = 0; l < LANES; ++l) lanes[l] = dot_pair(lanes[l], qs[c + l], ks[c + l]);
      for (int n = LANES; n > 1; n /= 2)
        for (int k = 0; k < n / 2; ++k) lanes[k] = lanes[2 * k] + lanes[2 * k + 1];
      scores[j][i] = lanes[0];
    }
  }
#endif
}

#ifdef BF16_DOTS_AVX2
constexpr int COLUMNS_FROM = 8;  // queries that read a tile for its columns to pay (a decode step's group does not)

// A tile of 16 keys [16][DIM] bf16 widened to fp32 and transposed into `columns` [DIM][16]: dim d of key i at 16 d + i.
template <int DIM>
inline void key_columns(const uint16_t* tile, float* columns) {
  for (int half = 0; half < 2; ++half) {
    for (int p = 0; p < DIM / 2; p += 8) {  // dwords p .. p + 7 of keys 8 half .. 8 half + 7: an 8x8 transpose
      __m256i r[8], t[8], u[8];
      for (int i = 0; i < 8; ++i) r[i] = load256(tile + (8 * half + i) * DIM + 2 * p);
      for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]), t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
      }
      for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]), u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]), u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
      }
      for (int e = 0; e < 8; ++e) {  // dword p + e of the eight keys: dims 2 (p + e) and 2 (p + e) + 1
        const __m256i dword = e < 4 ? _mm256_permute2x128_si256(u[e], u[4 + e], 0x20)  // an immediate, as it must be
                                    : _mm256_permute2x128_si256(u[e - 4], u[e], 0x31);
        float* out = columns + 2 * (p + e) * LANES + 8 * half;
        _mm256_storeu_ps(out, even_halves(dword));
        _mm256_storeu_ps(out + LANES, odd_halves(dword));
      }
    }
  }
}

// dots16's scores from a tile's `key_columns`, for Q queries widened to fp32 ([DIM] each).
template <int DIM, int Q>
inline void column_dots16(const float* const (&q)[Q], const float* keys, float* const (&scores)[Q]) {
  // 4 / Q lanes at a time, each in two vectors of eight keys a query (eight sums in flight): lane l's dims in
  // order, the odd one of each dword first, each key vector loaded once for the Q queries' broadcast values; then
  // the lanes paired down as they come, keys 2i and 2i + 1 as soon as both are summed, then pairs of those
  static_assert(Q == 1 || Q == 2 || Q == 4, "one, two or four queries a call");
  constexpr int AT_ONCE = 4 / Q;
  __m256 pending[4][Q][2];  // pending[level][j]: query j's sum of a run of lanes waiting for its pair
  for (int first = 0; first < LANES; first += AT_ONCE) {
    __m256 sums[AT_ONCE][Q][2];
    for (int a = 0; a < AT_ONCE; ++a)
      for (int j = 0; j < Q; ++j) sums[a][j][0] = sums[a][j][1] = _mm256_setzero_ps();
    for (int c = 0; c < DIM / 32; ++c) {
      for (int a = 0; a < AT_ONCE; ++a) {
        for (int parity = 1; parity >= 0; --parity) {
          const int d = 32 * c + 2 * (first + a) + parity;
          __m256 low = _mm256_loadu_ps(keys + d * LANES), high = _mm256_loadu_ps(keys + d * LANES + 8);
          asm("" : "+x"(low), "+x"(high));  // kept in registers, not folded into (and reloaded by) each fma
          for (int j = 0; j < Q; ++j) {
            const __m256 x = _mm256_broadcast_ss(q[j] + d);
            sums[a][j][0] = _mm256_fmadd_ps(x, low, sums[a][j][0]);
            sums[a][j][1] = _mm256_fmadd_ps(x, high, sums[a][j][1]);
          }
        }
      }
    }
    for (int a = 0; a < AT_ONCE; ++a) {
      int level = 0;
      for (int k = first + a; level < 4 && (k & 1); ++level, k >>= 1) {
        for (int j = 0; j < Q; ++j)
          for (int h = 0; h < 2; ++h) sums[a][j][h] = _mm256_add_ps(pending[level][j][h], sums[a][j][h]);
      }
      for (int j = 0; j < Q; ++j) {
        for (int h = 0; h < 2; ++h) {
          if (level == 4) _mm256_storeu_ps(scores[j] + 8 * h, sums[a][j][h]);  // the sixteenth lane: the scores
          else pending[level][j][h] = sums[a][j][h];
        }
      }
    }
  }
}
#endif

// out[d] = (a[d], b[d]) as one dword, a in the low half: two value rows of DIM bf16 as DIM pairs.
template <int DIM>
inline void interleave(const uint16_t* a, const uint16_t* b, uint32_t* out) {
  int d = 0;
#if defined(BF16_DOTS_NATIVE) || defined(BF16_DOTS_AVX512)
  int16_t order[32];  // a's value i, then b's (index 32 + i), for i = 0 .. 15
  for (int i = 0; i < 16; ++i) order[2 * i] = static_cast<int16_t>(i), order[2 * i + 1] = static_cast<int16_t>(32 + i);
  const __m512i low = _mm512_loadu_si512(order), high = _mm512_add_epi16(low, _mm512_set1_epi16(16));
  for (; d + 32 <= DIM; d += 32) {
    const __m512i x = _mm512_loadu_si512(a + d), y = _mm512_loadu_si512(b + d);
    _mm512_storeu_si512(out + d, _mm512_permutex2var_epi16(x, low, y));
    _mm512_storeu_si512(out + d + 16, _mm512_permutex2var_epi16(x, high, y));
  }
#elif defined(BF16_DOTS_AVX2)
  for (; d + 16 <= DIM; d += 16) {  // unpacked [0-3, 8-11 | 4-7, 12-15], then put in order
    const __m256i x = load256(a + d), y = load256(b + d);
    const __m256i low = _mm256_unpacklo_epi16(x, y), high = _mm256_unpackhi_epi16(x, y);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + d), _mm256_permute2x128_si256(low, high, 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + d + 8), _mm256_permute2x128_si256(low, high, 0x31));
  }
#endif
  for (; d < DIM; ++d) out[d] = static_cast<uint32_t>(a[d]) | (static_cast<uint32_t>(b[d]) << 16);
}

// acc[q][d] += the dot pair of weights[q][m] and pairs[m][d], for m = 0 .. count - 1 in order and each of Q
// queries: AVX-512 keeps 128 columns of every query's `acc` in registers while the pairs stream by.
template <int DIM, int Q>
inline void add_pairs(const uint32_t* const (&weights)[Q], const uint32_t* pairs, int64_t count,
                      float* const (&acc)[Q]) {
#ifdef BF16_DOTS_NATIVE
  constexpr int kWidth = DIM < 128 ? DIM : 128, kVectors = kWidth / 16;
  for (int h = 0; h < DIM; h += kWidth) {
    __m512 sums[Q][kVectors];
    for (int q = 0; q < Q; ++q)
      for (int j = 0; j < kVectors; ++j) sums[q][j] = _mm512_loadu_ps(acc[q] + h + 16 * j);
    for (int64_t m = 0; m < count; ++m) {
      const uint32_t* pair = pairs + m * DIM + h;
      __m512bh weight[Q];
      for (int q = 0; q < Q; ++q) weight[q] = (__m512bh)_mm512_set1_epi32(static_cast<int>(weights[q][m]));
      for (int j = 0; j < kVectors; ++j) {
        const __m512bh v = (__m512bh)_mm512_loadu_si512(pair + 16 * j);
        for (int q = 0; q < Q; ++q) sums[q][j] = _mm512_dpbf16_ps(sums[q][j], weight[q], v);
      }
    }
    for (int q = 0; q < Q; ++q)
      for (int j = 0; j < kVectors; ++j) _mm512_storeu_ps(acc[q] + h + 16 * j, sums[q][j]);
  }
#elif defined(BF16_DOTS_AVX512)
  // 64 columns of each query's `acc` in registers (all 96 of a 96-dim head) while the pairs stream by, each
  // weight and each pair widened once for all
  constexpr int kWidth = DIM % 64 == 0 ? 64 : DIM, kVectors = kWidth / 16;
  static_assert(DIM % kWidth == 0 && kWidth % 16 == 0, "whole vectors of columns");
  for (int h = 0; h < DIM; h += kWidth) {
    __m512 sums[Q][kVectors];
    for (int q = 0; q < Q; ++q)
      for (int v = 0; v < kVectors; ++v) sums[q][v] = _mm512_loadu_ps(acc[q] + h + 16 * v);
    for (int64_t m = 0; m < count; ++m) {
      __m512 odd[Q], even[Q];
      for (int q = 0; q < Q; ++q) {
        const __m512i weight = _mm512_set1_epi32(static_cast<int>(weights[q][m]));
        odd[q] = odd_halves(weight), even[q] = even_halves(weight);
      }
      const uint32_t* pair = pairs + m * DIM + h;
      for (int v = 0; v < kVectors; ++v) {
        const __m512i values = _mm512_loadu_si512(pair + 16 * v);
        const __m512 values_odd = odd_halves(values), values_even = even_halves(values);
        for (int q = 0; q < Q; ++q) {
          sums[q][v] = _mm512_fmadd_ps(odd[q], values_odd, sums[q][v]);
          sums[q][v] = _mm512_fmadd_ps(even[q], values_even, sums[q][v]);
        }
      }
    }
    for (int q = 0; q < Q; ++q)
      for (int v = 0; v < kVectors; ++v) _mm512_storeu_ps(acc[q] + h + 16 * v, sums[q][v]);
  }
#elif defined(BF16_DOTS_AVX2)
  // 64 / Q columns (32 / Q where DIM is not in 64s) of each query's `acc` in registers while the pairs stream by,
  // each pair widened once for all
  static_assert(Q == 1 || Q == 2, "one or two queries a call");
  constexpr int kVectors = (DIM % 64 == 0 ? 8 : 4) / Q;
  for (int h = 0; h < DIM; h += 8 * kVectors) {
    __m256 sums[Q][kVectors];
    for (int q = 0; q < Q; ++q)
      for (int v = 0; v < kVectors; ++v) sums[q][v] = _mm256_loadu_ps(acc[q] + h + 8 * v);
    for (int64_t m = 0; m < count; ++m) {
      __m256 odd[Q], even[Q];
      for (int q = 0; q < Q; ++q) {
        const __m256i weight = _mm256_set1_epi32(static_cast<int>(weights[q][m]));
        odd[q] = odd_halves(weight), even[q] = even_halves(weight);
      }
      const uint32_t* pair = pairs + m * DIM + h;
      for (int v = 0; v < kVectors; ++v) {
        const __m256i values = load256(pair + 8 * v);
        const __m256 values_odd = odd_halves(values), values_even = even_halves(values);
        for (int q = 0; q < Q; ++q) {
          sums[q][v] = _mm256_fmadd_ps(odd[q], values_odd, sums[q][v]);
          sums[q][v] = _mm256_fmadd_ps(even[q], values_even, sums[q][v]);
        }
      }
    }
    for (int q = 0; q < Q; ++q)
      for (int v = 0; v < kVectors; ++v) _mm256_storeu_ps(acc[q] + h + 8 * v, sums[q][v]);
  }
#else
  for (int q = 0; q < Q; ++q)
    for (int64_t m = 0; m < count; ++m)
      for (int d = 0; d < DIM; ++d) acc[q][d] = dot_pair(acc[q][d], weights[q][m], pairs[m * DIM + d]);
#endif
}

}  // namespace bf16_dots
