// range_allocator: the arena's sub-allocator. Carves cudaMalloc-like allocations out of one
// virtual reservation and keeps the per-page residency counts the pager needs.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

namespace vramswap::detail {

// A run of consecutive page indices [first, first + count) of one arena.
struct page_range {
  uint64_t first = 0;
  uint64_t count = 0;
  friend bool operator==(const page_range&, const page_range&) = default;
};

// One live allocation: [addr, addr + size), size already rounded up to the alignment.
struct range_allocation {
  uint64_t addr = 0;
  uint64_t size = 0;
  friend bool operator==(const range_allocation&, const range_allocation&) = default;
};

// A pure-CPU allocator of address ranges inside [base, base + size). It never touches
// memory: addresses are plain integers, so it runs (and is tested) without a GPU.
//
// Glossary: a *block* is a maximal free range; an *allocation* is a live range handed out;
// a *page* is the page_size-long slot [base + i*page_size, base + (i+1)*page_size), i the
// page index (pages are counted from base, which need not itself be page-aligned).
//
// Placement rules (what the arena promises its callers):
//   - every address and every size is a multiple of `alignment` (256 B, like cudaMalloc);
//     a request is rounded up to it;
//   - a *large* allocation (rounded size >= page_size) starts on a page boundary, so it
//     touches exactly ceil(size / page_size) pages; its tail page may be shared;
//   - a *small* allocation (rounded size < page_size) is packed next to others so that small
//     allocations share pages, and is placed so that it does not straddle a page boundary
//     whenever some free block can hold it that way.
//
// Algorithm: best fit with immediate coalescing, in the style of a classic boundary-tag
// allocator but with the tags kept outside the managed memory (which we must not touch):
//   - free_by_addr_: block address -> block size. Finds the neighbours of a freed range in
//     O(log n) so that it can be merged with them at once.
//   - free_by_size_: (size, address) of every block. lower_bound(size) is the best fit, ties
//     broken by lowest address (which packs allocations towards base and keeps the high end
//     of the reservation in one large block).
//   - live_: allocation address -> rounded size. Finds the allocation of a pointer, and
//     tells an interior pointer or a double free from a real one.
//   An allocation may need slack inside the block that holds it (a large one must start on
//   a page boundary; a small one may be moved to the next boundary to avoid straddling).
//   Every block of at least `size + max slack` is known to fit, so the search scans at most
//   kScanLimit best-fit candidates below that size and then takes lower_bound(size + max
//   slack): O(log n) per operation (n = blocks + allocations). Only when no block is that
//   large (the reservation is nearly exhausted) does the scan go on through the remaining
//   candidates, so that a fitting block is never missed; a small allocation straddles a
//   page boundary only when no block can hold it inside one page. The slack before a placed
//   allocation stays a free block (the "prefix"), the rest after it another (the "suffix").
//   Reference: Wilson, Johnstone, Neely, Boles, "Dynamic Storage Allocation: A Survey and
//   Critical Review" (1995), sections on best fit and coalescing; RMM's
//   coalescing_free_list / arena_memory_resource for the same idea on device memory.
//
// Page residency: the number of live allocations that overlap a page is what decides
// whether the page needs a frame. An allocation that covers pages [f, l] with f < l covers
// every page strictly between them completely, so nothing else can overlap those interior
// pages. We therefore keep a counter only for the end pages of each allocation
// (end_count_[p] = number of live allocations whose first or last page is p) and derive
//   live_count(p) = end_count_[p] + (1 if p is an interior page of some allocation),
// which makes allocate/deallocate O(log n) however many pages they span. The pages whose
// count goes 0 -> 1 (allocate) or 1 -> 0 (deallocate) are always one contiguous run
// (interior pages plus possibly the two end pages), reported as at most one page_range.
//
// Invariants (all verified by check_invariants()):
//   I1 blocks, reservations (below) and the allocations outside them are non-empty, aligned,
//      inside the managed range, and together tile it exactly: no overlaps, no gaps;
//   I2 no two blocks are adjacent (coalescing is complete);
//   I3 free_by_size_ holds exactly the blocks of free_by_addr_;
//   I4 large allocations outside reservations start on a page boundary;
//   I5 bytes_allocated_ and the allocation count equal the sums over live_;
//   I6 end_count_ equals a recount from live_, so live_count(p) is the true overlap count;
//   I7 no two allocations overlap; one inside a reservation lies wholly inside it.
//
// Errors: every fallible call returns 0 or a negative vramswap::detail::status and records the
// detail (see core/status.hpp); a failed call changes nothing, including when the standard
// library runs out of memory (reported as err_out_of_memory). Not thread-safe: the arena
// serializes calls.
class range_allocator {
 public:
  static constexpr uint64_t alignment = 256;

