#include "runtime/use_tracker.hpp"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "core/status.hpp"

namespace vramswap::detail {
namespace {

// The registered trackers. A launch thread counts itself in g_readers before it reads the
// slots and out after its last record(); unregistering clears the slot, then waits until no
// reader is counted, so that no thread still holds the tracker when it is destroyed. Both
// sides use sequentially consistent operations: the slot store and the reader load (and the
// reader's increment and slot load) must not pass each other.
std::atomic<use_tracker*> g_slots[use_tracking::k_max_trackers];
std::atomic<unsigned> g_registered{0};
std::atomic<uint64_t> g_readers{0};
std::mutex g_register_mutex;
std::atomic<uint64_t> g_observed{0};
std::atomic<uint64_t> g_unreadable{0};
thread_local uint32_t t_launches = 0;

unsigned log2_of(uint64_t v) {
  unsigned s = 0;
  while ((uint64_t{1} << s) < v) ++s;
  return s;
}

}  // namespace

use_tracker::use_tracker(device_ptr base, uint64_t size, uint64_t page_size)
    : base_(base),
      size_(size),
      page_size_(page_size),
      shift_(log2_of(page_size)),
      pages_(page_size != 0 ? (size + page_size - 1) / page_size : 0),
      counts_(new std::atomic<uint32_t>[pages_]) {
  for (uint64_t i = 0; i < pages_; ++i) counts_[i].store(0, std::memory_order_relaxed);
}

use_tracker::~use_tracker() { stop(); }

int use_tracker::start() {
  std::lock_guard<std::mutex> guard(g_register_mutex);
  if (slot_ >= 0) return ok;
  for (unsigned i = 0; i < use_tracking::k_max_trackers; ++i) {
    if (g_slots[i].load(std::memory_order_relaxed) != nullptr) continue;
    g_slots[i].store(this, std::memory_order_seq_cst);
    g_registered.fetch_add(1, std::memory_order_seq_cst);
    slot_ = static_cast<int>(i);
    return ok;
  }
  return fail(err_busy, "placement by use: %u arenas are observed already (one per device); this one is not",
              use_tracking::k_max_trackers);
}

void use_tracker::stop() noexcept {
  std::lock_guard<std::mutex> guard(g_register_mutex);
  if (slot_ < 0) return;
  g_slots[slot_].store(nullptr, std::memory_order_seq_cst);
  g_registered.fetch_sub(1, std::memory_order_seq_cst);
  slot_ = -1;
  while (g_readers.load(std::memory_order_seq_cst) != 0) sched_yield();
}

bool use_tracker::record(uint64_t word, uint32_t weight) noexcept {
  const uint64_t offset = word - base_;  // wraps for a word below base: then not < size_
  if (offset >= size_) return false;
  counts_[offset >> shift_].fetch_add(weight, std::memory_order_relaxed);
  return true;
}

void use_tracker::take_counts(std::vector<uint32_t>* out) noexcept {
  out->resize(pages_);
  for (uint64_t i = 0; i < pages_; ++i) {
    const uint32_t v = counts_[i].load(std::memory_order_relaxed);
    (*out)[i] = v;
    // Halve by subtracting, so that uses recorded meanwhile are never lost.
    if (v != 0) counts_[i].fetch_sub(v - v / 2, std::memory_order_relaxed);
  }
}

void use_tracker::attribute(const std::vector<uint32_t>& starts, const std::vector<range_allocation>& allocations,
                            device_ptr base, uint64_t page_size, std::vector<uint32_t>* out) {
  out->assign(starts.size(), 0);
  if (page_size == 0) return;
  for (const range_allocation& a : allocations) {
    if (a.size == 0 || a.addr < base) continue;
    const uint64_t first = (a.addr - base) / page_size;
    const uint64_t last = std::min<uint64_t>((a.addr + a.size - 1 - base) / page_size, starts.size() - 1);
    uint32_t block = 0;  // the count of the block running through this page
    for (uint64_t p = first; p <= last && p < starts.size(); ++p) {
      uint32_t here = block;
      if (starts[p] != 0) {
        here = std::max(block, starts[p]);
        block = starts[p];
      }
      (*out)[p] = std::max((*out)[p], here);
    }
  }
}

namespace use_tracking {

bool sample_this_launch() noexcept {
  if (g_registered.load(std::memory_order_relaxed) == 0) return false;
  return ++t_launches % k_sample_every == 0;
}

size_t record_argument_bytes(const void* bytes, size_t size, uint32_t weight) noexcept {
  if (bytes == nullptr || size < sizeof(uint64_t)) return 0;
  g_readers.fetch_add(1, std::memory_order_seq_cst);
  use_tracker* trackers[k_max_trackers];
  unsigned n = 0;
  for (unsigned i = 0; i < k_max_trackers; ++i) {
    if (use_tracker* t = g_slots[i].load(std::memory_order_seq_cst)) trackers[n++] = t;
  }
  size_t found = 0;
  if (n > 0) {
    const auto* p = static_cast<const unsigned char*>(bytes);
    for (size_t at = 0; at + sizeof(uint64_t) <= size; at += sizeof(uint64_t)) {
      uint64_t word = 0;
      std::memcpy(&word, p + at, sizeof word);  // the parameter's copy on the host may be unaligned
      if (word == 0) continue;
      for (unsigned t = 0; t < n; ++t) {
        if (trackers[t]->record(word, weight)) {
          ++found;
          break;
        }
      }
    }
  }
  g_readers.fetch_sub(1, std::memory_order_seq_cst);
  return found;
}

size_t record_launch_words(const uint64_t* words, size_t count, uint32_t weight) noexcept {
  return record_argument_bytes(words, count * sizeof(uint64_t), weight);
}

void note_observed() noexcept { g_observed.fetch_add(1, std::memory_order_relaxed); }
void note_unreadable() noexcept { g_unreadable.fetch_add(1, std::memory_order_relaxed); }
uint64_t observed() noexcept { return g_observed.load(std::memory_order_relaxed); }
uint64_t unreadable() noexcept { return g_unreadable.load(std::memory_order_relaxed); }

}  // namespace use_tracking
}  // namespace vramswap::detail
