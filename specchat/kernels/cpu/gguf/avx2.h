// The 256-bit kernels: AVX2 (with FMA and F16C), each row's operations those of the portable loops (portable.h).
// Integer products go through vpmaddubsw / vpmaddwd; where the CPU has vpdpbusd on 256-bit vectors (AVX-512 VNNI,
// or AVX-VNNI) the same integers may take it instead (`VNNI` template arguments, and the legacy types' products).
// Activation rows come in fours, or eights where a tile's products go through vpdpbusd (ROWS), each weight row or
// tile read once for all of them.
#pragma once

#include "portable.h"

#include <type_traits>

#ifdef GGUF_AVX2
namespace gguf {

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

#ifdef GGUF_DPBUSD
// sum + the four byte products (unsigned u times signed s) of each int32 lane: AVX-512's encoding or AVX-VNNI's.
inline __m256i dpbusd(__m256i sum, __m256i u, __m256i s) {
#ifdef GGUF_VNNI
  return _mm256_dpbusd_epi32(sum, u, s);
#else
  return _mm256_dpbusd_avx_epi32(sum, u, s);
#endif
}
#endif

// 0xff in byte l where bit l of `bits` is set, else 0.
inline __m256i bit_bytes(uint32_t bits) {
  // byte l of `spread` is byte l / 8 of `bits`; then bit l % 8 of it, as a byte mask
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)),
                                             _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                              2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
}

// 16 in byte l where bit l of `bits` is set, else 0 (a Q5_0 / Q5_1 block's fifth bits, as its file holds them).
inline __m256i fifth_bits_vector(uint32_t bits) { return _mm256_and_si256(bit_bytes(bits), _mm256_set1_epi8(16)); }

// `nibbles` with 16 added in byte l where bit k of byte l of `fifth` is set (a tile's fifth bits, Q5_0 / Q5_1 /
// Q5_K): AVX-512 tests the bit into a byte mask; AVX2 shifts bit k to bit 4 of every byte (no bit of the next byte
// reaches it) and ors it in: three operations where spreading a 32-bit word takes a broadcast, a shuffle, a compare
// and two more.
inline __m256i with_fifth_bits(__m256i nibbles, __m256i fifth, int k) {
#ifdef GGUF_VNNI
  const __mmask32 set = _mm256_test_epi8_mask(fifth, _mm256_set1_epi8(static_cast<char>(1 << k)));
  return _mm256_mask_add_epi8(nibbles, set, nibbles, _mm256_set1_epi8(16));
#else
  const __m128i count = _mm_cvtsi32_si128(k < 4 ? 4 - k : k - 4);
  const __m256i at_four = k < 4 ? _mm256_sll_epi16(fifth, count) : _mm256_srl_epi16(fifth, count);
  return _mm256_or_si256(nibbles, _mm256_and_si256(at_four, _mm256_set1_epi8(16)));
#endif
}

// 16 in byte l where bit `shift` of byte l of `high` is set, else 0 (Q5_K's fifth bits).
inline __m256i fifth_bits_k_vector(__m256i high, int shift) {
  const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << shift));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(high, bit), bit), _mm256_set1_epi8(16));
}

// `six_bits_128` (unpack.h) in four vectors: 64 low-nibble bytes and 32 bytes of 2-bit pairs -> 128 codes.
inline void six_bits_128_vectors(const uint8_t* ql, const uint8_t* qh, uint8_t* out) {
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
}

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
// (`mins`, int16) times the row's sums into the offset lanes, as `dots_portable` does (D[g] A[g] and D[g] B[g]
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

// Q4_K, or Q5_K with FIVE, straight from its blocks (no unpacked copy): the operations of `dots_portable`.
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
      six_bits_128_vectors(b + 64 * h, b + 128 + 32 * h, codes);
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
#ifdef GGUF_DPBUSD  // the same integers in one step: vpdpbusd sums four byte products into each int32 lane
  const __m256i zero = _mm256_setzero_si256();
  return SIGNED ? dpbusd(zero, magnitude, _mm256_sign_epi8(a, w)) : dpbusd(zero, w, a);
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