  // An empty allocator: every call fails until init() succeeds.
  range_allocator() noexcept = default;
  ~range_allocator() = default;

  // Unique owner of its bookkeeping: non-copyable; movable (the source becomes empty, as if
  // default-constructed).
  range_allocator(const range_allocator&) = delete;
  range_allocator& operator=(const range_allocator&) = delete;
  range_allocator(range_allocator&& other) noexcept;
  range_allocator& operator=(range_allocator&& other) noexcept;

  // Manage [base, base + size) with pages of page_size bytes.
  // base: a multiple of `alignment`; page_size: a power of two, >= `alignment` and <= 2^38
  // (the arena passes the frame size; tests may use small pages); size: a non-zero multiple of page_size; base + size must not
  // overflow. Returns 0, err_invalid_argument (bad parameters, or already initialized),
  // err_out_of_memory (no host memory for the page table).
  int init(uint64_t base, uint64_t size, uint64_t page_size) noexcept;

  // Allocate `size` bytes (rounded up to `alignment`) and store the address in *addr.
  // If newly_live is not null, appends at most one page_range: the pages whose live count
  // went 0 -> 1 (they now need a frame). Returns 0; err_invalid_argument (size 0, size
  // overflows when rounded, not initialized); err_out_of_memory (size larger than the
  // reservation, or no block can hold it: the detail names the request, the free bytes and
  // the largest free block). On failure nothing changes, *addr and *newly_live included.
  int allocate(uint64_t size, uint64_t* addr, std::vector<page_range>* newly_live) noexcept;

  // Free the allocation that starts at addr. If newly_dead is not null, appends at most one
  // page_range: the pages whose live count went 1 -> 0 (their frames can be given back).
  // Returns 0; err_invalid_argument (addr outside the reservation, an interior pointer of a
  // live allocation, which the detail names, or not a live allocation: never allocated or
  // already freed); err_out_of_memory (host memory exhausted). On failure nothing changes.
  int deallocate(uint64_t addr, std::vector<page_range>* newly_dead) noexcept;

  // --- reservations (the driver's virtual memory API, as a program under the shim uses it) ---
  // A reservation holds [addr, addr + size) out of the free blocks without making any page
  // live; allocate_at() then places allocations at addresses the caller chooses inside it
  // (the program's cuMemMap), each counted like any allocation, and deallocate() takes them
  // out again (their bytes stay the reservation's). Allocations inside a reservation may
  // start anywhere `alignment`-aligned, so I4 holds for the others only.
  // reserve: size a non-zero multiple of `alignment`; align 0 (a page) or a power of two of
  // at least `alignment`. err_invalid_argument, err_out_of_memory (no block holds it).
  int reserve(uint64_t size, uint64_t align, uint64_t* addr) noexcept;
  // The reservation that starts at addr, given back whole. err_invalid_argument (not one),
  // err_busy (an allocation is still inside it: the detail names it).
  int unreserve(uint64_t addr) noexcept;
  // An allocation of `size` (rounded up to `alignment`) at exactly `addr`, inside one
  // reservation and overlapping no allocation there. newly_live as allocate's.
  int allocate_at(uint64_t addr, uint64_t size, std::vector<page_range>* newly_live) noexcept;

  // The live allocation that contains addr (any byte of it, not only its start).
  // Returns 0, or err_invalid_argument (addr is in no live allocation; the detail says
  // whether it is outside the reservation or in free space). *out is unchanged on failure.
  int find(uint64_t addr, range_allocation* out) const noexcept;

