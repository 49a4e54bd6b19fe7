#include "core/launch_gate.hpp"

#include <atomic>
#include <cstdint>
#include <mutex>

namespace vramswap::detail::launch_gate {
namespace {

// Bit 0: closed. Bits 1..: threads inside a bracketed call. One word, so that entering is a
// single compare-and-swap that sees the closed bit and counts itself in one step: a thread
// can never count itself in after the closer saw the count reach zero.
constexpr uint32_t k_closed = 1;
constexpr uint32_t k_one = 2;
std::atomic<uint32_t> g_word{0};
std::atomic<bool> g_installed{false};
std::mutex g_closers;                 // one closer at a time
thread_local unsigned t_depth = 0;    // enter() nesting on this thread
thread_local bool t_closer = false;   // this thread holds the gate closed

}  // namespace

void enter() noexcept {
  if (t_depth++ > 0 || t_closer) return;
  uint32_t w = g_word.load(std::memory_order_acquire);
  for (;;) {
    if (w & k_closed) {
      g_word.wait(w, std::memory_order_acquire);  // woken when the word changes (reopened)
      w = g_word.load(std::memory_order_acquire);
      continue;
    }
    if (g_word.compare_exchange_weak(w, w + k_one, std::memory_order_acq_rel, std::memory_order_acquire)) return;
  }
}

void leave() noexcept {
  if (--t_depth > 0 || t_closer) return;
  const uint32_t was = g_word.fetch_sub(k_one, std::memory_order_acq_rel);
  // The last thread out of a closing gate wakes the closer.
  if ((was & k_closed) && was - k_one == k_closed) g_word.notify_all();
}

void set_installed() noexcept { g_installed.store(true, std::memory_order_release); }
bool installed() noexcept { return g_installed.load(std::memory_order_acquire); }

closed::closed() noexcept {
  g_closers.lock();
  // A closer that is itself inside a bracketed call does not wait for itself.
  const uint32_t own = t_depth > 0 ? k_one : 0;
  uint32_t w = g_word.fetch_or(k_closed, std::memory_order_acq_rel) | k_closed;
  while (w != (k_closed | own)) {
    g_word.wait(w, std::memory_order_acquire);
    w = g_word.load(std::memory_order_acquire);
  }
  t_closer = true;
}

closed::~closed() {
  t_closer = false;
  g_word.fetch_and(~k_closed, std::memory_order_acq_rel);
  g_word.notify_all();
  g_closers.unlock();
}

}  // namespace vramswap::detail::launch_gate
