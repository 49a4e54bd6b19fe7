// launch_gate: the safe point at which an oversubscribed process's pages may change frames.
//
// An oversubscribed process (VRAMSWAP_OVERSUBSCRIBE=1) runs without the device lock, its
// kernels live, while lock holders may need the pool frames its pages sit in. Moving a page
// between a device frame and a host frame means copying it: no kernel or copy of the
// process may touch it meanwhile, or a write lands in the old frame and is lost.
//
// The gate gives that guarantee. Every entry point through which the process queues device
// work (kernel launches, graph launches, copies, memsets; the preload shim wraps them all,
// see preload/) is bracketed by enter()/leave(). The process's migration thread closes the
// gate: new work waits in enter(); closing returns once no thread is inside a bracketed
// call; the thread then synchronizes the device, which drains what was queued before, and
// moves pages with no work of the process queued or running. Reopening wakes the waiters.
//
// Cost on the launch path: one compare-and-swap and one fetch-sub of a word no one else
// writes while the gate is open (no lock, no system call).
//
// Re-entry: a thread already inside the gate (or the thread that closed it) passes freely,
// so a bracketed call that calls another never waits for itself.
//
// Yielding compute (docs/oversubscription.md, "Compute"). The gate is also where a
// low-priority process gives the GPU to lock holders: with a yield policy set and a lock
// registered (add_yield_source), a thread entering the gate (not a nested entry) first
// reads each registered lock's holder word. Nobody holds: it goes on (one relaxed load per
// lock, no system call). A holder that claims the GPU holds: under `yield` the thread
// sleeps on that word until the hold ends; under `share` it goes on only during the first
// share_percent of each k_share_period_ns and sleeps through the rest. Yielding is not
// closing: a thread asleep there is not inside the gate, so a closer (the migration thread)
// neither waits for it nor is waited for by it, and closing and yielding never deadlock.
// Threads already inside a call, and work already queued on the device, go on: the gate
// stops threads only at its door.
#pragma once

#include <atomic>
#include <cstdint>

namespace vramswap::detail::launch_gate {

enum class yield_policy : uint8_t {
  free,   // launches never wait for lock holders
  yield,  // launches wait while a lock holder holds
  share,  // launches go on for share_percent of each period while a lock holder holds
};
// The period of the share policy's duty cycle.
constexpr uint64_t k_share_period_ns = 10'000'000;
// The longest a yielding thread sleeps before it looks again (and checks that the holder
// lives, through the source's wait).
constexpr uint64_t k_yield_poll_ns = 10'000'000;

// A lock this process yields to: normally the device lock of a device it runs on
// oversubscribed. Everything it points to must live as long as the process.
struct yield_source {
  const std::atomic<uint32_t>* word = nullptr;  // nobody holds while it reads `idle`
  uint32_t idle = 0;
  // Does the hold that `seen` names claim the GPU (the holder's priority)? A hint.
  bool (*claims)(void* context, uint32_t seen) = nullptr;
  // Sleep until the word no longer reads `seen`, or timeout_ns passes; may check that the
  // holder still lives (and repair the lock when it does not).
  void (*wait)(void* context, uint32_t seen, uint64_t timeout_ns) = nullptr;
  void* context = nullptr;
};
constexpr unsigned k_max_yield_sources = 16;

// The policy (share_percent: 1..99, for `share`). Takes effect at the next entry.
void set_yield_policy(yield_policy policy, unsigned share_percent = 0) noexcept;
yield_policy current_yield_policy() noexcept;
// Register a lock to yield to; returns its handle, or -1 when k_max_yield_sources are in
// use. remove_yield_source stops yielding to it (threads asleep on it look again within
// k_yield_poll_ns); the source's memory must stay valid for the process's life all the same.
int add_yield_source(const yield_source& source) noexcept;
void remove_yield_source(int handle) noexcept;

// What yielding cost this process: entries that waited for a holder at least once, and
// the time they waited (summed over threads).
struct yield_totals {
  uint64_t waits = 0;
  uint64_t waited_ns = 0;
};
yield_totals yielded() noexcept;

// Application side (the preload shim): bracket each call that queues device work.
void enter() noexcept;
void leave() noexcept;

// RAII form of enter/leave.
struct pass {
  pass() noexcept { enter(); }
  ~pass() { leave(); }
  pass(const pass&) = delete;
  pass& operator=(const pass&) = delete;
};

// Whether something brackets this process's device work (the shim says so when it loads).
// Without it the gate cannot make migration safe, and an oversubscribed session says so.
void set_installed() noexcept;
bool installed() noexcept;

// Migration side: closes the gate for the life of the object (waiting for the threads
// inside to leave), reopens it in the destructor. One closer at a time (others wait).
class closed {
 public:
  closed() noexcept;
  ~closed();
  closed(const closed&) = delete;
  closed& operator=(const closed&) = delete;
};

}  // namespace vramswap::detail::launch_gate
