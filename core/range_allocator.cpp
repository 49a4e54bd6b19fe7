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
      bytes_reserved_(other.bytes_reserved_),
      bytes_inside_reservations_(other.bytes_inside_reservations_),
      free_by_addr_(std::move(other.free_by_addr_)),
      free_by_size_(std::move(other.free_by_size_)),
      live_(std::move(other.live_)),
      reserved_(std::move(other.reserved_)),
      end_count_(std::move(other.end_count_)) {
  other.reset();
}

range_allocator& range_allocator::operator=(range_allocator&& other) noexcept {
  if (this != &other) {
    base_ = other.base_;
    size_ = other.size_;
    page_size_ = other.page_size_;
    bytes_allocated_ = other.bytes_allocated_;
    bytes_reserved_ = other.bytes_reserved_;
    bytes_inside_reservations_ = other.bytes_inside_reservations_;
    reserved_ = std::move(other.reserved_);
    free_by_addr_ = std::move(other.free_by_addr_);
    free_by_size_ = std::move(other.free_by_size_);
    live_ = std::move(other.live_);
    end_count_ = std::move(other.end_count_);
    other.reset();
  }
  return *this;
}

void range_allocator::reset() noexcept {
  base_ = size_ = page_size_ = bytes_allocated_ = bytes_reserved_ = bytes_inside_reservations_ = 0;
  reserved_.clear();
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

// Take [at, at + s) out of the free block at `block` into `into` (live_ or reserved_): the
// block's slack before and after it stay free blocks.
int range_allocator::carve(uint64_t block, uint64_t at, uint64_t s, std::map<uint64_t, uint64_t>* into) noexcept {
  auto bit = free_by_addr_.find(block);
  const uint64_t a = bit->first, len = bit->second;
  const uint64_t prefix = at - a;
  const uint64_t suffix_addr = at + s, suffix = a + len - suffix_addr;

  // Phase 1: everything that may allocate, undone if a later part of it throws.
  auto lit = into->end();
  auto sit = free_by_addr_.end();
  try {
    lit = into->emplace(at, s).first;
    if (prefix != 0 && suffix != 0) {  // two blocks remain: the suffix needs new nodes
      sit = free_by_addr_.emplace(suffix_addr, suffix).first;
      free_by_size_.emplace(suffix, suffix_addr);
    }
  } catch (const std::bad_alloc&) {
    if (sit != free_by_addr_.end()) free_by_addr_.erase(sit);
    if (lit != into->end()) into->erase(lit);
    return fail(err_out_of_memory, "range_allocator: host memory exhausted while taking %" PRIu64 " bytes at 0x%" PRIx64, s, at);
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
  if (newly_live != nullptr) {
    try {
      newly_live->reserve(newly_live->size() + 1);
    } catch (const std::bad_alloc&) {
      return fail(err_out_of_memory, "range_allocator::allocate: host memory exhausted while allocating %" PRIu64 " bytes", size);
    }
  }
  VS_TRY(carve(pl.block, pl.addr, s, &live_));
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
  try {
    if (newly_dead != nullptr) newly_dead->reserve(newly_dead->size() + 1);
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "range_allocator::deallocate: host memory exhausted while freeing 0x%" PRIx64, addr);
  }
  if (reservation_of(addr) != reserved_.end()) {
    live_.erase(lit);  // its bytes stay the reservation's
    bytes_inside_reservations_ -= s;
  } else {
    VS_TRY(give_back(lit, &live_));
  }
  bytes_allocated_ -= s;
  count_page_ends(addr, s, /*added=*/false, newly_dead);
  return 0;
}

// Return the range `it` of `from` (live_ or reserved_) to the free blocks, merged with its
// free neighbours.
int range_allocator::give_back(std::map<uint64_t, uint64_t>::iterator it, std::map<uint64_t, uint64_t>* from) noexcept {
  const uint64_t addr = it->first, s = it->second;
  auto next = free_by_addr_.lower_bound(addr);
  auto prev = next == free_by_addr_.begin() ? free_by_addr_.end() : std::prev(next);
  const bool merge_prev = prev != free_by_addr_.end() && prev->first + prev->second == addr;
  const bool merge_next = next != free_by_addr_.end() && next->first == addr + s;

  // Phase 1: what may allocate. Only a block with no free neighbour needs a new node.
  try {
    if (!merge_prev && !merge_next) free_by_size_.emplace(s, addr);
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "range_allocator: host memory exhausted while freeing 0x%" PRIx64, addr);
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
    from->erase(it);
  } else if (merge_next) {
    const uint64_t merged = s + next->second;
    auto snode = free_by_size_.extract({next->second, next->first});
    snode.value() = {merged, addr};
    free_by_size_.insert(std::move(snode));
    auto anode = free_by_addr_.extract(next);
    anode.key() = addr;
    anode.mapped() = merged;
    free_by_addr_.insert(std::move(anode));
    from->erase(it);
  } else {
    free_by_addr_.insert(from->extract(it));  // same node type: the entry changes maps
  }
  return 0;
}