// Rows in fours, then the rest (3, 2 or 1) in one call; each row's operations the same either way. Three rows
// went as a pair and one, reading the weights twice: through the AVX2 tile kernels a forward's matrices of the
// 1.5B took 43.3 ms at 3 rows on a Zen 4 against 44.7 at 4, and 35.6 in one call.
template <typename Kernel>
inline void by_fours(int64_t rows, Kernel kernel) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) kernel(std::integral_constant<int, 4>{}, r);
  switch (rows - r) {
    case 3: return kernel(std::integral_constant<int, 3>{}, r);
    case 2: return kernel(std::integral_constant<int, 2>{}, r);
    case 1: return kernel(std::integral_constant<int, 1>{}, r);
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

// Unsigned codes times int8 activations added to `sums`: AVX2 in pairs into int16 lanes, VNNI in fours into
// int32 lanes.
template <bool VNNI>
inline __m256i products(__m256i sums, __m256i codes, __m256i a) {
#ifdef GGUF_DPBUSD
  if constexpr (VNNI) return dpbusd(sums, codes, a);
#endif
  return _mm256_add_epi16(sums, _mm256_maddubs_epi16(codes, a));
}

// A sub-block's `products` times its scales, in int32 lanes: AVX2 widens pairs of int16 lanes in the
// multiply-add, VNNI's lanes are int32 already.
template <bool VNNI>
inline __m256i scaled(__m256i sums, __m256i scales) {
#ifdef GGUF_DPBUSD
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

// Part k of `parts` of `prefetch(p, bytes)`: prefetches 64 bytes apart from k's share of the bytes on, as many as
// its share has lines, so that the parts' addresses together step at most 64 bytes and reach every line (one now
// and then twice). A K-quant group asks for its prefetch an eighth at a time, beside its sub-blocks' loads: asked
// all at once (18 lines a tile, 36 a pair), one row of the 1.5B's matrices ran 5% slower through 256 bits and 9%
// through 512 while the memory ran fast. The count is fixed for the type (`bytes` and `parts` are constants):
// a loop over exactly the part's own lines (2 or 3 of a tile's, by k) cost the AVX2 Q4_K kernel a fifth of its
// time at one row and a tenth at four, its data in L2.
inline void prefetch_part(const void* p, int64_t bytes, int k, int parts) {
  const int64_t share = (bytes + parts - 1) / parts;
  const char* at = reinterpret_cast<const char*>(p) + k * share;
  for (int64_t line = 0; line < (share + 63) / 64; ++line) _mm_prefetch(at + 64 * line, _MM_HINT_T1);
}

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
// memory; `group(t, g, acc, offset, ahead)` adds tile group t (group g of its tile) into that tile's ROWS
// accumulators and prefetches the group `ahead` in eight parts. out[i * x.rows + r] for tile h's rows 8h + i.
template <typename Tile, int ROWS, int HALVES, typename Group>
inline void walk_tile_groups(const uint8_t* unit, const Quantized& x, int64_t first, float* out, Group group) {
  const auto* tiles = reinterpret_cast<const Tile*>(unit);
  __m256 acc[HALVES][ROWS], offset[HALVES][ROWS];
  for (int h = 0; h < HALVES; ++h)
    for (int r = 0; r < ROWS; ++r) acc[h][r] = offset[h][r] = _mm256_setzero_ps();
  for (int64_t index = 0; index < x.cols / 256 * HALVES; ++index) {
    const int h = HALVES == 1 ? 0 : index % HALVES;
    group(tiles[index], index / HALVES, acc[h], offset[h], tiles + index + kPrefetchGroups);
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
                                                                 __m256 (&offset)[ROWS], const Tile* ahead) {
    const TileQ4K& t = k4_part(whole);
    __m256i p[ROWS];
    for (int r = 0; r < ROWS; ++r) p[r] = _mm256_setzero_si256();
#pragma GCC unroll 1
    for (int j = 0; j < 8; ++j) {
      prefetch_part(ahead, sizeof(Tile), j, 8);
      uint64_t packed;
      std::memcpy(&packed, t.scales[j], 8);
      const __m128i s8 = _mm_cvtsi64_si128(static_cast<int64_t>(packed));
      // row i's scale: AVX2 in int16 lanes 2i, 2i + 1, VNNI in int32 lane i
      const __m256i scales = VNNI ? _mm256_cvtepu8_epi32(s8) : _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(s8, s8));
      __m256i dot[ROWS];  // AVX2: int16, row i's two pair sums in lanes 2i, 2i + 1; VNNI: int32, row i's in lane i
      for (int r = 0; r < ROWS; ++r) dot[r] = _mm256_setzero_si256();
      const int8_t* a = x.q.data() + first * cols + g * 256 + 32 * j;
      __m256i fifth = _mm256_setzero_si256();
      if constexpr (five) fifth = load256(whole.fifth[j]);
      // rolled: unrolled, GCC computes every row's 8 products of the sub-block first and spills them (AVX2, 4 rows:
      // the step's matmuls 15% slower)
#pragma GCC unroll 1
      for (int v = 0; v < 4; ++v) {
        const __m256i codes = load256(t.codes[j] + 32 * v);
        __m256i low = _mm256_and_si256(codes, m4), high = _mm256_and_si256(_mm256_srli_epi16(codes, 4), m4);
        if constexpr (five) {
          low = with_fifth_bits(low, fifth, 2 * v);
          high = with_fifth_bits(high, fifth, 2 * v + 1);
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

// The four vectors of sub-block j's codes, quarter by quarter: vector k holds values 4k .. 4k + 3 of every row.
inline void k16_tile_codes(const TileQ6K& t, int j, __m256i (&codes)[4]) {
  const __m256i m4 = _mm256_set1_epi8(15), top = _mm256_set1_epi8(0x30);
  const __m256i low0 = load256(t.low[j]), low1 = load256(t.low[j] + 32), high = load256(t.high[j]);
  codes[0] = _mm256_or_si256(_mm256_and_si256(low0, m4), _mm256_and_si256(_mm256_slli_epi16(high, 4), top));
  codes[1] = _mm256_or_si256(_mm256_and_si256(low1, m4), _mm256_and_si256(_mm256_slli_epi16(high, 2), top));
  codes[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(low0, 4), m4), _mm256_and_si256(high, top));
  codes[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(low1, 4), m4),
                             _mm256_and_si256(_mm256_srli_epi16(high, 2), top));
}
inline void k16_tile_codes(const TileQ3K& t, int j, __m256i (&codes)[4]) {
  const __m256i m2 = _mm256_set1_epi8(3), bit2 = _mm256_set1_epi8(4);
  const __m256i low = load256(t.low[j]), both = load256(t.high[j / 2]);
  const __m256i high = j % 2 ? _mm256_srli_epi16(both, 4) : both;  // quarter k's third bit: bit k of each byte
  codes[0] = _mm256_or_si256(_mm256_and_si256(low, m2), _mm256_and_si256(_mm256_slli_epi16(high, 2), bit2));
  codes[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(low, 2), m2),
                             _mm256_and_si256(_mm256_slli_epi16(high, 1), bit2));
  codes[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(low, 4), m2), _mm256_and_si256(high, bit2));
  codes[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(low, 6), m2),
                             _mm256_and_si256(_mm256_srli_epi16(high, 1), bit2));
}

inline void k16_tile_codes(const TileQ2K& t, int j, __m256i (&codes)[4]) {
  const __m256i m2 = _mm256_set1_epi8(3), low = load256(t.low[j]);
  codes[0] = _mm256_and_si256(low, m2);
  codes[1] = _mm256_and_si256(_mm256_srli_epi16(low, 2), m2);
  codes[2] = _mm256_and_si256(_mm256_srli_epi16(low, 4), m2);
  codes[3] = _mm256_and_si256(_mm256_srli_epi16(low, 6), m2);
}

// Activation values 4k .. 4k + 3 of a sub-block, broadcast to every lane.
inline __m256i quad(const int8_t* a, int k) {
  int32_t four;
  std::memcpy(&four, a + 4 * k, 4);
  return _mm256_set1_epi32(four);
}

// A pair of sub-blocks' S and M, int16 [row][which of the pair] (`k16_scale`, `k16_min`).
template <typename Tile>
inline void k16_pair_scales(const Tile& t, int pair, __m256i& scales, __m256i& mins) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(t.scales[pair]));
  if constexpr (Tile::kMins) {
    const __m256i both = _mm256_cvtepu8_epi16(bytes);
    scales = _mm256_and_si256(both, _mm256_set1_epi16(15));
    mins = _mm256_srli_epi16(both, 4);
  } else {
    scales = mins = _mm256_cvtepi8_epi16(bytes);
  }
}

// Each row's B (`k16_offset_factor`), row i's in lane i.
template <typename Tile>
inline __m256 k16_offset_factors(const Tile& t) {
  if constexpr (Tile::kMins)
    return _mm256_sub_ps(_mm256_setzero_ps(), _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t.dmin))));
  else
    return _mm256_mul_ps(_mm256_set1_ps(-static_cast<float>(Tile::kCentre)),
                         _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t.d))));
}

// The end of a k16 tile group for one activation row (P and Q summed, row i's in lane i).
template <typename Tile>
inline void close_k16_tile_group(const Tile& t, const Quantized& x, int64_t r, int64_t g, __m256i p, __m256i q,
                                 __m256& acc, __m256& offset) {
  const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t.d)));
  const __m256 da = _mm256_broadcast_ss(x.scale.data() + r * (x.cols / 256) + g);
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(da, d), acc);
  offset = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), _mm256_mul_ps(da, k16_offset_factors(t)), offset);
}

