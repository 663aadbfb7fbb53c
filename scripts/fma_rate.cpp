// This CPU's 256-bit fma rate: 10 independent chains of fmas (enough to fill two pipes of 4 cycles' latency),
// on one core, then on two at once. The ceiling the AVX2 attention's multiply-adds are measured against
// (docs/benchmarks.md):
//   g++ -O2 -march=x86-64-v3 -pthread scripts/fma_rate.cpp -o /tmp/fma_rate && /tmp/fma_rate
#include <immintrin.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

// One fma of chain x, kept in its register.
#define FMA_STEP(x)                   \
  x = _mm256_fmadd_ps(x, m, c);       \
  asm volatile("" : "+x"(x));

// fmas a second on the calling thread
double rate() {
  __m256 a0 = _mm256_set1_ps(1.0f), a1 = _mm256_set1_ps(1.1f), a2 = _mm256_set1_ps(1.2f), a3 = _mm256_set1_ps(1.3f),
         a4 = _mm256_set1_ps(1.4f), a5 = _mm256_set1_ps(1.5f), a6 = _mm256_set1_ps(1.6f), a7 = _mm256_set1_ps(1.7f),
         a8 = _mm256_set1_ps(1.8f), a9 = _mm256_set1_ps(1.9f);
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  constexpr long kRounds = 300000000;
  const auto start = std::chrono::steady_clock::now();
  for (long k = 0; k < kRounds; ++k) {
    FMA_STEP(a0) FMA_STEP(a1) FMA_STEP(a2) FMA_STEP(a3) FMA_STEP(a4)
    FMA_STEP(a5) FMA_STEP(a6) FMA_STEP(a7) FMA_STEP(a8) FMA_STEP(a9)
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const __m256 sum = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                                   _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)),
                                                 _mm256_add_ps(a8, a9)));
  if (sum[0] == 12345.0f) std::printf(" ");  // the chains' results used
  return kRounds * 10 / seconds;
}

int main() {
  std::printf("1 core: %.2f G fma/s\n", rate() / 1e9);
  double rates[2];
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) threads.emplace_back([&rates, i] { rates[i] = rate(); });
  for (auto& thread : threads) thread.join();
  std::printf("2 cores: %.2f G fma/s\n", (rates[0] + rates[1]) / 1e9);
}
