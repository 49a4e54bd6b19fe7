// bench_session_ops: the fixed costs of a switch when nothing moves, uncontended, in one
// process: acquire() + release() of a session whose memory is resident, and the device
// synchronize that release() includes. Explains the "both fit" row of bench_handoff: what
// is left there beyond these is the wake-up of a waiter that slept through the hold.
//
//   bench_session_ops [iterations=2000]
// Starts a pool server on demand (a 256 MiB pool unless VRAMSWAP_POOL_SIZE says otherwise).
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "support/bench_util.hpp"
#include "core/options.hpp"
#include "runtime/device_session.hpp"
#include "lock/process_identity.hpp"

using namespace vramswap;
using namespace vramswap::detail;
using bench::check;

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::max(1, std::atoi(argv[1])) : 2000;
  if (option_is_default(option_id::pool_size)) option_set(option_id::pool_size, "256MiB");
  if (option_is_default(option_id::pool_idle_exit)) option_set(option_id::pool_idle_exit, "5");
  std::unique_ptr<device_session> s;
  check(device_session::open(0, &s), "session");
  device_ptr p = 0;
  check(s->memory().malloc(64ull << 20, &p), "malloc");
  check(s->acquire(), "acquire");  // memory in once
  check(s->release(), "release");
  uint64_t acquire_ns = 0, release_ns = 0, sync_ns = 0;
  for (int i = 0; i < n; ++i) {
    const uint64_t t0 = monotonic_ns();
    check(s->acquire(), "acquire");
    const uint64_t t1 = monotonic_ns();
    check(s->release(), "release");
    const uint64_t t2 = monotonic_ns();
    check(s->get_backend().device_synchronize(0), "device_synchronize");
    const uint64_t t3 = monotonic_ns();
    acquire_ns += t1 - t0;
    release_ns += t2 - t1;
    sync_ns += t3 - t2;
  }
  std::printf("# bench_session_ops: %s backend, %d iterations, memory resident, no contention\n\n", s->get_backend().name(), n);
  std::printf("| acquire() | release() | of which could be device_synchronize() |\n| ---: | ---: | ---: |\n");
  std::printf("| %.1f us | %.1f us | %.1f us |\n", acquire_ns / 1e3 / n, release_ns / 1e3 / n, sync_ns / 1e3 / n);
  return 0;
}