// Q: a pair of sub-blocks' M (int16 lanes 2i, 2i + 1: row i's) times the row's two sums.
inline __m256i k16_pair_offset(__m256i mins16, const int16_t* sums) {
  int32_t both;
  std::memcpy(&both, sums, 4);
  return _mm256_madd_epi16(mins16, _mm256_set1_epi32(both));
}

// ROWS activation rows share each tile's codes (Q6_K's, Q3_K's or Q2_K's tiles: Tile). AVX2 sums Q6_K's products two
// quarters at a time in int16 (at most 4 * 63 * 128 < 2^15), the others' all four, before the scale's widening
// multiply-add; VNNI sums a sub-block's four quarters straight into int32 lanes, then multiplies by the scale once.
// The integers P and Q are the same either way.
template <int ROWS, bool VNNI, int HALVES, typename Tile>
void k16_tile_dots(const uint8_t* unit, const Quantized& x, int64_t first, float* out) {
  const int64_t cols = x.cols;
  walk_tile_groups<Tile, ROWS, HALVES>(unit, x, first, out, [&](const Tile& t, int64_t g, __m256 (&acc)[ROWS],
                                                                __m256 (&offset)[ROWS], const Tile* ahead) {
    __m256i p[ROWS], q[ROWS];
    for (int r = 0; r < ROWS; ++r) p[r] = q[r] = _mm256_setzero_si256();
#pragma GCC unroll 1
    for (int pair = 0; pair < 8; ++pair) {
      prefetch_part(ahead, sizeof(Tile), pair, 8);
      __m256i both, mins;
      k16_pair_scales(t, pair, both, mins);
      // row i's scale of the pair's first (second) sub-block: VNNI in int32 lane i, AVX2 in int16 lanes 2i, 2i + 1
      const __m256i scales[2] = {
          VNNI ? _mm256_srai_epi32(_mm256_slli_epi32(both, 16), 16) : _mm256_blend_epi16(both, _mm256_slli_epi32(both, 16), 0xAA),
          VNNI ? _mm256_srai_epi32(both, 16) : _mm256_blend_epi16(_mm256_srli_epi32(both, 16), both, 0xAA)};
      for (int h = 0; h < 2; ++h) {
        __m256i codes[4];
        k16_tile_codes(t, 2 * pair + h, codes);
        for (int r = 0; r < ROWS; ++r) {
          const int8_t* a = x.q.data() + (first + r) * cols + g * 256 + 16 * (2 * pair + h);
          const __m256i front = products<VNNI>(products<VNNI>(_mm256_setzero_si256(), codes[0], quad(a, 0)), codes[1], quad(a, 1));
          if constexpr (VNNI || 8 * Tile::kLargestCode * 128 < 32768) {  // AVX2: four quarters in int16
            const __m256i sum = products<VNNI>(products<VNNI>(front, codes[2], quad(a, 2)), codes[3], quad(a, 3));
            p[r] = _mm256_add_epi32(p[r], scaled<VNNI>(sum, scales[h]));
          } else {  // Q6_K: two quarters at a time in int16, each pair widened by the scale's multiply-add
            const __m256i back = products<VNNI>(products<VNNI>(_mm256_setzero_si256(), codes[2], quad(a, 2)), codes[3], quad(a, 3));
            p[r] = _mm256_add_epi32(p[r], _mm256_add_epi32(scaled<VNNI>(front, scales[h]), scaled<VNNI>(back, scales[h])));
          }
        }
      }
      for (int r = 0; r < ROWS; ++r)
        q[r] = _mm256_add_epi32(q[r], k16_pair_offset(mins, x.sums.data() + (first + r) * cols / 16 + g * 16 + 2 * pair));
    }
    for (int r = 0; r < ROWS; ++r) close_k16_tile_group(t, x, first + r, g, p[r], q[r], acc[r], offset[r]);
  });
}

