#include "core/launch_gate.hpp"

#include <time.h>

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

// Yielding. A source slot is in use while its `word` is set; slots are filled once and
// never freed (a source's memory lives as long as the process), so a thread that read a
// slot a moment before it was removed still reads valid memory.
struct source_slot {
  std::atomic<const std::atomic<uint32_t>*> word{nullptr};
  yield_source source;
};
source_slot g_sources[k_max_yield_sources];
std::atomic<unsigned> g_source_end{0};  // every slot in use is below this
std::mutex g_sources_mutex;             // adding and removing
// Whether entering looks at the sources at all: a policy other than free, and a source.
std::atomic<bool> g_yielding{false};
std::atomic<yield_policy> g_policy{yield_policy::free};
std::atomic<unsigned> g_share_percent{0};
std::atomic<uint64_t> g_waits{0};
std::atomic<uint64_t> g_waited_ns{0};

uint64_t now_ns() noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);  // vDSO: no system call
  return uint64_t(ts.tv_sec) * 1'000'000'000ull + uint64_t(ts.tv_nsec);
}

void update_yielding_locked() {
  bool any = false;
  for (unsigned i = 0; i < g_source_end.load(std::memory_order_relaxed); ++i) {
    any = any || g_sources[i].word.load(std::memory_order_relaxed) != nullptr;
  }
  g_yielding.store(any && g_policy.load(std::memory_order_relaxed) != yield_policy::free, std::memory_order_release);
}

// A source whose holder claims the GPU now (and the value seen), or nullptr.
const yield_source* claiming_source(uint32_t* seen) noexcept {
  const unsigned end = g_source_end.load(std::memory_order_acquire);
  for (unsigned i = 0; i < end; ++i) {
    const std::atomic<uint32_t>* word = g_sources[i].word.load(std::memory_order_acquire);
    if (word == nullptr) continue;
    const yield_source& s = g_sources[i].source;
    const uint32_t v = word->load(std::memory_order_acquire);
    if (v != s.idle && s.claims(s.context, v)) {
      *seen = v;
      return &s;
    }
  }
  return nullptr;
}

// The slow path: some holder word is not idle.
void yield_to_holders() noexcept {
  uint64_t started = 0;
  for (;;) {
    uint32_t seen = 0;
    const yield_source* s = claiming_source(&seen);
    if (s == nullptr) break;
    const yield_policy policy = g_policy.load(std::memory_order_relaxed);
    uint64_t sleep_ns = k_yield_poll_ns;
    if (policy == yield_policy::free) break;
    const uint64_t now = now_ns();
    if (policy == yield_policy::share) {
      const uint64_t open_ns = k_share_period_ns * g_share_percent.load(std::memory_order_relaxed) / 100;
      const uint64_t phase = now % k_share_period_ns;
      if (phase < open_ns) break;  // this period's share
      sleep_ns = k_share_period_ns - phase;
    }
    if (started == 0) started = now;
    s->wait(s->context, seen, sleep_ns);
  }
  if (started != 0) {
    g_waits.fetch_add(1, std::memory_order_relaxed);
    g_waited_ns.fetch_add(now_ns() - started, std::memory_order_relaxed);
  }
}

// A load or two per registered lock while nobody holds one (plain loads on x86).
inline bool some_holder() noexcept {
  const unsigned end = g_source_end.load(std::memory_order_acquire);
  for (unsigned i = 0; i < end; ++i) {
    const std::atomic<uint32_t>* word = g_sources[i].word.load(std::memory_order_acquire);
    if (word != nullptr && word->load(std::memory_order_relaxed) != g_sources[i].source.idle) return true;
  }
  return false;
}

}  // namespace

void set_yield_policy(yield_policy policy, unsigned share_percent) noexcept {
  std::lock_guard<std::mutex> guard(g_sources_mutex);
  g_share_percent.store(share_percent > 99 ? 99 : share_percent, std::memory_order_relaxed);
  g_policy.store(policy, std::memory_order_relaxed);
  update_yielding_locked();
}

yield_policy current_yield_policy() noexcept { return g_policy.load(std::memory_order_relaxed); }

int add_yield_source(const yield_source& source) noexcept {
  if (source.word == nullptr || source.claims == nullptr || source.wait == nullptr) return -1;
  std::lock_guard<std::mutex> guard(g_sources_mutex);
  const unsigned end = g_source_end.load(std::memory_order_relaxed);
  for (unsigned i = 0; i < k_max_yield_sources; ++i) {
    // A slot once used keeps its source for threads that may still read it: reuse only a
    // slot registered with the same source (the same lock, registered again), else a new one.
    if (i < end) {
      const yield_source& old = g_sources[i].source;
      const bool same = old.word == source.word && old.claims == source.claims && old.wait == source.wait &&
                        old.context == source.context;
      if (!same) continue;
      g_sources[i].word.store(source.word, std::memory_order_release);
    } else {
      g_sources[i].source = source;
      g_sources[i].word.store(source.word, std::memory_order_release);
      g_source_end.store(i + 1, std::memory_order_release);
    }
    update_yielding_locked();
    return static_cast<int>(i);
  }
  return -1;
}

void remove_yield_source(int handle) noexcept {
  if (handle < 0 || handle >= static_cast<int>(k_max_yield_sources)) return;
  std::lock_guard<std::mutex> guard(g_sources_mutex);
  g_sources[handle].word.store(nullptr, std::memory_order_release);
  update_yielding_locked();
}

yield_totals yielded() noexcept {
  return {g_waits.load(std::memory_order_relaxed), g_waited_ns.load(std::memory_order_relaxed)};
}

void enter() noexcept {
  if (t_depth++ > 0 || t_closer) return;
  if (g_yielding.load(std::memory_order_relaxed) && some_holder()) yield_to_holders();
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
