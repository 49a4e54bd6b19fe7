#include "lock/wait_bounds.hpp"

#include <time.h>

#include <algorithm>
#include <cerrno>

#include "core/status.hpp"
#include "lock/process_identity.hpp"

namespace vramswap::detail {
namespace {

thread_local wait_interrupt t_interrupt;
thread_local uint64_t t_deadline_ns = 0;  // 0: none

// A wait_interrupt that must look for itself (Python's signal handlers run on the main thread,
// whichever thread the signal reached) is asked at least this often.
constexpr uint64_t k_longest_sleep_ns = 50'000'000;

}  // namespace

bool interrupted_now(bool signal_ran) noexcept {
  return t_interrupt.should_stop != nullptr && t_interrupt.should_stop(t_interrupt.context, signal_ran);
}

scoped_wait_interrupt::scoped_wait_interrupt(wait_interrupt check) noexcept : previous_(t_interrupt) { t_interrupt = check; }
scoped_wait_interrupt::~scoped_wait_interrupt() { t_interrupt = previous_; }

wait_interrupt install_wait_interrupt(wait_interrupt check) noexcept {
  const wait_interrupt previous = t_interrupt;
  t_interrupt = check;
  return previous;
}

scoped_wait_deadline::scoped_wait_deadline(uint64_t deadline_ns) noexcept : previous_(t_deadline_ns) {
  if (t_deadline_ns == 0 || deadline_ns < t_deadline_ns) t_deadline_ns = deadline_ns;
}
scoped_wait_deadline::~scoped_wait_deadline() { t_deadline_ns = previous_; }

int wait_may_go_on(bool signal_ran, const char* waiting_for) noexcept {
  const auto check = t_interrupt.should_stop_without_blocking != nullptr ? t_interrupt.should_stop_without_blocking
                                                                         : t_interrupt.should_stop;
  if (check != nullptr && check(t_interrupt.context, signal_ran)) {
    return fail(err_interrupted, "interrupted while waiting for %s (a signal the caller acts on); nothing is held", waiting_for);
  }
  if (t_deadline_ns != 0 && monotonic_ns() >= t_deadline_ns) {
    return fail(err_timeout, "the caller's timeout ran out while waiting for %s (the timeout bounds that wait too); nothing is held",
                waiting_for);
  }
  return ok;
}

bool sleep_in_wait(uint64_t ns) noexcept {
  ns = std::min(ns, k_longest_sleep_ns);
  if (t_deadline_ns != 0) {
    const uint64_t now = monotonic_ns();
    ns = now >= t_deadline_ns ? 0 : std::min(ns, t_deadline_ns - now);
  }
  if (ns == 0) return false;
  const timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  return ::nanosleep(&ts, nullptr) != 0 && errno == EINTR;
}

int wait_slice_ms(int ms) noexcept {
  uint64_t ns = std::min(static_cast<uint64_t>(std::max(ms, 0)) * 1'000'000, k_longest_sleep_ns);
  if (t_deadline_ns != 0) {
    const uint64_t now = monotonic_ns();
    ns = now >= t_deadline_ns ? 0 : std::min(ns, t_deadline_ns - now);
  }
  return static_cast<int>((ns + 999'999) / 1'000'000);
}

}  // namespace vramswap::detail