// IQ4_XS tiles (tiles.h): ROWS activation rows share each load of the codes, whose values vpshufb looks up. AVX2
// multiplies the values' magnitudes by the activations signed as the values are (|v| <= 127, so a pair of products
// fits int16) and widens each pair sum by its scale at once; VNNI multiplies v + 128, unsigned, and takes 128
// times the sub-block's activation sum back before the scale. P is the same integer either way.
template <int ROWS, bool VNNI, int HALVES>
void iq4_tile_dots(const uint8_t* unit, const Quantized& x, int64_t first, float* out) {
  const int64_t cols = x.cols;
  const __m256i m4 = _mm256_set1_epi8(15);
  const __m256i values = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kIq4Values)));
  const __m256i lookup = VNNI ? _mm256_add_epi8(values, _mm256_set1_epi8(-128)) : values;  // VNNI: v + 128, mod 256
  walk_tile_groups<TileIQ4XS, ROWS, HALVES>(unit, x, first, out, [&](const TileIQ4XS& t, int64_t g,
                                                                     __m256 (&acc)[ROWS], __m256 (&)[ROWS],
                                                                     const TileIQ4XS* ahead) {
    __m256i p[ROWS];
    for (int r = 0; r < ROWS; ++r) p[r] = _mm256_setzero_si256();
#pragma GCC unroll 1
    for (int j = 0; j < 8; ++j) {
      prefetch_part(ahead, sizeof(TileIQ4XS), j, 8);
      uint64_t packed;
      std::memcpy(&packed, t.scales[j], 8);
      const __m128i s8 = _mm_cvtsi64_si128(static_cast<int64_t>(packed));
      // row i's scale: VNNI in int32 lane i, AVX2 in int16 lanes 2i, 2i + 1
      const __m256i scales = VNNI ? _mm256_cvtepi8_epi32(s8) : _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(s8, s8));
      __m256i dot[ROWS];  // int32, row i's in lane i: VNNI's sums of (v + 128) a, AVX2's already scaled
      for (int r = 0; r < ROWS; ++r) dot[r] = _mm256_setzero_si256();
      const int8_t* a = x.q.data() + first * cols + g * 256 + 32 * j;
#pragma GCC unroll 1
      for (int v = 0; v < 4; ++v) {
        const __m256i codes = load256(t.codes[j] + 32 * v);
        const __m256i low = _mm256_shuffle_epi8(lookup, _mm256_and_si256(codes, m4));
        const __m256i high = _mm256_shuffle_epi8(lookup, _mm256_and_si256(_mm256_srli_epi16(codes, 4), m4));
        const __m256i low_size = _mm256_sign_epi8(low, low), high_size = _mm256_sign_epi8(high, high);  // AVX2's
        for (int r = 0; r < ROWS; ++r) {
          int32_t front, back;  // activation values 8v .. 8v + 3 and 8v + 4 .. 8v + 7 of the sub-block
          std::memcpy(&front, a + r * cols + 8 * v, 4);
          std::memcpy(&back, a + r * cols + 8 * v + 4, 4);
#ifdef GGUF_DPBUSD
          if constexpr (VNNI) {
            dot[r] = dpbusd(dot[r], low, _mm256_set1_epi32(front));
            dot[r] = dpbusd(dot[r], high, _mm256_set1_epi32(back));
            continue;
          }
#endif
          const __m256i signed_front = _mm256_sign_epi8(_mm256_set1_epi32(front), low);
          const __m256i signed_back = _mm256_sign_epi8(_mm256_set1_epi32(back), high);
          dot[r] = _mm256_add_epi32(dot[r], _mm256_madd_epi16(_mm256_maddubs_epi16(low_size, signed_front), scales));
          dot[r] = _mm256_add_epi32(dot[r], _mm256_madd_epi16(_mm256_maddubs_epi16(high_size, signed_back), scales));
        }
      }
      for (int r = 0; r < ROWS; ++r) {
        if constexpr (VNNI) {
          const int32_t sum = x.sums32[(first + r) * cols / 32 + g * 8 + j];
          dot[r] = scaled<VNNI>(_mm256_sub_epi32(dot[r], _mm256_set1_epi32(128 * sum)), scales);
        }
        p[r] = _mm256_add_epi32(p[r], dot[r]);
      }
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t.d)));
    for (int r = 0; r < ROWS; ++r) {
      const __m256 da = _mm256_broadcast_ss(x.scale.data() + (first + r) * (cols / 256) + g);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p[r]), _mm256_mul_ps(da, d), acc[r]);
    }
  });
}

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
#ifdef GGUF_DPBUSD
        if constexpr (VNNI) {
          p[r] = dpbusd(p[r], codes, a);
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
  const __m256i values = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kIq4Values)));
  const __m256i table = VNNI ? _mm256_add_epi8(values, _mm256_set1_epi8(-128)) : values;  // IQ4_NL's
  __m256 acc[HALVES][ROWS];
  for (int h = 0; h < HALVES; ++h)
    for (int r = 0; r < ROWS; ++r) acc[h][r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    for (int h = 0; h < HALVES; ++h) {  // unrolled: each tile's accumulators stay in registers
      prefetch(tiles + HALVES * g + h + ahead, sizeof(Tile));
      const Tile& t = tiles[HALVES * g + h];
      // second: VNNI's second chain a row (one of 8 dependent products left 4 rows latency-bound); AVX2's pair sums
      // in int16 not yet widened: a vector's are at most 2 * 2 * 31 * 128, so two of Q5_0 / Q5_1's fit, four of
      // Q4_0 / Q4_1's (codes to 15)
      constexpr int widen_every = L::five ? 2 : 4;
      __m256i p[ROWS], second[ROWS];
      for (int r = 0; r < ROWS; ++r) p[r] = second[r] = _mm256_setzero_si256();
      __m256i fifth = _mm256_setzero_si256();
      if constexpr (L::five) fifth = load256(t.fifth);
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) {
        const __m256i codes = load256(t.codes[v]);
        __m256i low = _mm256_and_si256(codes, m4), high = _mm256_and_si256(_mm256_srli_epi16(codes, 4), m4);
        if constexpr (L::five) {
          low = with_fifth_bits(low, fifth, 2 * v);
          high = with_fifth_bits(high, fifth, 2 * v + 1);
        }
        if constexpr (L::table) {  // VNNI: v + 128 (the bias); AVX2: v itself, multiplied by sign below
          low = _mm256_shuffle_epi8(table, low);
          high = _mm256_shuffle_epi8(table, high);
        }
        for (int r = 0; r < ROWS; ++r) {
          int32_t front, back;  // activation values 8v .. 8v + 3 and 8v + 4 .. 8v + 7 of the group
          std::memcpy(&front, x.q.data() + (first + r) * cols + g * 32 + 8 * v, 4);
          std::memcpy(&back, x.q.data() + (first + r) * cols + g * 32 + 8 * v + 4, 4);
#ifdef GGUF_DPBUSD
          if constexpr (VNNI) {
            p[r] = dpbusd(p[r], low, _mm256_set1_epi32(front));
            second[r] = dpbusd(second[r], high, _mm256_set1_epi32(back));
            continue;
          }
#endif
          if constexpr (L::table) {  // |v| <= 127: a pair of products fits int16, two of them may not
            const __m256i low_pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(low, low),
                                                           _mm256_sign_epi8(_mm256_set1_epi32(front), low));
            const __m256i high_pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(high, high),
                                                            _mm256_sign_epi8(_mm256_set1_epi32(back), high));
            p[r] = _mm256_add_epi32(p[r], _mm256_add_epi32(_mm256_madd_epi16(low_pairs, ones),
                                                           _mm256_madd_epi16(high_pairs, ones)));
            continue;
          }
          const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(low, _mm256_set1_epi32(front)),
                                                 _mm256_maddubs_epi16(high, _mm256_set1_epi32(back)));
          second[r] = _mm256_add_epi16(second[r], pairs);
          if ((v + 1) % widen_every == 0) {
            p[r] = _mm256_add_epi32(p[r], _mm256_madd_epi16(second[r], ones));
            second[r] = _mm256_setzero_si256();
          }
        }
      }
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t.d)));
      for (int r = 0; r < ROWS; ++r) {
        const int32_t s = x.sums32[(first + r) * groups + g];
        if constexpr (VNNI) p[r] = _mm256_add_epi32(p[r], second[r]);
        if constexpr (L::bias != 0 && (VNNI || !L::table))  // AVX2 multiplies IQ4_NL's v, not v + 128
          p[r] = _mm256_sub_epi32(p[r], _mm256_set1_epi32(L::bias * s));
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

// A kernel templated on a unit's tiles (1, or 2 in a pair), called with the unit's count.
template <typename Kernel>
inline void by_halves(int64_t per_unit, Kernel kernel) {
  if (per_unit == 2) return kernel(std::integral_constant<int, 2>{});
  kernel(std::integral_constant<int, 1>{});
}

// The grid an IQ type's entries index.
template <int64_t TYPE>
inline const int8_t* iq_grid() {
  const IqGrids& grids = iq_grids();
  if constexpr (TYPE == IQ2_XXS) return grid_values(grids.iq2xxs);
  if constexpr (TYPE == IQ2_XS) return grid_values(grids.iq2xs);
  if constexpr (TYPE == IQ2_S) return grid_values(grids.iq2s);
  if constexpr (TYPE == IQ3_XXS) return grid_values(grids.iq3xxs);
  if constexpr (TYPE == IQ3_S) return grid_values(grids.iq3s);
  return grid_values(grids.iq1s);
}

// Eight words' sign bytes, four a word (byte l of word i: its bits 7 l .. 7 l + 6 with an eighth that makes their
// count even), as IQ2_XXS and IQ3_XXS keep them for 32 values a word: signs[k] for values 64 k .. 64 k + 63.
inline void even_sign_bytes(__m256i words, uint64_t (&signs)[4]) {
  const __m256i seven = _mm256_set1_epi32(127);
  __m256i bytes = _mm256_and_si256(words, seven);
  for (int l = 1; l < 4; ++l)  // the field at 7 l moved to byte l
    bytes = _mm256_or_si256(bytes, _mm256_and_si256(_mm256_slli_epi32(words, l), _mm256_slli_epi32(seven, 8 * l)));
  const __m256i parity = _mm256_setr_epi8(0, 1, 1, 0, 1, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0,
                                          0, 1, 1, 0, 1, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0);  // of a nibble
  const __m256i low = _mm256_and_si256(bytes, _mm256_set1_epi8(15));
  const __m256i high = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), _mm256_set1_epi8(15));
  const __m256i odd = _mm256_xor_si256(_mm256_shuffle_epi8(parity, low), _mm256_shuffle_epi8(parity, high));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(signs), _mm256_or_si256(bytes, _mm256_slli_epi16(odd, 7)));
}

