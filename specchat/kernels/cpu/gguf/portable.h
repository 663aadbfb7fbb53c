// The portable kernels: scalar loops that define every path's operations, a lane at a time. What any ISA runs
// must give their bits.
#pragma once

#include "activations.h"
#include "tiles.h"

#include <cmath>

namespace gguf {

// Per row and group g: P = sum_j S[j] (u . a)_j and Q = sum_j M[j] sum(a)_j, each in 8 int32 lanes (lane l
// holds code pairs 2l, 2l + 1 of every 32 codes, and sub-blocks 2l, 2l + 1 of the group), then
//   acc += float(P) * (D[g] A[g]),  offset += float(Q) * (D[g] B[g])   lane by lane, fused multiply-adds,
// and the result is lane_sum(acc) + lane_sum(offset). Every path performs exactly these operations on
// the integer form; each tile's own are given with its layout (tiles.h).

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

// Portable, IQ4_XS tiles: out[i * x.rows + r] for the tile's rows i and activation rows r in [first, first + n).
inline void iq4_tile_dots_portable(const uint8_t* tile, const Quantized& x, int64_t first, int64_t n, int64_t stride,
                                   float* out) {
  const int64_t cols = x.cols, groups = cols / 256;
  const auto* tiles = reinterpret_cast<const TileIQ4XS*>(tile);
  for (int64_t r = first; r < first + n; ++r) {
    const int8_t* a = x.q.data() + r * cols;
    for (int i = 0; i < 8; ++i) {
      float acc = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        const TileIQ4XS& t = tiles[g * stride];
        int32_t p = 0;
        for (int j = 0; j < 8; ++j) {
          int32_t dot = 0;
          for (int v = 0; v < 32; ++v) dot += kIq4Values[iq4_tile_code(t, j, i, v)] * a[g * 256 + 32 * j + v];
          p += t.scales[j][i] * dot;
        }
        const float d = x.scale[r * groups + g], di = half(reinterpret_cast<const uint8_t*>(&t.d[i]));
        acc = std::fma(static_cast<float>(p), d * di, acc);
      }
      out[i * x.rows + r] = acc + 0.0f;
    }
  }
}

// Portable, IQ1_S ... IQ3_S tiles: out[i * x.rows + r] for the tile's rows i and activation rows r in [first,
// first + n).
template <int64_t TYPE>
void iq_tile_dots_portable(const uint8_t* tile, const Quantized& x, int64_t first, int64_t n, int64_t stride,
                           float* out) {
  const int64_t cols = x.cols, groups = cols / 256;
  const auto* tiles = reinterpret_cast<const TileIQ<TYPE>*>(tile);
  Unpacked u;
  for (int i = 0; i < 8; ++i) {
    for (int64_t r = first; r < first + n; ++r) {
      const int8_t* a = x.q.data() + r * cols;
      float acc = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        unpack_row(tiles[g * stride].blocks[i], TYPE, 256, u);
        int32_t p = 0;
        for (int v = 0; v < 256; ++v) p += u.pair_scales[v / 2] * static_cast<int8_t>(u.codes[v]) * a[g * 256 + v];
        acc = std::fma(static_cast<float>(p), x.scale[r * groups + g] * u.a[0], acc);
      }
      out[i * x.rows + r] = acc + 0.0f;
    }
  }
}

// Portable, Q6_K, Q3_K and Q2_K tiles: out[i * x.rows + r] for the tile's rows i and activation rows r in [first, first + n).
template <typename Tile>
void k16_tile_dots_portable(const uint8_t* tile, const Quantized& x, int64_t first, int64_t n, int64_t stride,
                            float* out) {
  const int64_t cols = x.cols, groups = cols / 256;
  const auto* tiles = reinterpret_cast<const Tile*>(tile);
  for (int64_t r = first; r < first + n; ++r) {
    const int8_t* a = x.q.data() + r * cols;
    const int16_t* sums = x.sums.data() + r * cols / 16;
    for (int i = 0; i < 8; ++i) {
      float acc = 0.0f, offset = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        const Tile& t = tiles[g * stride];
        int32_t p = 0, q = 0;
        for (int j = 0; j < 16; ++j) {
          int32_t dot = 0;
          for (int v = 0; v < 16; ++v) dot += k16_tile_code(t, j, i, v) * a[g * 256 + 16 * j + v];
          p += k16_scale(t, j, i) * dot;
          q += k16_min(t, j, i) * sums[g * 16 + j];
        }
        const float d = x.scale[r * groups + g], di = half(reinterpret_cast<const uint8_t*>(&t.d[i]));
        acc = std::fma(static_cast<float>(p), d * di, acc);
        offset = std::fma(static_cast<float>(q), d * k16_offset_factor(t, i), offset);
      }
      out[i * x.rows + r] = acc + offset;
    }
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

}  // namespace gguf
