// A weight row of any block type in one integer form, into a buffer that stays in L1:
//   w[i] = A[g] * S[j] * u[i] + B[g] * M[j]
// with u[i] a small unsigned code (signed for Q8_0, Q4_0 and Q5_0), S and M integers per 16 values (j) and A, B
// floats per group g (32 values for the legacy types, 256 for the K-quants). Every path's products are defined by
// it (matmul.h); the kernels of the types that have their own read the blocks or tiles directly, with the same
// integers.
#pragma once

#include "formats.h"

#include <algorithm>
#include <vector>

namespace gguf {

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
  for (int l = 0; l < 16; ++l) {
    out[l] = q[l] & 15;
    out[l + 16] = q[l] >> 4;
  }
}

// 32 bytes of nibbles: low nibbles are values 0..31, high ones 32..63 (K-quants).
inline void nibbles_64(const uint8_t* q, uint8_t* out) {
  for (int l = 0; l < 32; ++l) {
    out[l] = q[l] & 15;
    out[l + 32] = q[l] >> 4;
  }
}

// Adds 16 to code l (of 32) where bit l of `bits` is set (Q5_0 / Q5_1's fifth bits).
inline void fifth_bits_32(uint32_t bits, uint8_t* codes) {
  for (int l = 0; l < 32; ++l) codes[l] |= ((bits >> l) & 1) << 4;
}

// Adds 16 to code l (of 32) where bit `shift` of high[l] is set (Q5_K's fifth bits).
inline void fifth_bits_k(const uint8_t* high, int shift, uint8_t* codes) {
  for (int l = 0; l < 32; ++l) codes[l] |= ((high[l] >> shift) & 1) << 4;
}

