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
#pragma once

namespace vramswap::detail::launch_gate {

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
