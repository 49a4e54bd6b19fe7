// arena: one process's virtual address range on one device, and the allocations in it.
//
// The arena reserves one large range once (VRAMSWAP_ARENA_SIZE, default ten times the
// device's memory: addresses cost nothing, and a program's VMM reservations under the shim,
// each as large as the device's memory for PyTorch's expandable segments, are carved from it) and never moves it, so every pointer it hands out stays valid for the life of
// the process, whatever happens to the memory behind it. Allocations are carved out of the
// range by range_allocator (best fit with coalescing, 256-byte aligned, page-aligned when
// at least a page); the arena adds the reservation itself and the callers' advice.
//
// Advice (advise()) is kept per byte range, inside one live allocation, and dropped with
// it. The pager asks page_advice(page): a page is `discardable` (or `read_mostly`) only if
// every live byte on it carries that advice, so one allocation's hint never changes how a
// neighbour sharing its page is treated.
//
// Not thread-safe: the pager serializes calls.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "core/backend.hpp"
#include "core/range_allocator.hpp"

namespace vramswap::detail {

enum class advice : uint8_t {
  normal = 0,       // contents preserved across swaps (the default)
  discardable = 1,  // contents need not survive eviction: restored pages are zero-filled
  read_mostly = 2,  // the caller promises not to write: the host copy is kept after restore
};
const char* advice_name(advice a) noexcept;

class arena {
 public:
  arena() = default;
  ~arena();
  arena(const arena&) = delete;
  arena& operator=(const arena&) = delete;

  // Reserve `size` bytes on `device` (a multiple of page_size) with pages of `page_size`.
  int init(backend& be, int device, uint64_t size, uint64_t page_size);

  // As range_allocator::allocate / deallocate, with device pointers; the pages whose live
  // count went 0 -> 1 / 1 -> 0 are appended to *pages. Errors name the pointer or size.
  int allocate(uint64_t size, device_ptr* out, std::vector<page_range>* newly_live);
  int deallocate(device_ptr ptr, std::vector<page_range>* newly_dead);
  // The driver's virtual memory API, as a program under the shim uses it
  // (range_allocator::reserve): a reservation of addresses with no memory behind them, and
  // memory placed at an address the caller chooses inside one (freed with deallocate()).
  int reserve(uint64_t size, uint64_t alignment, device_ptr* out);
  int unreserve(device_ptr ptr);
  int allocate_at(device_ptr ptr, uint64_t size, std::vector<page_range>* newly_live);
  // [ptr, ptr+size) must lie inside one live allocation.
  int advise(device_ptr ptr, uint64_t size, advice a);
  // The advice every live byte of `page` shares; normal if they differ or none is live.
  advice page_advice(uint64_t page) const;
  // Pages overlapping [ptr, ptr+size).
  page_range pages_of(device_ptr ptr, uint64_t size) const;

  device_ptr base() const noexcept { return base_; }
  uint64_t size() const noexcept { return alloc_.size(); }
  uint64_t page_size() const noexcept { return alloc_.page_size(); }
  uint64_t page_count() const noexcept { return alloc_.page_count(); }
  device_ptr page_address(uint64_t page) const noexcept { return base_ + page * alloc_.page_size(); }
  uint64_t page_live_count(uint64_t page) const noexcept { return alloc_.page_live_count(page); }
  const range_allocator& allocator() const noexcept { return alloc_; }
  int device() const noexcept { return device_; }

 private:
  struct advised {
    uint64_t end;
    advice what;
  };
  void clear_advice(uint64_t lo, uint64_t hi);  // drop advice on [lo, hi), splitting ranges

  backend* be_ = nullptr;
  int device_ = -1;
  device_ptr base_ = 0;
  range_allocator alloc_;
  std::map<uint64_t, advised> advice_;  // start -> (end, advice); non-overlapping, never normal
};

}  // namespace vramswap::detail
