// turn_histograms: how long a device's turns take, as three histograms of fixed buckets in
// the device's lock segment (after the waiter slots: lock/segment_layout.hpp), written by the
// processes that take turns and read by any observer (the pool server's metrics endpoint,
// `vramswap status --prometheus`), for the Prometheus histograms of docs/observability.md.
//
//   wait       acquire() called -> the lock granted. Every grant counts, a try's too; a
//              re-entry does not, nor a wait that ended without the lock (timeout, interrupt).
//   hold       the grant -> release() handing the lock on. A holder that dies holding it is
//              not counted (the repair that passes its lock on measures nothing).
//   switching  the grant -> the process's memory resident again: what a switch costs after
//              the wait, recorded by a session (runtime/device_session.cpp); a process that
//              only takes the lock (gpu_lock) moves no memory and records none.
//
// Crash safety (rule (a) of segment_layout.hpp): every word is a counter that only grows, so
// each of its values is meaningful. An observation is one relaxed fetch_add on its bucket and
// one on the sum; a process killed between the two leaves the sum one observation short,
// never a count in a wrong bucket. Nothing decides anything from these words, so the recovery
// function has nothing to recompute and no mutex guards them. The observation count is the
// sum of the buckets, added up by the reader, so it always equals the +Inf bucket. The counts
// live as long as the segment (its last user removes it): a new segment starts from zero,
// which Prometheus takes as a counter reset.
//
// The bounds are part of the segment's layout: changing them or their number changes what
// the words mean, so it bumps lock_layout::k_layout_version.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace vramswap::detail::lock_layout {

// Upper bounds (inclusive, the Prometheus "le") of every bucket but the last (+Inf), in ns:
// 100 us (an uncontended turn) up to an hour (a notebook holding the device).
inline constexpr uint64_t k_turn_bucket_le_ns[] = {
    100'000,        1'000'000,       5'000'000,       10'000'000,      25'000'000,      50'000'000,      100'000'000,
    250'000'000,    500'000'000,     1'000'000'000,   2'500'000'000,   5'000'000'000,   10'000'000'000,  30'000'000'000,
    60'000'000'000, 120'000'000'000, 300'000'000'000, 600'000'000'000, 1'800'000'000'000, 3'600'000'000'000,
};
constexpr size_t k_turn_buckets = sizeof(k_turn_bucket_le_ns) / sizeof(k_turn_bucket_le_ns[0]) + 1;  // and +Inf

// One histogram, three cache lines.
struct alignas(64) turn_histogram {
  std::atomic<uint64_t> count[k_turn_buckets];  // observations in (le[i-1], le[i]]; the last: above every bound
  std::atomic<uint64_t> sum_ns;                 // of every observation
  uint64_t reserved_[3 * 64 / 8 - k_turn_buckets - 1];

  void observe(uint64_t ns) noexcept {
    size_t i = 0;
    while (i + 1 < k_turn_buckets && ns > k_turn_bucket_le_ns[i]) ++i;
    count[i].fetch_add(1, std::memory_order_relaxed);
    sum_ns.fetch_add(ns, std::memory_order_relaxed);
  }
};
static_assert(sizeof(turn_histogram) == 3 * 64);

struct alignas(64) turn_histograms {
  turn_histogram wait;
  turn_histogram hold;
  turn_histogram switching;
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);

// A copy of one histogram's words, read one by one (hints, as every observer's reads are).
struct turn_counts {
  uint64_t count[k_turn_buckets] = {};
  uint64_t sum_ns = 0;

  uint64_t total() const noexcept {
    uint64_t n = 0;
    for (uint64_t c : count) n += c;
    return n;
  }
};

inline turn_counts read_counts(const turn_histogram& h) noexcept {
  turn_counts c;
  for (size_t i = 0; i < k_turn_buckets; ++i) c.count[i] = h.count[i].load(std::memory_order_relaxed);
  c.sum_ns = h.sum_ns.load(std::memory_order_relaxed);
  return c;
}

}  // namespace vramswap::detail::lock_layout
