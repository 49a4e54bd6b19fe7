// bench_alloc_steps: the stream-ordered allocator under a training step's pattern, as
// vramswap.torch drives it: every step the same sequence of sizes (PyTorch asks for the same
// tensors each step), activations kept until the backward pass frees them in reverse,
// short-lived temporaries freed at once, and a gpu_lock hold around each step (as
// bench_models and most training loops take it) or one hold around the whole run.
//
//   bench_alloc_steps [steps=300] [pairs_per_step=3000] [hold=step|run]
//
// Prints a markdown row: ns per malloc_async + free_async pair (median and p90 of the steps),
// the allocator's own time per pair (vramswap_stats), the lock's enter and leave per step,
// and the cache hits and misses per step. The calls do nothing else, so the time is the
// allocator's and the lock's alone; a training step adds the GPU's work between them.
// Then one line for the part of a pair that is the backend's: the question whether the
// stream is being captured (cuStreamIsCapturing on cuda), asked once per allocation and once
// or twice per free, timed alone on the same stream.
// Starts a pool server on demand (a 1 GiB pool unless VRAMSWAP_POOL_SIZE says otherwise).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "support/bench_util.hpp"
#include "core/backend.hpp"
#include "core/options.hpp"
#include "lock/process_identity.hpp"
#include "vramswap/vramswap.h"
#include "vramswap/vramswap.hpp"

using namespace vramswap;
using namespace vramswap::detail;

namespace {

struct call {
  size_t size;
  bool temporary;  // freed right after it is made (an elementwise op's intermediate)
};

// One step's requests, the same every step: sizes log-uniform from 512 B to 2 MiB (most
// tensors of a model are small, a few are large), a third of them temporaries.
std::vector<call> step_pattern(long pairs) {
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> log_size(9.0, 21.0);
  std::vector<call> calls;
  calls.reserve(static_cast<size_t>(pairs));
  for (long i = 0; i < pairs; ++i) {
    const size_t size = static_cast<size_t>(std::exp2(log_size(rng)));
    calls.push_back({std::max<size_t>(size, 512), i % 3 == 0});
  }
  return calls;
}

// The capture question's cost per call, the median of 20 windows of 10,000 calls.
std::string capture_check_line(void* stream) {
  backend* be = nullptr;
  bench::check(default_backend(&be), "default_backend");
  constexpr int windows = 20, per_window = 10000;
  std::vector<double> ns;
  for (int w = 0; w < windows; ++w) {
    const uint64_t t0 = monotonic_ns();
    for (int i = 0; i < per_window; ++i) {
      bool capturing = false;
      bench::check(be->app_stream_capturing(0, reinterpret_cast<uintptr_t>(stream), &capturing), "app_stream_capturing");
    }
    ns.push_back(static_cast<double>(monotonic_ns() - t0) / per_window);
  }
  char line[256];
  std::snprintf(line, sizeof line,
                "capture check alone (%s backend): %.0f ns per call, median of %d windows (p90 %.0f); a pair asks 2-3 times",
                be->name(), bench::percentile(ns, 0.5), windows, bench::percentile(ns, 0.9));
  return line;
}

}  // namespace

int main(int argc, char** argv) {
  const long steps = argc > 1 ? std::max(2L, std::atol(argv[1])) : 300L;
  const long pairs = argc > 2 ? std::max(2L, std::atol(argv[2])) : 3000L;
  const bool hold_per_step = !(argc > 3 && std::strcmp(argv[3], "run") == 0);
  if (option_is_default(option_id::pool_size)) option_set(option_id::pool_size, "1GiB");
  if (option_is_default(option_id::pool_idle_exit)) option_set(option_id::pool_idle_exit, "5");
  void* const stream = nullptr;  // the legacy default stream, PyTorch's usual one
  const std::vector<call> pattern = step_pattern(pairs);

  std::unique_ptr<vramswap::gpu_lock> whole_run;
  if (!hold_per_step) whole_run = std::make_unique<vramswap::gpu_lock>(0);
  std::vector<void*> kept;
  kept.reserve(pattern.size());
  std::vector<double> pair_ns, lock_us;
  vramswap_stats_t before{}, after{};
  before.size = after.size = sizeof(vramswap_stats_t);
  const long warmup = std::min(20L, steps / 2);
  for (long s = 0; s < steps; ++s) {
    if (s == warmup) bench::check(vramswap_stats(0, &before), "stats");
    const uint64_t t0 = monotonic_ns();
    std::unique_ptr<vramswap::gpu_lock> hold;
    if (hold_per_step) hold = std::make_unique<vramswap::gpu_lock>(0);
    const uint64_t t1 = monotonic_ns();
    // Forward: activations kept, temporaries freed at once.
    for (const call& c : pattern) {
      void* p = nullptr;
      bench::check(vramswap_malloc_async(&p, c.size, 0, stream), "malloc_async");
      if (c.temporary) {
        bench::check(vramswap_free_async(p, 0, stream), "free_async");
      } else {
        kept.push_back(p);
      }
    }
    // Backward: the activations go in reverse.
    while (!kept.empty()) {
      bench::check(vramswap_free_async(kept.back(), 0, stream), "free_async");
      kept.pop_back();
    }
    const uint64_t t2 = monotonic_ns();
    hold.reset();
    const uint64_t t3 = monotonic_ns();
    if (s >= warmup) {
      pair_ns.push_back(static_cast<double>(t2 - t1) / static_cast<double>(pattern.size()));
      lock_us.push_back(static_cast<double>((t1 - t0) + (t3 - t2)) / 1e3);
    }
  }
  bench::check(vramswap_stats(0, &after), "stats");
  whole_run.reset();
  const double measured = static_cast<double>(steps - warmup);
  const double calls = measured * static_cast<double>(pattern.size());
  std::printf("| hold | steps | pairs per step | ns per pair, median | p90 | allocator's own ns per pair | lock enter + leave per step, us "
              "| hits per step | misses per step |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  std::printf("| %s | %ld | %ld | %.0f | %.0f | %.0f | %.1f | %.0f | %.2f |\n", hold_per_step ? "per step" : "whole run", steps - warmup,
              pairs, bench::percentile(pair_ns, 0.5), bench::percentile(pair_ns, 0.9),
              (after.allocator_seconds - before.allocator_seconds) * 1e9 / calls, bench::percentile(lock_us, 0.5),
              static_cast<double>(after.cache_hits - before.cache_hits) / measured,
              static_cast<double>(after.cache_misses - before.cache_misses) / measured);
  std::printf("\n%s\n", capture_check_line(stream).c_str());
  return 0;
}
