// bench_alloc_calls: the cost of one malloc_async + free_async pair (the path vramswap.torch
// takes for every tensor) over many calls, in equal windows, to show that it stays flat: a
// per-call cost that grows with the number of calls made (state that accumulates on success,
// such as an error detail) shows as a rising last/first ratio.
//
//   bench_alloc_calls [pairs=1000000] [windows=10] [locked]
// `locked`: the pairs run inside one gpu_lock hold, as a training step's tensors do through
// vramswap.torch (the allocator's fast path: a free block of the same stream, no advice);
// without it they run outside the lock, where every free advises its block discardable and
// every reuse advises it normal again.
// Starts a pool server on demand (a 256 MiB pool unless VRAMSWAP_POOL_SIZE says otherwise).
// Prints a markdown table: pairs done, ns per pair in that window, the window over the first,
// and the length of the thread's error detail (vramswap_last_error) after it.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "support/bench_util.hpp"
#include "core/options.hpp"
#include "lock/process_identity.hpp"
#include "vramswap/vramswap.h"
#include "vramswap/vramswap.hpp"

using namespace vramswap;
using namespace vramswap::detail;

int main(int argc, char** argv) {
  const long pairs = argc > 1 ? std::max(1L, std::atol(argv[1])) : 1000000L;
  const long windows = argc > 2 ? std::clamp(std::atol(argv[2]), 1L, pairs) : 10L;
  const bool locked = argc > 3 && std::strcmp(argv[3], "locked") == 0;
  if (option_is_default(option_id::pool_size)) option_set(option_id::pool_size, "256MiB");
  if (option_is_default(option_id::pool_idle_exit)) option_set(option_id::pool_idle_exit, "5");
  void* const stream = nullptr;  // the legacy default stream
  // Open the session (starting a server records details on the way), then start from a
  // recorded failure, as a real program has: success must leave it as it is.
  void* p = nullptr;
  bench::check(vramswap_malloc_async(&p, 4096, 0, stream), "malloc_async");
  bench::check(vramswap_free_async(p, 0, stream), "free_async");
  if (vramswap_malloc_async(nullptr, 4096, 0, stream) == VRAMSWAP_OK) {
    std::fprintf(stderr, "benchmark: a NULL out pointer was accepted\n");
    return 1;
  }
  const size_t detail0 = std::strlen(vramswap_last_error());
  std::printf("# bench_alloc_calls: %ld malloc_async + free_async pairs of 4 KiB on one stream, %ld windows, %s the lock\n\n", pairs,
              windows, locked ? "inside" : "outside");
  std::unique_ptr<vramswap::gpu_lock> hold;
  if (locked) hold = std::make_unique<vramswap::gpu_lock>(0);
  std::printf("| pairs done | ns per pair | / first window | error detail (bytes) |\n| ---: | ---: | ---: | ---: |\n");
  const long per_window = pairs / windows;
  double first_ns = 0;
  for (long w = 0; w < windows; ++w) {
    const uint64_t t0 = monotonic_ns();
    for (long i = 0; i < per_window; ++i) {
      bench::check(vramswap_malloc_async(&p, 4096, 0, stream), "malloc_async");
      bench::check(vramswap_free_async(p, 0, stream), "free_async");
    }
    const double ns = static_cast<double>(monotonic_ns() - t0) / static_cast<double>(per_window);
    if (w == 0) first_ns = ns;
    std::printf("| %ld | %.0f | %.2f | %zu |\n", (w + 1) * per_window, ns, ns / first_ns, std::strlen(vramswap_last_error()));
  }
  std::printf("\nerror detail before: %zu bytes\n", detail0);
  return 0;
}
