// range_allocator: best fit with coalescing over an address range. The design comment on
// the class (core/range_allocator.hpp) explains the algorithm and its invariants.
//
// Exception discipline: core never throws, but std::map/std::set/std::vector may throw
// std::bad_alloc. Each mutating call therefore does everything that can allocate first
// (reserving the output vector, emplacing brand-new nodes), undoing it if a later step of
// that phase throws, and only then rearranges existing nodes with extract()/insert() of node
// handles, which never allocate. A failed call thus leaves the allocator exactly as it was.
#include "core/range_allocator.hpp"

#include <cinttypes>
#include <iterator>
#include <limits>
#include <new>

#include "core/status.hpp"

namespace vramswap::detail {
namespace {

constexpr uint64_t kMaxPageSize = uint64_t{1} << 38;  // keeps end_count_ within uint32_t

constexpr bool is_pow2(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// a + b, or UINT64_MAX when it overflows.
constexpr uint64_t sat_add(uint64_t a, uint64_t b) {
  return a > std::numeric_limits<uint64_t>::max() - b ? std::numeric_limits<uint64_t>::max()
                                                      : a + b;
}

}  // namespace

range_allocator::range_allocator(range_allocator&& other) noexcept
    : base_(other.base_),
      size_(other.size_),
      page_size_(other.page_size_),
      bytes_allocated_(other.bytes_allocated_),
      free_by_addr_(std::move(other.free_by_addr_)),
      free_by_size_(std::move(other.free_by_size_)),
      live_(std::move(other.live_)),
      end_count_(std::move(other.end_count_)) {
  other.reset();
}

range_allocator& range_allocator::operator=(range_allocator&& other) noexcept {
  if (this != &other) {
    base_ = other.base_;
    size_ = other.size_;
    page_size_ = other.page_size_;
    bytes_allocated_ = other.bytes_allocated_;
    free_by_addr_ = std::move(other.free_by_addr_);
    free_by_size_ = std::move(other.free_by_size_);
    live_ = std::move(other.live_);
    end_count_ = std::move(other.end_count_);
    other.reset();
  }
  return *this;
}

void range_allocator::reset() noexcept {
  base_ = size_ = page_size_ = bytes_allocated_ = 0;
  free_by_addr_.clear();
  free_by_size_.clear();
  live_.clear();
  end_count_.clear();
  end_count_.shrink_to_fit();
}

int range_allocator::init(uint64_t base, uint64_t size, uint64_t page_size) noexcept {
  if (size_ != 0) {
    return fail(err_invalid_argument,
                "range_allocator::init: already initialized with [0x%" PRIx64 ", 0x%" PRIx64 ")",
                base_, base_ + size_);
  }
  if (base % alignment != 0) {
    return fail(err_invalid_argument,
                "range_allocator::init: base 0x%" PRIx64 " is not a multiple of %" PRIu64, base,
                alignment);
  }
  if (!is_pow2(page_size) || page_size < alignment || page_size > kMaxPageSize) {
    return fail(err_invalid_argument,
                "range_allocator::init: page size %" PRIu64
                " is not a power of two between %" PRIu64 " and %" PRIu64,
                page_size, alignment, kMaxPageSize);
  }
  if (size == 0 || size % page_size != 0) {
    return fail(err_invalid_argument,
                "range_allocator::init: size %" PRIu64
                " is not a non-zero multiple of the page size %" PRIu64,
                size, page_size);
  }
  if (base > std::numeric_limits<uint64_t>::max() - size) {
    return fail(err_invalid_argument,
                "range_allocator::init: base 0x%" PRIx64 " + size %" PRIu64
                " overflows the address space",
                base, size);
  }
  try {
    end_count_.assign(size / page_size, 0);
    free_by_addr_.emplace(base, size);
    free_by_size_.emplace(size, base);
  } catch (const std::bad_alloc&) {
    reset();
    return fail(err_out_of_memory,
                "range_allocator::init: no host memory for the page table of %" PRIu64 " pages",
                size / page_size);
  }
  base_ = base;
  size_ = size;
  page_size_ = page_size;
  bytes_allocated_ = 0;
  return 0;
}

uint64_t range_allocator::largest_free_block() const noexcept {
  return free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
}

// Where an allocation of `size` (rounded) goes; false if nowhere. See the class comment.
bool range_allocator::find_placement(uint64_t size, placement* out) const noexcept {
  const bool large = size >= page_size_;
  // Blocks of at least `guaranteed` bytes always hold the allocation the preferred way:
  //  large: the slack to the next page boundary is at most page_size - alignment;
  //  small: if [a, a+size) straddles a boundary b then b - a <= size - alignment, and
  //         [b, b+size) fits in any block of 2*size - alignment bytes.
  const uint64_t guaranteed =
      large ? sat_add(size, page_size_ - alignment) : 2 * size - alignment;

  // Preferred placement of the allocation in block [a, a+len), or false if there is none.
  auto place = [&](uint64_t a, uint64_t len, uint64_t* at) {
    const uint64_t end = a + len;
    if (large) {
      const uint64_t p = base_ + (page_of(a) + ((a - base_) % page_size_ != 0)) * page_size_;
      if (p >= end || end - p < size) return false;
      *at = p;
      return true;
    }
    if (page_of(a) == page_of(a + size - 1)) {
      *at = a;
      return true;
    }
    const uint64_t b = base_ + (page_of(a) + 1) * page_size_;  // b < a + size <= end
    if (end - b < size) return false;
    *at = b;
    return true;
  };

  auto it = free_by_size_.lower_bound({size, 0});
  const auto first_fit = it;  // smallest block >= size: a small allocation fits, straddling
  int scanned = 0;
  for (; it != free_by_size_.end() && it->first < guaranteed && scanned < kScanLimit;
       ++it, ++scanned) {
    if (place(it->second, it->first, &out->addr)) {
      out->block = it->second;
      return true;
    }
  }
  auto sure = free_by_size_.lower_bound({guaranteed, 0});
  if (sure != free_by_size_.end()) {
    place(sure->second, sure->first, &out->addr);
    out->block = sure->second;
    return true;
  }
  // No block is large enough to be sure: finish the scan so that a fitting block is never
  // missed (only reached when the reservation is nearly exhausted).
  for (; it != free_by_size_.end(); ++it) {
    if (place(it->second, it->first, &out->addr)) {
      out->block = it->second;
      return true;
    }
  }
  if (!large && first_fit != free_by_size_.end()) {  // no way around straddling
    out->block = first_fit->second;
    out->addr = first_fit->second;
    return true;
  }
  return false;
}

int range_allocator::check_allocate(uint64_t size, const uint64_t* addr, uint64_t* rounded) const noexcept {
  if (size_ == 0) {
    return fail(err_invalid_argument, "range_allocator::allocate: allocator not initialized");
  }
  if (addr == nullptr) {
    return fail(err_invalid_argument, "range_allocator::allocate: addr is null");
  }
  if (size == 0) {
    return fail(err_invalid_argument, "range_allocator::allocate: size 0 is not allowed");
  }
  if (size > std::numeric_limits<uint64_t>::max() - (alignment - 1)) {
    return fail(err_invalid_argument,
                "range_allocator::allocate: size %" PRIu64
                " overflows when rounded up to a multiple of %" PRIu64,
                size, alignment);
  }
  const uint64_t s = (size + alignment - 1) / alignment * alignment;
  if (s > size_) {
    return fail(err_out_of_memory,
                "range_allocator::allocate: %" PRIu64 " bytes requested, more than the whole "
                "reservation of %" PRIu64 " bytes (%" PRIu64 " free, largest free block %" PRIu64 ")",
                size, size_, bytes_free(), largest_free_block());
  }
  *rounded = s;
  return 0;
}

int range_allocator::allocate(uint64_t size, uint64_t* addr,
                              std::vector<page_range>* newly_live) noexcept {
  uint64_t s = 0;
  VS_TRY(check_allocate(size, addr, &s));
  placement pl;
  if (!find_placement(s, &pl)) {
    return fail(err_out_of_memory,
                "range_allocator::allocate: no free block fits %" PRIu64 " bytes (rounded to %" PRIu64
                "%s): %" PRIu64 " bytes free, largest free block %" PRIu64 " bytes",
                size, s, s >= page_size_ ? ", page-aligned" : "", bytes_free(),
                largest_free_block());
  }
  auto bit = free_by_addr_.find(pl.block);
  const uint64_t a = bit->first, len = bit->second;
  const uint64_t prefix = pl.addr - a;
  const uint64_t suffix_addr = pl.addr + s, suffix = a + len - suffix_addr;

  // Phase 1: everything that may allocate, undone if a later part of it throws.
  auto lit = live_.end();
  auto sit = free_by_addr_.end();
  try {
    if (newly_live != nullptr) newly_live->reserve(newly_live->size() + 1);
    lit = live_.emplace(pl.addr, s).first;
    if (prefix != 0 && suffix != 0) {  // two blocks remain: the suffix needs new nodes
      sit = free_by_addr_.emplace(suffix_addr, suffix).first;
      free_by_size_.emplace(suffix, suffix_addr);
    }
  } catch (const std::bad_alloc&) {
    if (sit != free_by_addr_.end()) free_by_addr_.erase(sit);
    if (lit != live_.end()) live_.erase(lit);
    return fail(err_out_of_memory,
                "range_allocator::allocate: host memory exhausted while allocating %" PRIu64
                " bytes",
                size);
  }

  // Phase 2: reuse the block's nodes for what remains of it; nothing here allocates.
  auto snode = free_by_size_.extract({len, a});
  if (prefix != 0) {
    bit->second = prefix;
    snode.value() = {prefix, a};
    free_by_size_.insert(std::move(snode));
  } else if (suffix != 0) {
    auto anode = free_by_addr_.extract(bit);
    anode.key() = suffix_addr;
    anode.mapped() = suffix;
    free_by_addr_.insert(std::move(anode));
    snode.value() = {suffix, suffix_addr};
    free_by_size_.insert(std::move(snode));
  } else {
    free_by_addr_.erase(bit);
  }
  bytes_allocated_ += s;

  count_page_ends(pl.addr, s, /*added=*/true, newly_live);
  *addr = pl.addr;
  return 0;
}

int range_allocator::find_live_for_free(uint64_t addr, std::map<uint64_t, uint64_t>::iterator* out) noexcept {
  if (size_ == 0) {
    return fail(err_invalid_argument, "range_allocator::deallocate: allocator not initialized");
  }
  if (addr < base_ || addr - base_ >= size_) {
    return fail(err_invalid_argument,
                "range_allocator::deallocate: 0x%" PRIx64 " is outside the arena [0x%" PRIx64
                ", 0x%" PRIx64 ")",
                addr, base_, base_ + size_);
  }
  auto lit = live_.upper_bound(addr);
  if (lit != live_.begin()) --lit;
  if (lit == live_.end() || lit->first > addr || addr - lit->first >= lit->second) {
    return fail(err_invalid_argument,
                "range_allocator::deallocate: 0x%" PRIx64
                " is not a live allocation (never allocated, or already freed)",
                addr);
  }
  if (lit->first != addr) {
    return fail(err_invalid_argument,
                "range_allocator::deallocate: 0x%" PRIx64
                " is an interior pointer, %" PRIu64 " bytes into the allocation at 0x%" PRIx64
                " of %" PRIu64 " bytes; free that address instead",
                addr, addr - lit->first, lit->first, lit->second);
  }
  *out = lit;
  return 0;
}

int range_allocator::deallocate(uint64_t addr, std::vector<page_range>* newly_dead) noexcept {
  auto lit = live_.end();
  VS_TRY(find_live_for_free(addr, &lit));
  const uint64_t s = lit->second;

  auto next = free_by_addr_.lower_bound(addr);
  auto prev = next == free_by_addr_.begin() ? free_by_addr_.end() : std::prev(next);
  const bool merge_prev = prev != free_by_addr_.end() && prev->first + prev->second == addr;
  const bool merge_next = next != free_by_addr_.end() && next->first == addr + s;

  // Phase 1: what may allocate. Only a block with no free neighbour needs a new node.
  try {
    if (newly_dead != nullptr) newly_dead->reserve(newly_dead->size() + 1);
    if (!merge_prev && !merge_next) free_by_size_.emplace(s, addr);
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory,
                "range_allocator::deallocate: host memory exhausted while freeing 0x%" PRIx64,
                addr);
  }