// --- reservations ---------------------------------------------------------------------------

std::map<uint64_t, uint64_t>::const_iterator range_allocator::reservation_of(uint64_t addr) const noexcept {
  auto rit = reserved_.upper_bound(addr);
  if (rit == reserved_.begin()) return reserved_.end();
  --rit;
  return addr - rit->first < rit->second ? rit : reserved_.end();
}

int range_allocator::reserve(uint64_t size, uint64_t align, uint64_t* addr) noexcept {
  const char* const who = "range_allocator::reserve";
  if (size_ == 0 || addr == nullptr) return fail(err_invalid_argument, "%s: not initialized, or addr is null", who);
  if (size == 0 || size % alignment != 0) {
    return fail(err_invalid_argument, "%s: size %" PRIu64 " is not a non-zero multiple of %" PRIu64, who, size, alignment);
  }
  if (align == 0) align = page_size_;
  if (!is_pow2(align) || align < alignment) {
    return fail(err_invalid_argument, "%s: alignment %" PRIu64 " is not a power of two of at least %" PRIu64, who, align, alignment);
  }
  // Searched for with room for the worst slack before an aligned start (the base need not
  // be aligned to anything beyond `alignment`).
  const uint64_t slack = align - alignment;
  if (size > size_ || slack > size_ - size) {
    return fail(err_out_of_memory, "%s: %" PRIu64 " bytes (aligned to %" PRIu64 ") do not fit the arena of %" PRIu64 " bytes", who, size,
                align, size_);
  }
  placement pl;
  if (!find_placement(std::max(size + slack, page_size_), &pl)) {
    return fail(err_out_of_memory, "%s: no free block holds %" PRIu64 " bytes aligned to %" PRIu64 ": %" PRIu64
                " bytes free, largest free block %" PRIu64 " bytes", who, size, align, bytes_free(), largest_free_block());
  }
  const uint64_t at = (pl.addr + align - 1) / align * align;
  VS_TRY(carve(pl.block, at, size, &reserved_));
  bytes_reserved_ += size;
  *addr = at;
  return 0;
}

int range_allocator::unreserve(uint64_t addr) noexcept {
  const char* const who = "range_allocator::unreserve";
  auto rit = reserved_.find(addr);
  if (rit == reserved_.end()) {
    return fail(err_invalid_argument, "%s: 0x%" PRIx64 " is not the start of a reservation (never reserved, or freed already)", who, addr);
  }
  auto lit = live_.lower_bound(addr);
  if (lit != live_.end() && lit->first - addr < rit->second) {
    return fail(err_busy, "%s: the reservation [0x%" PRIx64 ", +%" PRIu64 ") still has memory at 0x%" PRIx64 " (%" PRIu64
                " bytes); free it first", who, addr, rit->second, lit->first, lit->second);
  }
  const uint64_t s = rit->second;
  VS_TRY(give_back(rit, &reserved_));
  bytes_reserved_ -= s;
  return 0;
}

