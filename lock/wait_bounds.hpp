// What ends a thread's waits early: an interruption (a signal the caller wants to act on) and
// a deadline. An acquire waits in the lock's queue (device_lock.hpp, Interruption) and, the
// first time, on its way there: for the device's pool server to answer, start, or come back
// (pool/server_start.hpp, pool/pool_connection.hpp). Both kinds of wait ask the same
// thread-local bounds, so that Ctrl-C and an acquire's timeout end either.
//
// The caller installs the bounds (scoped_wait_interrupt, scoped_wait_deadline) around the
// call; the waits ask wait_may_go_on() at least every 50 ms and when a signal handler ran on
// the thread. With nothing installed a wait goes on until its own limit, as before.
#pragma once

#include <cstdint>
#include <limits>

namespace vramswap::detail {

// The deadline of a wait that has none (a timeout of -1: wait forever), on the clock of
// monotonic_ns(). Every acquire (one device, a gang, a rank gang) turns its timeout into a
// deadline with deadline_after, so that they agree on what a negative timeout means.
inline constexpr uint64_t k_forever = std::numeric_limits<uint64_t>::max();

// The deadline (CLOCK_MONOTONIC) of a wait of `wait_ns` from `now_ns`; a negative wait has
// none (k_forever).
constexpr uint64_t deadline_after(uint64_t now_ns, int64_t wait_ns) noexcept {
  return wait_ns < 0 ? k_forever : now_ns + static_cast<uint64_t>(wait_ns);
}

// Asked by a waiting acquire whether to give up. signal_ran: a signal handler ran on this
// thread since the previous call. Return true to stop waiting.
struct wait_interrupt {
  bool (*should_stop)(void* context, bool signal_ran) = nullptr;
  void* context = nullptr;
  // Asked instead of should_stop by the waits an acquire makes before it queues (opening the
  // device's session), which run under the runtime's own mutex: it must not block on anything
  // that a thread waiting for that mutex may hold (Python's GIL, held by a thread whose
  // allocation opens the same session). nullptr: should_stop is asked there too (it must
  // not block either, then).
  bool (*should_stop_without_blocking)(void* context, bool signal_ran) = nullptr;
};

// Install `check` for this thread's waits until the scope ends (restoring the previous).
class scoped_wait_interrupt {
 public:
  explicit scoped_wait_interrupt(wait_interrupt check) noexcept;
  ~scoped_wait_interrupt();
  scoped_wait_interrupt(const scoped_wait_interrupt&) = delete;
  scoped_wait_interrupt& operator=(const scoped_wait_interrupt&) = delete;

 private:
  wait_interrupt previous_;
};

// Installs `check` for this thread's waits and returns the one it replaces: for a scope
// kept outside this layer (the runtime's face, runtime/runtime.hpp), which restores it.
wait_interrupt install_wait_interrupt(wait_interrupt check) noexcept;

// Does this thread's installed wait_interrupt (if any) say stop? For waits outside
// device_lock::acquire that follow its Interruption rules (the gang acquire).
bool interrupted_now(bool signal_ran) noexcept;

// Until the scope ends, this thread's waits outside the lock's queue end at `deadline_ns`
// (CLOCK_MONOTONIC, monotonic_ns()), or at the deadline already installed when that one is
// sooner. An acquire with a timeout installs its own deadline around opening the device's
// session, so that the timeout bounds the whole call.
class scoped_wait_deadline {
 public:
  explicit scoped_wait_deadline(uint64_t deadline_ns) noexcept;
  ~scoped_wait_deadline();
  scoped_wait_deadline(const scoped_wait_deadline&) = delete;
  scoped_wait_deadline& operator=(const scoped_wait_deadline&) = delete;

 private:
  uint64_t previous_;
};

// For a wait loop outside the lock's queue, between its sleeps: ok to wait on;
// err_interrupted when this thread's wait_interrupt says stop (asking the check that does not
// block, where there is one); err_timeout past this thread's
// deadline. The error names what was waited for (`waiting_for`: "the pool server of device 0
// to start", say) and says what the wait leaves behind: nothing, unless the caller says more.
int wait_may_go_on(bool signal_ran, const char* waiting_for) noexcept;

// A wait loop's sleep: `ns` at most, less when this thread's deadline comes first, and at
// most 50 ms, so that a wait_interrupt that must look for itself (a signal delivered to
// another thread) is asked often enough. True when a signal handler ran on this thread.
bool sleep_in_wait(uint64_t ns) noexcept;

// The longest a wait may block in one call (a poll) before asking wait_may_go_on again, in
// milliseconds: `ms` at most, less when the deadline comes first; >= 1 while any time is left.
int wait_slice_ms(int ms) noexcept;

}  // namespace vramswap::detail