// ---- The IQ types (IQ1_S ... IQ3_S) read from their blocks, 256 bits at a time ------------------------------------
// Where the build has no AVX-512 VNNI: each 32 values' codebook entries put together in a vector (positive bytes:
// vpmaddubsw's unsigned operand), the activations' signs flipped where the values' are, then vpmaddwd with the
// sub-blocks' scales: each weight row's lanes of P summed, then its float step (tiles.h), a tile's eight rows at once.

// 32 bytes: -1 where bit i of `bits` is set, else 1 (vpsignb's operand).
inline __m256i sign_bytes(uint32_t bits) { return _mm256_or_si256(bit_bytes(bits), _mm256_set1_epi8(1)); }

// One block's 32-value chunks: the magnitudes, their signs (vpsignb's operand: negative where a value is, positive
// elsewhere), and the two 16-value sub-blocks' S.
struct IqChunks {
  __m256i magnitudes[8];
  __m256i signs[8];
  int16_t scales[16];
  float a;
};

// A chunk's entries are loaded one at a time where their indices are bytes (IQ1's with three bits more), gathered
// where the indices take vector arithmetic (IQ2_XS's 9 of 16 bits, IQ3_S's ninth bits): on a Zen 5 the loads ran
// IQ3_XXS's step at 61 ms against the gather's 70, and the gathers IQ3_S's at 75 against the loads' 83.

// 4-byte entries (IQ3_XXS): the eight whose indices are the bytes of `indices`.
inline __m256i entries4x8(uint64_t indices, const int8_t* grid) {
  const auto entry = [&](int j) {
    int32_t value;
    std::memcpy(&value, grid + 4 * ((indices >> 8 * j) & 255), 4);
    return value;
  };
  return _mm256_setr_epi32(entry(0), entry(1), entry(2), entry(3), entry(4), entry(5), entry(6), entry(7));
}

// 4-byte entries (IQ3_S): the eight whose indices are the bytes of `indices`, plus 256 where bit j of `ninth` is set.
inline __m256i gather4x8(uint64_t indices, const int8_t* grid, uint32_t ninth) {
  __m256i index = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(indices)));
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i set = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(static_cast<int>(ninth)), bit), bit);
  index = _mm256_add_epi32(index, _mm256_and_si256(set, _mm256_set1_epi32(256)));
  return _mm256_i32gather_epi32(reinterpret_cast<const int*>(grid), index, 4);
}

// 8-byte entries (IQ1, IQ2_XXS, IQ2_S): the four whose indices are `index`.
inline __m256i entries8x4(const uint32_t (&index)[4], const int8_t* grid) {
  int64_t values[4];
  for (int j = 0; j < 4; ++j) std::memcpy(&values[j], grid + 8 * index[j], 8);
  return _mm256_setr_epi64x(values[0], values[1], values[2], values[3]);
}

// 8-byte entries (IQ2_XS): the four whose indices are `index`'s 64-bit lanes.
inline __m256i gather8x4(__m256i index, const int8_t* grid) {
  return _mm256_i64gather_epi64(reinterpret_cast<const long long*>(grid), index, 8);
}

// IQ1_S and IQ1_M: a chunk's four entries of -1, 0, 1 (11-bit indices), each value's code 8 g + delta (delta +-1, per
// 32 values in IQ1_S, per entry in IQ1_M) split into magnitude and sign.
template <int64_t TYPE>
inline void iq1_chunks(const uint8_t* b, const int8_t* grid, IqChunks& out) {
  for (int c = 0; c < 8; ++c) {
    const uint8_t* low = b + (TYPE == IQ1_S ? 2 : 0) + 4 * c;
    uint32_t high, index[4];  // high: entry j's three high index bits at field j (IQ1_S: 3 bits a field, IQ1_M: 4)
    __m256i deltas;
    if constexpr (TYPE == IQ1_S) {  // a word: 3 index bits an entry, s at 12, the delta's sign at 15
      high = word16(b + 34 + 2 * c);
      deltas = _mm256_set1_epi8(high & 0x8000 ? -1 : 1);
      out.scales[2 * c] = out.scales[2 * c + 1] = static_cast<int16_t>(2 * ((high >> 12) & 7) + 1);
    } else {  // a nibble an entry: 3 index bits, the delta's sign
      high = word16(b + 32 + 2 * c);
      const __m256i nibbles = _mm256_srlv_epi64(_mm256_set1_epi64x(high), _mm256_setr_epi64x(0, 4, 8, 12));
      const __m256i eight = _mm256_set1_epi64x(8);
      deltas = _mm256_or_si256(_mm256_cmpeq_epi64(_mm256_and_si256(nibbles, eight), eight), _mm256_set1_epi8(1));
    }
    for (int j = 0; j < 4; ++j) index[j] = low[j] | ((high >> (TYPE == IQ1_S ? 3 : 4) * j) & 7) << 8;
    const __m256i g = entries8x4(index, grid);
    const __m256i g2 = _mm256_add_epi8(g, g), g4 = _mm256_add_epi8(g2, g2);
    const __m256i codes = _mm256_add_epi8(_mm256_add_epi8(g4, g4), deltas);
    out.signs[c] = codes;
    out.magnitudes[c] = _mm256_abs_epi8(codes);
  }
  if constexpr (TYPE == IQ1_M) {  // S per 16 values: s at 3 (j % 4) of word j / 4, moved to bits 13-15 by a product
    const __m256i words = _mm256_broadcastq_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 48)));
    const __m256i own = _mm256_shuffle_epi8(words, _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3,
                                                                     4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7));
    const __m256i up = _mm256_mullo_epi16(own, _mm256_set1_epi64x(0x0010008004002000));  // 2^13, 2^10, 2^7, 2^4
    const __m256i s = _mm256_srli_epi16(up, 13);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.scales), _mm256_or_si256(_mm256_slli_epi16(s, 1), _mm256_set1_epi16(1)));
  }
  out.a = (TYPE == IQ1_S ? half(b) : iq1_m_scale(b)) / 8;
}