  // Appends to *out the live allocations that overlap [lo, hi), in address order (the
  // pager asks which allocations share a page, to combine their advice).
  void overlapping(uint64_t lo, uint64_t hi, std::vector<range_allocation>* out) const;

  // Number of live allocations that overlap page `page`; 0 for a page past page_count().
  uint64_t page_live_count(uint64_t page) const noexcept;

  uint64_t base() const noexcept { return base_; }
  uint64_t size() const noexcept { return size_; }
  uint64_t page_size() const noexcept { return page_size_; }
  uint64_t page_count() const noexcept { return page_size_ ? size_ / page_size_ : 0; }
  uint64_t bytes_allocated() const noexcept { return bytes_allocated_; }
  // Bytes in no free block: neither allocated outside a reservation nor reserved.
  uint64_t bytes_free() const noexcept { return size_ - (bytes_allocated_ - bytes_inside_reservations_) - bytes_reserved_; }
  uint64_t bytes_reserved() const noexcept { return bytes_reserved_; }
  uint64_t reservation_count() const noexcept { return reserved_.size(); }
  uint64_t largest_free_block() const noexcept;
  uint64_t allocation_count() const noexcept { return live_.size(); }
  uint64_t free_block_count() const noexcept { return free_by_addr_.size(); }

  // Verify invariants I1-I7 by recounting everything (O(n + pages)). Returns 0, or
  // err_internal describing the first violation found (err_out_of_memory if the recount
  // itself cannot get host memory).
  int check_invariants() const noexcept;

 private:
  // How many best-fit candidates below the guaranteed-fit size a search looks at.
  static constexpr int kScanLimit = 32;

  struct placement {
    uint64_t block = 0;  // start of the free block used
    uint64_t addr = 0;   // start of the allocation inside it
  };
  bool find_placement(uint64_t size, placement* out) const noexcept;
  // allocate's checks of its arguments; *rounded: the size rounded up to the alignment.
  int check_allocate(uint64_t size, const uint64_t* addr, uint64_t* rounded) const noexcept;
  // deallocate's lookup: the live allocation that starts at `addr`, or the error naming
  // what `addr` is instead.
  int find_live_for_free(uint64_t addr, std::map<uint64_t, uint64_t>::iterator* out) noexcept;
  // Take [at, at + s) out of the free block at `block` into *into (live_ or reserved_).
  int carve(uint64_t block, uint64_t at, uint64_t s, std::map<uint64_t, uint64_t>* into) noexcept;
  // Give the range `it` of *from (live_ or reserved_) back to the free blocks, coalesced.
  int give_back(std::map<uint64_t, uint64_t>::iterator it, std::map<uint64_t, uint64_t>* from) noexcept;
  // The reservation holding `addr`, or reserved_.end().
  std::map<uint64_t, uint64_t>::const_iterator reservation_of(uint64_t addr) const noexcept;
  // Count the allocation [addr, addr + s) in (`added`) or out of end_count_, and append to
  // `changed` (when not null) the pages that became live (or dead) with it.
  void count_page_ends(uint64_t addr, uint64_t s, bool added, std::vector<page_range>* changed) noexcept;
  uint64_t page_of(uint64_t addr) const noexcept { return (addr - base_) / page_size_; }
  void reset() noexcept;

  uint64_t base_ = 0;
  uint64_t size_ = 0;
  uint64_t page_size_ = 0;
  uint64_t bytes_allocated_ = 0;           // every live allocation, inside reservations too
  uint64_t bytes_reserved_ = 0;            // every reservation, whole
  uint64_t bytes_inside_reservations_ = 0;  // the live allocations inside them
  std::map<uint64_t, uint64_t> free_by_addr_;              // block address -> size
  std::set<std::pair<uint64_t, uint64_t>> free_by_size_;   // (size, address)
  std::map<uint64_t, uint64_t> live_;                      // allocation address -> size
  std::map<uint64_t, uint64_t> reserved_;                  // reservation address -> size
  std::vector<uint32_t> end_count_;                        // per page, see above
};

}  // namespace vramswap::detail