// Q6_K: 64 low-nibble bytes and 32 bytes of 2-bit pairs -> 128 codes in 0..63.
inline void six_bits_128(const uint8_t* ql, const uint8_t* qh, uint8_t* out) {
  for (int l = 0; l < 32; ++l) {
    out[l] = (ql[l] & 15) | ((qh[l] & 3) << 4);
    out[l + 32] = (ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4);
    out[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
    out[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
  }
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

// Q3_K: the sixteen 6-bit scales from the 12 packed bytes (low nibbles in bytes 0-7, top two bits in 8-11).
inline void scales_k3(const uint8_t* q, uint8_t* out) {
  for (int j = 0; j < 16; ++j) {
    const int low = (q[j % 8] >> (4 * (j / 8))) & 15, top = (q[8 + j % 4] >> (2 * (j / 4))) & 3;
    out[j] = static_cast<uint8_t>(low | top << 4);
  }
}

// Q2_K and Q3_K: 64 bytes of 2-bit codes -> 256 codes in 0..3. Value 128h + 32s + l: bits 2s, 2s + 1 of byte
// 32h + l.
inline void two_bits_256(const uint8_t* low, uint8_t* out) {
  for (int h = 0; h < 2; ++h)
    for (int s = 0; s < 4; ++s)
      for (int l = 0; l < 32; ++l) out[128 * h + 32 * s + l] = static_cast<uint8_t>((low[32 * h + l] >> (2 * s)) & 3);
}

// Q3_K: `two_bits_256` and 32 bytes of third bits -> 256 codes in 0..7; value 128h + 32s + l's third bit is bit
// 4h + s of high byte l.
inline void three_bits_256(const uint8_t* low, const uint8_t* high, uint8_t* out) {
  two_bits_256(low, out);
  for (int v = 0; v < 256; ++v) out[v] |= static_cast<uint8_t>(((high[v % 32] >> (v / 32)) & 1) << 2);
}

// IQ4_NL and IQ4_XS: the int8 value each 4-bit code stands for (llama.cpp's non-linear table).
alignas(16) inline constexpr int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                      1,    13,   25,  38,  53,  69,  89,  113};

// IQ4_XS: sub-block ib's 6-bit scale (its low 4 bits in scales_l, its top 2 in scales_h), less 32.
inline int scale_iq4_xs(const uint8_t* block, int ib) {
  const uint16_t high = static_cast<uint16_t>(block[2] | block[3] << 8);
  return (((block[4 + ib / 2] >> (4 * (ib % 2))) & 15) | (((high >> (2 * ib)) & 3) << 4)) - 32;
}

// The IQ types' codebooks, ggml's lattice grids: entry k of a grid is 8 (IQ1, IQ2) or 4 (IQ3) small integers. They are
// handed over once from gguf-py's tables (the module's `iq_grids`), the same that dequantize these types there.
// A grid's entries as 16-bit codes: field i (16 / width bits) the position of value i among the grid's distinct
// values, ascending, in `values` (IQ3's eight in nibbles, IQ2's three in 2-bit fields): 512 entries fit 16 vectors,
// looked up by permutes where gathers load every entry (avx512.h).
struct PackedGrid {
  std::vector<uint16_t> codes;  // [entries]
  int8_t values[16] = {};
};

inline PackedGrid pack_grid(const std::vector<int8_t>& grid, int width) {
  const int bits = 16 / width;
  std::vector<int8_t> distinct(grid);
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  TORCH_CHECK(distinct.size() <= (1u << bits), "a grid of ", width, "-value entries holds ", distinct.size(), " distinct values");
  PackedGrid packed;
  std::copy(distinct.begin(), distinct.end(), packed.values);
  packed.codes.assign(grid.size() / width, 0);
  for (size_t v = 0; v < grid.size(); ++v) {
    const auto position = std::lower_bound(distinct.begin(), distinct.end(), grid[v]) - distinct.begin();
    packed.codes[v / width] |= static_cast<uint16_t>(position << bits * (v % width));
  }
  return packed;
}

struct IqGrids {
  std::vector<int8_t> iq2xxs, iq2xs, iq2s, iq3xxs, iq3s, iq1s;  // [entries * width]
  PackedGrid iq2xxs_packed, iq2xs_packed, iq3xxs_packed, iq3s_packed;
};

// The values an IQ type's codebook entry holds.
template <int64_t TYPE>
inline constexpr int kIqWidth = TYPE == IQ3_XXS || TYPE == IQ3_S ? 4 : 8;
inline IqGrids& iq_grids() {
  static IqGrids grids;
  return grids;
}

// A grid's values, refused in one line where the module was not handed them.
inline const int8_t* grid_values(const std::vector<int8_t>& grid) {
  TORCH_CHECK(!grid.empty(), "the IQ types' codebooks were not handed to the CPU decoder (iq_grids)");
  return grid.data();
}

// Byte i all ones where bit i of `signs` is set, for the eight bits of a byte.
struct SignMasks {
  uint64_t masks[256];
  constexpr SignMasks() : masks() {
    for (int s = 0; s < 256; ++s)
      for (int i = 0; i < 8; ++i)
        if ((s >> i) & 1) masks[s] |= uint64_t{0xFF} << 8 * i;
  }
};
inline constexpr SignMasks kSignMasks{};

// `width` (8 or 4) grid values as signed codes, value i negated where bit i of `signs` is set: a byte's
// (v ^ 0xFF) + 1 is -v, and no byte carries into the next (the IQ2 / IQ3 grids hold no zero).
template <int WIDTH>
inline void signed_entry(const int8_t* entry, uint32_t signs, uint8_t* codes) {
  constexpr uint64_t ones = 0x0101010101010101ull;
  uint64_t values = 0;
  std::memcpy(&values, entry, WIDTH);
  const uint64_t mask = kSignMasks.masks[signs & (WIDTH == 8 ? 255 : 15)];
  const uint64_t negated = (values ^ mask) + (mask & ones);
  std::memcpy(codes, &negated, WIDTH);
}

// IQ1's 8 grid values g (-1, 0 or 1) as the codes 8 g + delta (delta 1 or -1).
inline void iq1_entry(const int8_t* entry, int delta, uint8_t* codes) {
  for (int i = 0; i < 8; ++i) codes[i] = static_cast<uint8_t>(8 * entry[i] + delta);
}

// The eight signs IQ2_XXS, IQ2_XS and IQ3_XXS keep in 7 bits: the eighth makes the count of minus signs even.
struct EvenSigns {
  uint8_t bytes[128];
  constexpr EvenSigns() : bytes() {
    for (int seven = 0; seven < 128; ++seven) {
      int count = 0;
      for (int i = 0; i < 7; ++i) count += (seven >> i) & 1;
      bytes[seven] = static_cast<uint8_t>(seven | (count & 1) << 7);
    }
  }
};
inline constexpr EvenSigns kEvenSigns{};
inline uint32_t even_signs(uint32_t seven) { return kEvenSigns.bytes[seven & 127]; }

inline uint32_t word32(const uint8_t* p) {
  uint32_t w;
  std::memcpy(&w, p, 4);
  return w;
}

inline uint16_t word16(const uint8_t* p) {
  uint16_t w;
  std::memcpy(&w, p, 2);
  return w;
}

// IQ1_M's fp16 scale d: nibble m of it is the top nibble of the block's 16-bit word 24 + m.
inline float iq1_m_scale(const uint8_t* b) {
  uint16_t d = 0;
  for (int m = 0; m < 4; ++m) d |= static_cast<uint16_t>((word16(b + 48 + 2 * m) & 0xF000) >> (12 - 4 * m));
  uint8_t bytes[2];
  std::memcpy(bytes, &d, 2);
  return half(bytes);
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
      case Q2_K:  // w = d S u - dmin M, S and M a byte's nibbles
        two_bits_256(b + 16, codes);
        for (int j = 0; j < 16; ++j) set_sub(u, sub + j, b[j] & 15, b[j] >> 4);
        u.a[k] = half(b + 80);
        u.b[k] = -half(b + 82);
        break;
      case Q3_K: {  // w = d (S - 32) (u - 4)
        three_bits_256(b + 32, b, codes);
        uint8_t scales[16];
        scales_k3(b + 96, scales);
        for (int j = 0; j < 16; ++j) set_sub(u, sub + j, scales[j] - 32, scales[j] - 32);
        const float d = half(b + 108);
        u.a[k] = d;
        u.b[k] = -4.0f * d;
        break;
      }
      case IQ4_NL:  // w = d v(u): v the table's signed value
        nibbles_32(b + 2, codes);
        for (int i = 0; i < 32; ++i) codes[i] = static_cast<uint8_t>(kIq4Values[codes[i]]);
        u.a[k] = half(b);
        u.b[k] = 0.0f;
        set_sub(u, sub, 1, 0);
        set_sub(u, sub + 1, 1, 0);
        break;
      case IQ4_XS:  // w = d S v(u): v the table's signed value, S per 32 values
        for (int ib = 0; ib < 8; ++ib) {
          nibbles_32(b + 8 + 16 * ib, codes + 32 * ib);
          for (int i = 0; i < 32; ++i) codes[32 * ib + i] = static_cast<uint8_t>(kIq4Values[codes[32 * ib + i]]);
          set_sub(u, sub + 2 * ib, scale_iq4_xs(b, ib), 0);
          set_sub(u, sub + 2 * ib + 1, scale_iq4_xs(b, ib), 0);
        }
        u.a[k] = half(b);
        u.b[k] = 0.0f;
        break;
      // The IQ types: w = A S v, v a codebook entry's value signed (IQ1: 8 g + 1 or 8 g - 1 for g + 1/8 or g - 1/8),
      // S = 2 s + 1 from a 4-bit (IQ1: 3-bit) s, A the block's d over 8 (IQ3_XXS over 4, IQ3_S d): the products
      // gguf-py forms in floats, exact in both.
      case IQ2_XXS: {  // per 32 values: four 8-value entries, then their signs' 7 bits each and s
        const int8_t* grid = grid_values(iq_grids().iq2xxs);
        for (int ib = 0; ib < 8; ++ib) {
          const uint32_t entries = word32(b + 2 + 8 * ib), signs = word32(b + 6 + 8 * ib);
          for (int l = 0; l < 4; ++l)
            signed_entry<8>(grid + 8 * ((entries >> 8 * l) & 255), even_signs(signs >> 7 * l), codes + 32 * ib + 8 * l);
          set_sub(u, sub + 2 * ib, 2 * (signs >> 28) + 1, 0);
          set_sub(u, sub + 2 * ib + 1, 2 * (signs >> 28) + 1, 0);
        }
        u.a[k] = half(b) / 8;
        u.b[k] = 0.0f;
        break;
      }
      case IQ2_XS: {  // 32 words of a 9-bit entry and 7 sign bits; s per 16 values
        const int8_t* grid = grid_values(iq_grids().iq2xs);
        for (int e = 0; e < 32; ++e) {
          const uint16_t word = word16(b + 2 + 2 * e);
          signed_entry<8>(grid + 8 * (word & 511), even_signs(word >> 9), codes + 8 * e);
        }
        for (int j = 0; j < 16; ++j) set_sub(u, sub + j, 2 * ((b[66 + j / 2] >> 4 * (j % 2)) & 15) + 1, 0);
        u.a[k] = half(b) / 8;
        u.b[k] = 0.0f;
        break;
      }
      case IQ2_S: {  // 10-bit entries (8 bits, then 2 more), a sign byte each; s per 16 values
        const int8_t* grid = grid_values(iq_grids().iq2s);
        for (int e = 0; e < 32; ++e) {
          const int64_t index = b[2 + e] | ((b[66 + e / 4] >> 2 * (e % 4)) & 3) << 8;
          signed_entry<8>(grid + 8 * index, b[34 + e], codes + 8 * e);
        }
        for (int j = 0; j < 16; ++j) set_sub(u, sub + j, 2 * ((b[74 + j / 2] >> 4 * (j % 2)) & 15) + 1, 0);
        u.a[k] = half(b) / 8;
        u.b[k] = 0.0f;
        break;
      }
      case IQ3_XXS: {  // 64 4-value entries; per 32 values a word of four signs' 7 bits and s
        const int8_t* grid = grid_values(iq_grids().iq3xxs);
        for (int ib = 0; ib < 8; ++ib) {
          const uint32_t signs = word32(b + 66 + 4 * ib);
          for (int l = 0; l < 4; ++l) {
            const uint32_t eight = even_signs(signs >> 7 * l);
            signed_entry<4>(grid + 4 * b[2 + 8 * ib + 2 * l], eight, codes + 32 * ib + 8 * l);
            signed_entry<4>(grid + 4 * b[3 + 8 * ib + 2 * l], eight >> 4, codes + 32 * ib + 8 * l + 4);
          }
          set_sub(u, sub + 2 * ib, 2 * (signs >> 28) + 1, 0);
          set_sub(u, sub + 2 * ib + 1, 2 * (signs >> 28) + 1, 0);
        }
        u.a[k] = half(b) / 4;
        u.b[k] = 0.0f;
        break;
      }
      case IQ3_S: {  // 9-bit 4-value entries (8 bits, then one more), a sign byte per 8 values; s per 32
        const int8_t* grid = grid_values(iq_grids().iq3s);
        for (int e = 0; e < 64; ++e) {
          const int64_t index = b[2 + e] | ((b[66 + e / 8] >> (e % 8)) & 1) << 8;
          signed_entry<4>(grid + 4 * index, b[74 + e / 2] >> 4 * (e % 2), codes + 4 * e);
        }
        for (int ib = 0; ib < 8; ++ib) {
          const int s = (b[106 + ib / 2] >> 4 * (ib % 2)) & 15;
          set_sub(u, sub + 2 * ib, 2 * s + 1, 0);
          set_sub(u, sub + 2 * ib + 1, 2 * s + 1, 0);
        }
        u.a[k] = half(b);
        u.b[k] = 0.0f;
        break;
      }
      case IQ1_S: {  // 11-bit entries of -1, 0, 1 (8 bits, then 3 more); per 32 values s and the delta's sign
        const int8_t* grid = grid_values(iq_grids().iq1s);
        for (int ib = 0; ib < 8; ++ib) {
          const uint16_t high = word16(b + 34 + 2 * ib);
          const int delta = high & 0x8000 ? -1 : 1;
          for (int l = 0; l < 4; ++l)
            iq1_entry(grid + 8 * (b[2 + 4 * ib + l] | ((high >> 3 * l) & 7) << 8), delta, codes + 32 * ib + 8 * l);
          set_sub(u, sub + 2 * ib, 2 * ((high >> 12) & 7) + 1, 0);
          set_sub(u, sub + 2 * ib + 1, 2 * ((high >> 12) & 7) + 1, 0);
        }
        u.a[k] = half(b) / 8;
        u.b[k] = 0.0f;
        break;
      }
      case IQ1_M: {  // as IQ1_S, a nibble per entry (3 index bits, the delta's sign), s per 16 values, d in four nibbles
        const int8_t* grid = grid_values(iq_grids().iq1s);
        for (int e = 0; e < 32; ++e) {
          const int nibble = (b[32 + e / 2] >> 4 * (e % 2)) & 15;
          iq1_entry(grid + 8 * (b[e] | (nibble & 7) << 8), nibble & 8 ? -1 : 1, codes + 8 * e);
        }
        for (int j = 0; j < 16; ++j) set_sub(u, sub + j, 2 * ((word16(b + 48 + 2 * (j / 4)) >> 3 * (j % 4)) & 7) + 1, 0);
        u.a[k] = iq1_m_scale(b) / 8;
        u.b[k] = 0.0f;
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

}  // namespace gguf