int range_allocator::allocate_at(uint64_t addr, uint64_t size, std::vector<page_range>* newly_live) noexcept {
  const char* const who = "range_allocator::allocate_at";
  uint64_t s = 0;
  VS_TRY(check_allocate(size, &addr, &s));
  const auto rit = reservation_of(addr);
  if (addr % alignment != 0 || rit == reserved_.end() || s > rit->second - (addr - rit->first)) {
    return fail(err_invalid_argument, "%s: [0x%" PRIx64 ", +%" PRIu64 ") is not %" PRIu64 "-byte aligned inside one reservation", who,
                addr, size, alignment);
  }
  auto next = live_.lower_bound(addr);
  const bool hits_next = next != live_.end() && next->first < addr + s;
  const bool hits_prev = next != live_.begin() && std::prev(next)->first + std::prev(next)->second > addr;
  if (hits_next || hits_prev) {
    const auto& other = hits_next ? *next : *std::prev(next);
    return fail(err_invalid_argument, "%s: [0x%" PRIx64 ", +%" PRIu64 ") overlaps memory already there at [0x%" PRIx64 ", +%" PRIu64 ")",
                who, addr, size, other.first, other.second);
  }
  try {
    if (newly_live != nullptr) newly_live->reserve(newly_live->size() + 1);
    live_.emplace_hint(next, addr, s);
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "%s: host memory exhausted", who);
  }
  bytes_allocated_ += s;
  bytes_inside_reservations_ += s;
  count_page_ends(addr, s, /*added=*/true, newly_live);
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
    if (!free_by_addr_.empty() || !free_by_size_.empty() || !live_.empty() || !reserved_.empty() ||
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
  // I7: allocations do not overlap; one inside a reservation lies wholly inside it.
  uint64_t sum_live = 0, sum_inside = 0, prev_end = base_;
  for (const auto& [a, len] : live_) {
    if (a < prev_end) return fail(err_internal, "%s: allocation at 0x%" PRIx64 " overlaps the one before it", who, a);
    prev_end = a + len;
    sum_live += len;
    const auto rit = reservation_of(a);
    if (rit == reserved_.end()) continue;
    if (len > rit->second - (a - rit->first)) {
      return fail(err_internal, "%s: allocation at 0x%" PRIx64 " of %" PRIu64 " bytes runs past its reservation at 0x%" PRIx64, who, a,
                  len, rit->first);
    }
    sum_inside += len;
  }
  // I1, I2, I4, I5: walk blocks, reservations and the allocations outside them together in
  // address order; they must tile [base, end) exactly, with no two blocks adjacent.
  std::map<uint64_t, std::pair<uint64_t, const char*>> tiles;  // address -> (size, what)
  try {
    for (const auto& [a, len] : free_by_addr_) tiles.emplace(a, std::make_pair(len, "free block"));
    for (const auto& [a, len] : reserved_) {
      if (!tiles.emplace(a, std::make_pair(len, "reservation")).second) return fail(err_internal, "%s: two ranges at 0x%" PRIx64, who, a);
    }
    for (const auto& [a, len] : live_) {
      if (reservation_of(a) != reserved_.end()) continue;
      if (!tiles.emplace(a, std::make_pair(len, "allocation")).second) return fail(err_internal, "%s: two ranges at 0x%" PRIx64, who, a);
    }
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "%s: no host memory for the recount", who);
  }
  uint64_t cursor = base_, sum_reserved = 0;
  bool last_was_free = false;
  for (const auto& [a, tile] : tiles) {
    const auto [len, what] = tile;
    const bool is_free = what[0] == 'f';
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
    if (is_free && last_was_free) {
      return fail(err_internal, "%s: free block at 0x%" PRIx64 " follows another: not coalesced", who, a);
    }
    if (what[0] == 'a' && len >= page_size_ && (a - base_) % page_size_ != 0) {
      return fail(err_internal,
                  "%s: allocation at 0x%" PRIx64 " of %" PRIu64
                  " bytes is not on a page boundary",
                  who, a, len);
    }
    if (what[0] == 'r') sum_reserved += len;
    last_was_free = is_free;
    cursor = a + len;
  }
  if (cursor != end) {
    return fail(err_internal, "%s: ranges end at 0x%" PRIx64 ", the arena at 0x%" PRIx64, who,
                cursor, end);
  }
  if (sum_live != bytes_allocated_ || sum_inside != bytes_inside_reservations_ || sum_reserved != bytes_reserved_) {
    return fail(err_internal,
                "%s: allocations sum to %" PRIu64 " bytes (%" PRIu64 " inside reservations), reservations to %" PRIu64
                "; the counters say %" PRIu64 " (%" PRIu64 "), %" PRIu64, who,
                sum_live, sum_inside, sum_reserved, bytes_allocated_, bytes_inside_reservations_, bytes_reserved_);
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
