// The AVX2 Q4_K tile kernel's step (`tile_dots` in specchat/kernels/cpu/gguf/avx2.h, 4 activation rows: one
// 32-byte code vector, its low and high nibbles times each row's two broadcast activation quads, summed in int16)
// with its data in L1, on one core: the kernel's step as written, the same with the activations already in
// registers (what the broadcasts cost), and the products alone. Against a forward's products per ns (the
// kernel's whole loop, scales and group ends included) it says where an AVX2 tree's time goes:
//   g++ -O2 -march=x86-64-v3 -mtune=native scripts/avx2_tile_step.cpp -o /tmp/avx2_tile_step && /tmp/avx2_tile_step
#include <immintrin.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>

alignas(64) static int8_t activations[4][256];
alignas(64) static uint8_t codes[4096];

static inline __m256i quad(const int8_t* p) {
  int32_t four;
  std::memcpy(&four, p, 4);
  return _mm256_set1_epi32(four);
}

enum Step { kAsWritten, kActivationsInRegisters, kProductsAlone };

// Seconds for `steps` steps of kind S, each 8 vpmaddubsw (256 products).
template <Step S>
__attribute__((noinline)) double run(long steps) {
  const __m256i m4 = _mm256_set1_epi8(15);
  __m256i d0 = _mm256_setzero_si256(), d1 = d0, d2 = d0, d3 = d0;
  const __m256i a0 = quad(activations[0]), a1 = quad(activations[1]), a2 = quad(activations[2]),
                a3 = quad(activations[3]);
  const auto start = std::chrono::steady_clock::now();
  for (long step = 0; step < steps; ++step) {
    const int at = (step & 127) * 32, q = (step & 31) * 8;
    const __m256i c = _mm256_load_si256(reinterpret_cast<const __m256i*>(codes + at));
    const __m256i low = _mm256_and_si256(c, m4), high = _mm256_and_si256(_mm256_srli_epi16(c, 4), m4);
    // a row's two products (low nibbles times its first quad, high times its second) added to its int16 sums
    const auto row = [&](__m256i& d, __m256i front, __m256i back) {
      d = _mm256_add_epi16(d, _mm256_maddubs_epi16(low, front));
      d = _mm256_add_epi16(d, _mm256_maddubs_epi16(high, back));
    };
    if constexpr (S == kAsWritten) {
      row(d0, quad(activations[0] + q), quad(activations[0] + q + 4));
      row(d1, quad(activations[1] + q), quad(activations[1] + q + 4));
      row(d2, quad(activations[2] + q), quad(activations[2] + q + 4));
      row(d3, quad(activations[3] + q), quad(activations[3] + q + 4));
    } else if constexpr (S == kActivationsInRegisters) {
      row(d0, a0, a1);
      row(d1, a1, a2);
      row(d2, a2, a3);
      row(d3, a3, a0);
    } else {  // kept live by xor, which any pipe runs
      d0 = _mm256_xor_si256(d0, _mm256_maddubs_epi16(low, a0));
      d1 = _mm256_xor_si256(d1, _mm256_maddubs_epi16(high, a1));
      d2 = _mm256_xor_si256(d2, _mm256_maddubs_epi16(low, a2));
      d3 = _mm256_xor_si256(d3, _mm256_maddubs_epi16(high, a3));
      d0 = _mm256_xor_si256(d0, _mm256_maddubs_epi16(low, a1));
      d1 = _mm256_xor_si256(d1, _mm256_maddubs_epi16(high, a2));
      d2 = _mm256_xor_si256(d2, _mm256_maddubs_epi16(low, a3));
      d3 = _mm256_xor_si256(d3, _mm256_maddubs_epi16(high, a0));
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  volatile int keep = _mm256_extract_epi32(_mm256_xor_si256(_mm256_xor_si256(d0, d1), _mm256_xor_si256(d2, d3)), 1);
  (void)keep;
  return seconds;
}

int main() {
  for (int i = 0; i < 256; ++i)
    for (int r = 0; r < 4; ++r) activations[r][i] = static_cast<int8_t>((i * 7 + r) & 63);
  for (int i = 0; i < 4096; ++i) codes[i] = static_cast<uint8_t>(i * 13);
  const long steps = 100000000;
  const char* names[] = {"the kernel's step", "activations in registers", "products alone"};
  const double seconds[] = {run<kAsWritten>(steps), run<kActivationsInRegisters>(steps), run<kProductsAlone>(steps)};
  for (int s = 0; s < 3; ++s)
    std::printf("%-26s %.2f ns a step, %.1f products a ns\n", names[s], seconds[s] / steps * 1e9,
                256 / (seconds[s] / steps * 1e9));
}
