// Units of a parallel loop shared out as the threads come for them, in order: a claim takes a share of what is left
// (half of it over the threads), no less than `least`, so each thread first reads a long run of weights and the last
// claims even out the threads' finish. at::parallel_for splits a loop in fixed parts, one a thread, and two cores'
// speeds differ from moment to moment: one thread waits on the other (~10% of a prefill on a Xeon). Claims of one
// unit each would interleave the threads' runs and break the memory's streams.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

struct Claims {
  int64_t total, least, threads = at::get_num_threads();
  std::atomic<int64_t> claimed{0};

  Claims(int64_t total_, int64_t least_) : total(total_), least(std::max<int64_t>(1, least_)) {}

  // The next claim [begin, end); false when every unit is claimed.
  bool next(int64_t& begin, int64_t& end) {
    begin = claimed.load(std::memory_order_relaxed);
    do {
      if (begin >= total) return false;
      end = std::min(total, begin + std::max(least, (total - begin) / (2 * threads)));
    } while (!claimed.compare_exchange_weak(begin, end, std::memory_order_relaxed));
    return true;
  }
};

// body(claims) on each of the threads (its own setup first, then its claims); on one thread where a loop is already
// running.
template <typename Body>
void claim_in_parallel(int64_t total, int64_t least, const Body& body) {
  Claims claims(total, least);
  at::parallel_for(0, claims.threads, 1, [&](int64_t, int64_t) { body(claims); });
}