  // Phase 2: coalesce by moving nodes; nothing here allocates.
  if (merge_prev) {
    uint64_t merged = prev->second + s;
    if (merge_next) {
      merged += next->second;
      free_by_size_.erase({next->second, next->first});
      free_by_addr_.erase(next);
    }
    auto snode = free_by_size_.extract({prev->second, prev->first});
    snode.value().first = merged;
    free_by_size_.insert(std::move(snode));
    prev->second = merged;
    live_.erase(lit);
  } else if (merge_next) {
    const uint64_t merged = s + next->second;
    auto snode = free_by_size_.extract({next->second, next->first});
    snode.value() = {merged, addr};
    free_by_size_.insert(std::move(snode));
    auto anode = free_by_addr_.extract(next);
    anode.key() = addr;
    anode.mapped() = merged;
    free_by_addr_.insert(std::move(anode));
    live_.erase(lit);
  } else {
    free_by_addr_.insert(live_.extract(lit));  // same node type: the entry changes maps
  }
  bytes_allocated_ -= s;

  count_page_ends(addr, s, /*added=*/false, newly_dead);
  return 0;
}

void range_allocator::count_page_ends(uint64_t addr, uint64_t s, bool added, std::vector<page_range>* changed) noexcept {
  // Interior pages were free and are now covered (or the other way round); end pages may
  // be shared with other allocations.
  const uint64_t f = page_of(addr), l = page_of(addr + s - 1);
  const bool f_changed = added ? end_count_[f]++ == 0 : --end_count_[f] == 0;
  const bool l_changed = l != f && (added ? end_count_[l]++ == 0 : --end_count_[l] == 0);
  if (changed != nullptr) {
    if (l == f) {
      if (f_changed) changed->push_back({f, 1});
    } else {
      const uint64_t lo = f_changed ? f : f + 1;
      const uint64_t hi = l_changed ? l : l - 1;
      if (lo <= hi) changed->push_back({lo, hi - lo + 1});
    }
  }
}

int range_allocator::find(uint64_t addr, range_allocation* out) const noexcept {
  if (size_ == 0 || addr < base_ || addr - base_ >= size_) {
    return fail(err_invalid_argument,
                "range_allocator::find: 0x%" PRIx64 " is outside the arena [0x%" PRIx64
                ", 0x%" PRIx64 ")",
                addr, base_, base_ + size_);
  }
  auto lit = live_.upper_bound(addr);
  if (lit == live_.begin() || addr - std::prev(lit)->first >= std::prev(lit)->second) {
    return fail(err_invalid_argument,
                "range_allocator::find: 0x%" PRIx64 " is in free space of the arena, not in a "
                "live allocation",
                addr);
  }
  --lit;
  if (out != nullptr) *out = {lit->first, lit->second};
  return 0;
}

void range_allocator::overlapping(uint64_t lo, uint64_t hi, std::vector<range_allocation>* out) const {
  auto it = live_.upper_bound(lo);
  if (it != live_.begin() && std::prev(it)->first + std::prev(it)->second > lo) --it;
  for (; it != live_.end() && it->first < hi; ++it) out->push_back({it->first, it->second});
}

uint64_t range_allocator::page_live_count(uint64_t page) const noexcept {
  if (page >= end_count_.size()) return 0;
  if (end_count_[page] != 0) return end_count_[page];  // then no allocation covers it whole
  const uint64_t start = base_ + page * page_size_;
  auto lit = live_.upper_bound(start);
  if (lit == live_.begin()) return 0;
  --lit;
  return page_of(lit->first) < page && page_of(lit->first + lit->second - 1) > page ? 1 : 0;
}

// Long on purpose: the invariants I1..I6, checked in turn, read best as one list.
int range_allocator::check_invariants() const noexcept {
  const char* const who = "range_allocator::check_invariants";
  if (size_ == 0) {
    if (!free_by_addr_.empty() || !free_by_size_.empty() || !live_.empty() ||
        !end_count_.empty() || bytes_allocated_ != 0) {
      return fail(err_internal, "%s: uninitialized allocator holds state", who);
    }
    return 0;
  }
  const uint64_t end = base_ + size_;
  // I3: the two indexes of the free blocks agree.
  if (free_by_size_.size() != free_by_addr_.size()) {
    return fail(err_internal, "%s: %zu blocks by address but %zu by size", who,
                free_by_addr_.size(), free_by_size_.size());
  }
  for (const auto& [a, len] : free_by_addr_) {
    if (free_by_size_.count({len, a}) != 1) {
      return fail(err_internal,
                  "%s: block 0x%" PRIx64 " (%" PRIu64 " bytes) missing from the size index", who,
                  a, len);
    }
  }
  // I1, I2, I4, I5: walk blocks and allocations together in address order; they must tile
  // [base, end) exactly, with no two blocks adjacent.
  auto fit = free_by_addr_.begin();
  auto lit = live_.begin();
  uint64_t cursor = base_, sum_live = 0;
  bool last_was_free = false;
  while (fit != free_by_addr_.end() || lit != live_.end()) {
    const bool is_free = lit == live_.end() || (fit != free_by_addr_.end() && fit->first < lit->first);
    const uint64_t a = is_free ? fit->first : lit->first;
    const uint64_t len = is_free ? fit->second : lit->second;
    const char* what = is_free ? "free block" : "allocation";
    if (a != cursor) {
      return fail(err_internal,
                  "%s: %s at 0x%" PRIx64 " but the previous range ends at 0x%" PRIx64 " (%s)", who,
                  what, a, cursor, a < cursor ? "overlap" : "gap");
    }
    if (len == 0 || len % alignment != 0 || a % alignment != 0 || len > end - a) {
      return fail(err_internal,
                  "%s: %s at 0x%" PRIx64 " of %" PRIu64 " bytes is empty, misaligned or "
                  "past the end 0x%" PRIx64,
                  who, what, a, len, end);
    }
    if (is_free) {
      if (last_was_free) {
        return fail(err_internal, "%s: free block at 0x%" PRIx64 " follows another: not coalesced",
                    who, a);
      }
      ++fit;
    } else {
      if (len >= page_size_ && (a - base_) % page_size_ != 0) {
        return fail(err_internal,
                    "%s: allocation at 0x%" PRIx64 " of %" PRIu64
                    " bytes is not on a page boundary",
                    who, a, len);
      }
      sum_live += len;
      ++lit;
    }
    last_was_free = is_free;
    cursor = a + len;
  }
  if (cursor != end) {
    return fail(err_internal, "%s: ranges end at 0x%" PRIx64 ", the arena at 0x%" PRIx64, who,
                cursor, end);
  }
  if (sum_live != bytes_allocated_) {
    return fail(err_internal,
                "%s: allocations sum to %" PRIu64 " bytes, bytes_allocated says %" PRIu64, who,
                sum_live, bytes_allocated_);
  }
  // I6: recount the page counters from the allocations, and the full per-page live count.
  try {
    std::vector<uint64_t> ends(end_count_.size(), 0), full(end_count_.size(), 0);
    if (end_count_.size() != size_ / page_size_) {
      return fail(err_internal, "%s: page table has %zu pages, the arena %" PRIu64, who,
                  end_count_.size(), size_ / page_size_);
    }
    for (const auto& [a, len] : live_) {
      const uint64_t f = page_of(a), l = page_of(a + len - 1);
      ++ends[f];
      if (l != f) ++ends[l];
      for (uint64_t p = f; p <= l; ++p) ++full[p];
    }
    for (uint64_t p = 0; p < ends.size(); ++p) {
      if (ends[p] != end_count_[p]) {
        return fail(err_internal, "%s: page %" PRIu64 " end count %u, recount %" PRIu64, who, p,
                    end_count_[p], ends[p]);
      }
      if (page_live_count(p) != full[p]) {
        return fail(err_internal, "%s: page %" PRIu64 " live count %" PRIu64 ", recount %" PRIu64,
                    who, p, page_live_count(p), full[p]);
      }
    }
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "%s: no host memory for the recount", who);
  }
  return 0;
}

}  // namespace vramswap::detail