// Bytes 2 i and 2 i + 1: the low and high nibble of byte i of `bytes` (i < 8).
inline __m128i nibbles_in_order(__m128i bytes) {
  const __m128i mask = _mm_set1_epi8(15);
  return _mm_unpacklo_epi8(_mm_and_si128(bytes, mask), _mm_and_si128(_mm_srli_epi16(bytes, 4), mask));
}

// S = 2 s + 1 of the 16 sub-blocks from their s, a byte each: IQ2_XS's and IQ2_S's matrices ran 1.1-1.2x faster than
// through a scalar loop (IQ3_S's eight s stay scalar: so its single row ran 6% faster).
inline void store_scales(int16_t (&scales)[16], __m128i s) {
  const __m256i words = _mm256_cvtepu8_epi16(s);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(scales), _mm256_add_epi16(_mm256_add_epi16(words, words), _mm256_set1_epi16(1)));
}

template <int64_t TYPE>
inline void iq_chunks(const uint8_t* b, const int8_t* grid, IqChunks& out) {
  uint32_t signs[8];  // bit v: value 32 c + v's
  if constexpr (TYPE == IQ3_XXS || TYPE == IQ2_XXS) {  // a word per 32 values: four signs' 7 bits and s
    alignas(32) uint32_t words[8];
    for (int c = 0; c < 8; ++c) words[c] = word32(b + (TYPE == IQ3_XXS ? 66 + 4 * c : 6 + 8 * c));
    const __m256i packed = _mm256_load_si256(reinterpret_cast<const __m256i*>(words));
    uint64_t bytes[4];
    even_sign_bytes(packed, bytes);
    std::memcpy(signs, bytes, 32);
    for (int c = 0; c < 8; ++c) out.scales[2 * c] = out.scales[2 * c + 1] = static_cast<int16_t>(2 * (words[c] >> 28) + 1);
  } else if constexpr (TYPE == IQ3_S) {
    std::memcpy(signs, b + 74, 32);
    for (int c = 0; c < 8; ++c) out.scales[2 * c] = out.scales[2 * c + 1] = static_cast<int16_t>(2 * ((b[106 + c / 2] >> 4 * (c % 2)) & 15) + 1);
  } else {  // IQ2_XS, IQ2_S: S per 16 values, the nibbles of 8 bytes
    const uint8_t* nibbles = b + (TYPE == IQ2_XS ? 66 : 74);
    store_scales(out.scales, nibbles_in_order(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(nibbles))));
    if constexpr (TYPE == IQ2_S) std::memcpy(signs, b + 34, 32);
  }
  for (int c = 0; c < 8; ++c) {
    if constexpr (TYPE == IQ3_XXS) {
      uint64_t indices;
      std::memcpy(&indices, b + 2 + 8 * c, 8);
      out.magnitudes[c] = entries4x8(indices, grid);
    } else if constexpr (TYPE == IQ3_S) {
      uint64_t indices;
      std::memcpy(&indices, b + 2 + 8 * c, 8);
      out.magnitudes[c] = gather4x8(indices, grid, b[66 + c]);
    } else if constexpr (TYPE == IQ2_XXS) {
      const uint32_t bytes[4] = {b[2 + 8 * c], b[3 + 8 * c], b[4 + 8 * c], b[5 + 8 * c]};
      out.magnitudes[c] = entries8x4(bytes, grid);
    } else if constexpr (TYPE == IQ2_XS) {
      uint64_t words;
      std::memcpy(&words, b + 2 + 8 * c, 8);
      const __m256i index = _mm256_and_si256(_mm256_cvtepu16_epi64(_mm_cvtsi64_si128(static_cast<int64_t>(words))), _mm256_set1_epi64x(511));
      out.magnitudes[c] = gather8x4(index, grid);
      signs[c] = 0;
      for (int j = 0; j < 4; ++j) signs[c] |= even_signs(static_cast<uint32_t>(words >> (16 * j + 9))) << 8 * j;
    } else {  // IQ2_S: 10-bit indices, the two high bits four to a byte
      const uint32_t low = word32(b + 2 + 4 * c), high = b[66 + c];
      uint32_t index[4];
      for (int j = 0; j < 4; ++j) index[j] = ((low >> 8 * j) & 255) | ((high >> 2 * j) & 3) << 8;
      out.magnitudes[c] = entries8x4(index, grid);
    }
    out.signs[c] = sign_bytes(signs[c]);
  }
  out.a = half(b) / (TYPE == IQ3_XXS ? 4 : TYPE == IQ3_S ? 1 : 8);
}

// Group g of a weight row's IQ blocks decoded, at `block`.
template <int64_t TYPE>
inline void iq_decode_chunks(const uint8_t* block, const int8_t* grid, IqChunks& chunks) {
  if constexpr (TYPE == IQ1_S || TYPE == IQ1_M) iq1_chunks<TYPE>(block, grid, chunks);
  else iq_chunks<TYPE>(block, grid, chunks);
}

// The P lanes of a decoded block and ROWS activation rows from `first` over group g.
template <int ROWS>
inline void iq_chunk_sums(const IqChunks& chunks, const Quantized& x, int64_t first, int64_t g, __m256i (&lanes)[ROWS]) {
  for (int r = 0; r < ROWS; ++r) lanes[r] = _mm256_setzero_si256();
  for (int c = 0; c < 8; ++c) {
    const __m256i signs = chunks.signs[c];
    const __m256i scales = _mm256_setr_m128i(_mm_set1_epi16(chunks.scales[2 * c]), _mm_set1_epi16(chunks.scales[2 * c + 1]));
    for (int r = 0; r < ROWS; ++r) {
      const __m256i a = _mm256_sign_epi8(load256(x.q.data() + (first + r) * x.cols + g * 256 + 32 * c), signs);
      lanes[r] = _mm256_add_epi32(lanes[r], _mm256_madd_epi16(_mm256_maddubs_epi16(chunks.magnitudes[c], a), scales));
    }
  }
}

// Lane i: the sum of v[i]'s eight lanes.
inline __m256i lane_sums8(const __m256i (&v)[8]) {
  const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

// One group of an IQ tile's eight rows closed for ROWS activation rows: each row's P (`lanes[r][i]`, lanes of
// P) summed, then the float step of each row, acc[r] lane i for weight row i.
template <int ROWS>
inline void close_iq_tile_group(const __m256i (&lanes)[ROWS][8], const float* a, const Quantized& x, int64_t first,
                                int64_t g, __m256* acc) {
  const __m256 weight_scales = _mm256_loadu_ps(a);
  for (int r = 0; r < ROWS; ++r) {
    const __m256 da = _mm256_mul_ps(_mm256_set1_ps(x.scale[(first + r) * (x.cols / 256) + g]), weight_scales);
    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lane_sums8(lanes[r])), da, acc[r]);
  }
}

