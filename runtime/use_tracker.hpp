// use_tracker: which pages of an oversubscribed process's arena its kernels use, observed at
// kernel launches (docs/oversubscription.md, "Placement by use").
//
// What is observed. A kernel reaches memory through the addresses in its arguments. The
// preload shim looks at the arguments of a sample of launches (one in k_sample_every per
// thread, weighted by it), and every 8-byte-aligned word of every parameter that falls
// inside a registered arena counts as one use of the page it points into. Whole parameters
// are scanned, not only pointer-typed ones: PyTorch's foreach kernels pass one struct holding
// the addresses of dozens of tensors by value. Nothing is allocated or locked on the way:
// one relaxed fetch-add per pointer found.
//
// What a use covers (attribute()). Tensors of a caching allocator are referenced by their
// starts, and a tensor spans many pages. So the count a page holds is the count of *starts*
// seen in it, and at decision time a start's count covers the block from it to the next
// page holding a start, within the same allocation (a block never runs into another
// allocation, nor into free space). A page that holds a start gets the larger of its own
// count and the block running into it. Decayed-away starts no longer bound a block.
//
// Decay: the service thread halves every count once per placement period (take_counts),
// so a count is about twice the uses of the last period, and old habits fade within a few.
//
// Thread-safety: record_*() may run on any thread at any time, also while a tracker is
// registered or unregistered (a registration table of atomics, and a reader count that
// unregistering waits for). take_counts() is for one thread (the service thread).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/backend.hpp"
#include "core/range_allocator.hpp"

namespace vramswap::detail {

class use_tracker {
 public:
  // The arena [base, base + size), pages of `page_size` (a power of two).
  use_tracker(device_ptr base, uint64_t size, uint64_t page_size);
  ~use_tracker();  // unregisters
  use_tracker(const use_tracker&) = delete;
  use_tracker& operator=(const use_tracker&) = delete;

  // Observe launches from now on: err_busy when k_max_trackers are registered already.
  int start();
  void stop() noexcept;

  // Every count, then halves it (decay). *out has one entry per page.
  void take_counts(std::vector<uint32_t>* out) noexcept;
  uint64_t page_count() const noexcept { return pages_; }
  device_ptr base() const noexcept { return base_; }
  uint64_t page_size() const noexcept { return page_size_; }

  // The uses of each page (out, per page) from the start counts (per page) and the live
  // allocations (in address order), by the rule above.
  static void attribute(const std::vector<uint32_t>& starts, const std::vector<range_allocation>& allocations, device_ptr base,
                        uint64_t page_size, std::vector<uint32_t>* out);

  // One use of the page `word` points into, `weight` times, when it is in this arena (true).
  bool record(uint64_t word, uint32_t weight) noexcept;

 private:
  const device_ptr base_;
  const uint64_t size_;
  const uint64_t page_size_;
  const unsigned shift_;
  const uint64_t pages_;
  std::unique_ptr<std::atomic<uint32_t>[]> counts_;
  int slot_ = -1;
};

// The launch path, process-wide (every registered tracker).
namespace use_tracking {

constexpr unsigned k_max_trackers = 16;
// One launch in this many (per thread) is observed; its uses count this many times.
constexpr uint32_t k_sample_every = 16;

// Whether some tracker is registered and this launch is one of the sample: one relaxed
// load while none is; a thread-local count besides while one is.
bool sample_this_launch() noexcept;
// Record the uses in a launch's parameter bytes (every 8-byte-aligned word of them, from
// `bytes`, which a parameter's alignment makes the start of its first word); returns the
// pointers found. `weight`: how many launches this one stands for.
size_t record_argument_bytes(const void* bytes, size_t size, uint32_t weight = k_sample_every) noexcept;
// The same for a launch given as its argument words (the tests' entry: a worker declares
// its uses the way the shim records a launch's).
size_t record_launch_words(const uint64_t* words, size_t count, uint32_t weight = 1) noexcept;

// Launches observed, and launches sampled whose parameters could not be read (the driver
// lacks cuFuncGetParamInfo, or does not know the function's layout).
void note_observed() noexcept;
void note_unreadable() noexcept;
uint64_t observed() noexcept;
uint64_t unreadable() noexcept;

}  // namespace use_tracking
}  // namespace vramswap::detail