// ROWS activation rows from `first` times a unit of HALVES IQ tiles (tiles.h): out[i * x.rows + r].
template <int64_t TYPE, int ROWS, int HALVES>
void iq_tile_dots_avx2(const uint8_t* unit, const Quantized& x, int64_t first, float* out) {
  const int8_t* grid = iq_grid<TYPE>();
  walk_tile_groups<TileIQ<TYPE>, ROWS, HALVES>(unit, x, first, out, [&](const TileIQ<TYPE>& t, int64_t g,
                                                   __m256 (&acc)[ROWS], __m256 (&)[ROWS], const TileIQ<TYPE>* ahead) {
    __m256i lanes[ROWS][8];
    alignas(32) float a[8];
    for (int i = 0; i < 8; ++i) {
      prefetch_part(ahead, sizeof(TileIQ<TYPE>), i, 8);
      IqChunks chunks;
      iq_decode_chunks<TYPE>(t.blocks[i], grid, chunks);
      __m256i sums[ROWS];
      iq_chunk_sums<ROWS>(chunks, x, first, g, sums);
      for (int r = 0; r < ROWS; ++r) lanes[r][i] = sums[r];
      a[i] = chunks.a;
    }
    close_iq_tile_group<ROWS>(lanes, a, x, first, g, acc);
  });
}

// ---- An IQ tile times many activation rows: decoded once, then a GEMM -------------------------------------------
// Decoding a block costs about as much as its products with eight activation rows, so where the CPU has vpdpbusd a
// pass over many rows (a prompt) decodes a tile's 8 rows once into int8 codes laid out as a Q8_0 tile's (`TileQ8_0`:
// vector n holds values 4 n .. 4 n + 3 of the 8 rows, plus 128), with their S and A: an activation row's four
// values, broadcast, multiply all 8 rows in one vpdpbusd. The 128 sum(a) those products carry is taken back once a
// group, S times the sub-blocks' sums of a. Each row's integer P and float step are those of `iq_tile_dots_avx2`,
// so the same bits. AVX-512 VNNI decodes a pair of tiles so (`iq_pair_dots`); plain AVX2 decodes a tile into signed
// codes instead (`iq_signed_unit_dots`, below).

// Where a pass decodes its tiles once: a Zen 5 ran the 1.5B's matrices (all IQ3_S, pairs through 512 bits) at 8 / 16
// rows in 78.7 / 160.8 ms block by block and 93.0 / 124.8 decoded once.
constexpr int64_t kIqGemmFromRows = 12;
// Plain AVX2's signed codes from the ninth row, where block by block takes a second pass: the 1.5B's IQ3_S matrices
// at 9 / 10 / 11 rows in 139 / 161 / 188 ms against 216 / 298 / 234 (a Zen 5); at 5-8 rows the two were within noise.
constexpr int64_t kIqSignedGemmFromRows = 9;

// The values an IQ type's S covers.
template <int64_t TYPE>
inline constexpr int kIqScaleValues = TYPE == IQ2_XS || TYPE == IQ2_S || TYPE == IQ1_M ? 16 : 32;

#ifdef GGUF_DPBUSD
// A group of a decoded tile: its codes, S per sub-block (lane i: row i's), S of pairs of sub-blocks as the words of
// each lane (vpmaddwd's operand, with a pair of the activations' int16 sums), A.
struct IqTileGroup {
  __m256i codes[64];
  __m256i scales[16];  // per sub-block of the type's (the first 256 / kIqScaleValues)
  __m256i paired[8];   // the first 128 / kIqScaleValues
  __m256 a;
};

// 8 vectors of 8 dwords transposed: dword j of v[i] to dword i of v[j].
inline void transpose8(__m256i (&v)[8]) {
  __m256i t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(v[i], v[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(v[i], v[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {  // u[i + k], 128-bit half b: dword 4 b + k of rows i .. i + 3
    u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    v[k] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x20);
    v[4 + k] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x31);
  }
}

// Tile h of a unit of HALVES decoded, a group at a time.
template <int64_t TYPE, int HALVES>
void decode_iq_tile(const uint8_t* unit, int h, int64_t groups, IqTileGroup* out) {
  constexpr int width = kIqScaleValues<TYPE> / 16;  // 16-value sub-blocks a sub-block
  const int8_t* grid = iq_grid<TYPE>();
  const auto* tiles = reinterpret_cast<const TileIQ<TYPE>*>(unit);
  for (int64_t g = 0; g < groups; ++g) {
    prefetch(tiles + HALVES * (g + 2) + h, sizeof(TileIQ<TYPE>));
    __m256i codes[8][8];
    alignas(32) int32_t scales[16][8], paired[8][8];
    alignas(32) float a[8];
    for (int i = 0; i < 8; ++i) {
      IqChunks chunks;
      iq_decode_chunks<TYPE>(tiles[HALVES * g + h].blocks[i], grid, chunks);
      for (int c = 0; c < 8; ++c)
        codes[c][i] = _mm256_xor_si256(_mm256_sign_epi8(chunks.magnitudes[c], chunks.signs[c]), _mm256_set1_epi8(-128));
      for (int j = 0; j < 16; ++j) scales[j][i] = chunks.scales[j];
      for (int j = 0; j < 8 / width; ++j)
        paired[j][i] = static_cast<uint16_t>(chunks.scales[2 * width * j]) | chunks.scales[2 * width * j + width] << 16;
      a[i] = chunks.a;
    }
    IqTileGroup& group = out[g];
    for (int c = 0; c < 8; ++c) {
      transpose8(codes[c]);
      for (int n = 0; n < 8; ++n) group.codes[8 * c + n] = codes[c][n];
    }
    for (int j = 0; j < 16 / width; ++j) group.scales[j] = load256(scales[width * j]);
    for (int j = 0; j < 8 / width; ++j) group.paired[j] = load256(paired[j]);
    group.a = _mm256_load_ps(a);
  }
}

// ROWS activation rows from `first` times a decoded tile: out[i * x.rows + r] for its rows i.
template <int64_t TYPE, int ROWS>
void iq_decoded_tile_dots(const IqTileGroup* decoded, const Quantized& x, int64_t first, float* out) {
  constexpr int width = kIqScaleValues<TYPE>, vectors = width / 4;
  const int64_t cols = x.cols, groups = cols / 256;
  const int16_t* sums = width == 16 ? x.sums.data() : x.sums32.data();
  __m256 acc[ROWS];
  for (int r = 0; r < ROWS; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const IqTileGroup& group = decoded[g];
    __m256i p[ROWS], taken[ROWS];  // taken: S times the sub-blocks' sums of a
    for (int r = 0; r < ROWS; ++r) p[r] = taken[r] = _mm256_setzero_si256();
    for (int j = 0; j < 256 / width; ++j) {
      __m256i dot[ROWS];
      for (int r = 0; r < ROWS; ++r) dot[r] = _mm256_setzero_si256();
      for (int k = 0; k < vectors; ++k) {
        const __m256i w = group.codes[vectors * j + k];
        for (int r = 0; r < ROWS; ++r) {
          int32_t four;
          std::memcpy(&four, x.q.data() + (first + r) * cols + g * 256 + width * j + 4 * k, 4);
          dot[r] = dpbusd(dot[r], w, _mm256_set1_epi32(four));
        }
      }
      for (int r = 0; r < ROWS; ++r) p[r] = _mm256_add_epi32(p[r], _mm256_mullo_epi32(dot[r], group.scales[j]));
    }
    for (int j = 0; j < 128 / width; ++j)
      for (int r = 0; r < ROWS; ++r) {
        int32_t two;  // the sums of sub-blocks 2 j and 2 j + 1
        std::memcpy(&two, sums + ((first + r) * cols + g * 256) / width + 2 * j, 4);
        taken[r] = _mm256_add_epi32(taken[r], _mm256_madd_epi16(group.paired[j], _mm256_set1_epi32(two)));
      }
    for (int r = 0; r < ROWS; ++r) {
      const __m256i integer = _mm256_sub_epi32(p[r], _mm256_slli_epi32(taken[r], 7));
      const __m256 da = _mm256_mul_ps(_mm256_set1_ps(x.scale[(first + r) * groups + g]), group.a);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(integer), da, acc[r]);
    }
  }
  __m256 none[ROWS];
  for (int r = 0; r < ROWS; ++r) none[r] = _mm256_setzero_ps();
  store_tile_rows<ROWS>(acc, none, x, first, out);
}

// Every activation row times a unit of HALVES IQ tiles, each tile decoded once.
template <int64_t TYPE, int HALVES>
void iq_decoded_unit_dots(const uint8_t* unit, const Quantized& x, float* out) {
  thread_local std::vector<IqTileGroup> decoded;
  const int64_t groups = x.cols / 256;
  decoded.resize(groups);
  for (int h = 0; h < HALVES; ++h) {
    decode_iq_tile<TYPE, HALVES>(unit, h, groups, decoded.data());
    float* rows = out + h * kTileRows * x.rows;
    by_eights(x.rows, [&](auto n, int64_t r) { iq_decoded_tile_dots<TYPE, n()>(decoded.data(), x, r, rows); });
  }
}
#else
// Without vpdpbusd a pass over many rows decodes a tile's 8 rows once into signed codes w (|w| <= 62), each
// chunk's S as vpmaddwd's words and the rows' T = sum S * (the sum of w over S's values). An activation row's bytes,
// flipped to unsigned (a + 128: a pair's products stay within int16, 2 * 255 * 62 < 2^15), then meet every code
// row through one vpmaddubsw: the flip shared by the eight rows, where the block-by-block kernel flips the
// activations' signs for each. P = sum S (a + 128) w - 128 T is that kernel's integer and its float step the same,
// so the same bits.
struct IqSignedGroup {
  __m256i codes[8][8];   // [weight row][32-value chunk]
  __m256i scales[8][8];  // the chunk's two 16-value sub-blocks' S, as words
  __m256i offset;        // 128 T, lane i: weight row i's
  __m256 a;
};

// Tile h of a unit of HALVES decoded, a group at a time.
template <int64_t TYPE, int HALVES>
void decode_iq_tile_signed(const uint8_t* unit, int h, int64_t groups, IqSignedGroup* out) {
  const int8_t* grid = iq_grid<TYPE>();
  const auto* tiles = reinterpret_cast<const TileIQ<TYPE>*>(unit);
  const __m256i ones = _mm256_set1_epi8(1);
  for (int64_t g = 0; g < groups; ++g) {
    prefetch(tiles + HALVES * (g + 2) + h, sizeof(TileIQ<TYPE>));
    IqSignedGroup& group = out[g];
    __m256i totals[8];
    alignas(32) float a[8];
    for (int i = 0; i < 8; ++i) {
      IqChunks chunks;
      iq_decode_chunks<TYPE>(tiles[HALVES * g + h].blocks[i], grid, chunks);
      totals[i] = _mm256_setzero_si256();
      for (int c = 0; c < 8; ++c) {
        const __m256i w = _mm256_sign_epi8(chunks.magnitudes[c], chunks.signs[c]);
        const __m256i s = _mm256_setr_m128i(_mm_set1_epi16(chunks.scales[2 * c]), _mm_set1_epi16(chunks.scales[2 * c + 1]));
        group.codes[i][c] = w;
        group.scales[i][c] = s;
        totals[i] = _mm256_add_epi32(totals[i], _mm256_madd_epi16(_mm256_maddubs_epi16(ones, w), s));
      }
      a[i] = chunks.a;
    }
    group.offset = _mm256_slli_epi32(lane_sums8(totals), 7);
    group.a = _mm256_load_ps(a);
  }
}

// Every activation row times a unit of HALVES IQ tiles, each tile decoded once: group by group, each row's
// accumulators (lane i: weight row i) carried from one group to the next.
template <int64_t TYPE, int HALVES>
void iq_signed_unit_dots(const uint8_t* unit, const Quantized& x, float* out) {
  thread_local std::vector<IqSignedGroup> decoded;
  thread_local std::vector<__m256> acc;
  const int64_t groups = x.cols / 256;
  const __m256i flip = _mm256_set1_epi8(-128);
  decoded.resize(groups);
  for (int h = 0; h < HALVES; ++h) {
    decode_iq_tile_signed<TYPE, HALVES>(unit, h, groups, decoded.data());
    acc.assign(x.rows, _mm256_setzero_ps());
    for (int64_t g = 0; g < groups; ++g) {
      const IqSignedGroup& group = decoded[g];
      for (int64_t r = 0; r < x.rows; ++r) {
        const int8_t* a = x.q.data() + r * x.cols + g * 256;
        __m256i lanes[8];
        for (int i = 0; i < 8; ++i) lanes[i] = _mm256_setzero_si256();
        for (int c = 0; c < 8; ++c) {
          const __m256i u = _mm256_xor_si256(load256(a + 32 * c), flip);
          for (int i = 0; i < 8; ++i)
            lanes[i] = _mm256_add_epi32(lanes[i], _mm256_madd_epi16(_mm256_maddubs_epi16(u, group.codes[i][c]), group.scales[i][c]));
        }
        const __m256i p = _mm256_sub_epi32(lane_sums8(lanes), group.offset);
        const __m256 da = _mm256_mul_ps(_mm256_set1_ps(x.scale[r * groups + g]), group.a);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), da, acc[r]);
      }
    }
    const __m256 none[1] = {_mm256_setzero_ps()};
    for (int64_t r = 0; r < x.rows; ++r) {
      const __m256 row[1] = {acc[r]};
      store_tile_rows<1>(row, none, x, r, out + h * kTileRows * x.rows);
    }
  }
}
#endif

}  // namespace gguf
#endif  // GGUF_AVX2
