#include "core/arena.hpp"

#include <algorithm>
#include <cinttypes>

#include "core/status.hpp"

namespace vramswap::detail {

const char* advice_name(advice a) noexcept {
  switch (a) {
    case advice::normal: return "normal";
    case advice::discardable: return "discardable";
    case advice::read_mostly: return "read_mostly";
  }
  return "?";
}

arena::~arena() {
  if (be_ != nullptr && base_ != 0) be_->unreserve(base_, alloc_.size());
}

int arena::init(backend& be, int device, uint64_t size, uint64_t page_size) {
  if (be_ != nullptr) return fail(err_invalid_argument, "arena: already initialized");
  device_ptr base = 0;
  VS_TRY(add_context(be.reserve(device, size, page_size, &base), "arena: reserving %" PRIu64 " bytes of address space: ", size));
  range_allocator alloc;
  const int rc = alloc.init(base, size, page_size);
  if (rc != ok) {
    be.unreserve(base, size);
    return rc;
  }
  be_ = &be;
  device_ = device;
  base_ = base;
  alloc_ = std::move(alloc);
  return ok;
}

int arena::allocate(uint64_t size, device_ptr* out, std::vector<page_range>* newly_live) {
  if (size == 0) return fail(err_invalid_argument, "malloc: size 0 (allocate at least one byte)");
  uint64_t addr = 0;
  const int rc = alloc_.allocate(size, &addr, newly_live);
  if (rc == err_out_of_memory) {
    return add_context(rc, "malloc(%" PRIu64 "): the arena of %" PRIu64 " bytes (VRAMSWAP_ARENA_SIZE) cannot hold it: ", size,
                       alloc_.size());
  }
  VS_TRY(rc);
  *out = addr;
  return ok;
}

int arena::reserve(uint64_t size, uint64_t alignment, device_ptr* out) {
  uint64_t addr = 0;
  const int rc = alloc_.reserve(size, alignment, &addr);
  if (rc == err_out_of_memory) {
    return add_context(rc, "reserving %" PRIu64 " bytes of addresses: the arena of %" PRIu64 " bytes (VRAMSWAP_ARENA_SIZE) cannot hold them: ",
                       size, alloc_.size());
  }
  VS_TRY(rc);
  *out = addr;
  return ok;
}

int arena::unreserve(device_ptr ptr) { return alloc_.unreserve(ptr); }

int arena::allocate_at(device_ptr ptr, uint64_t size, std::vector<page_range>* newly_live) {
  if (size == 0) return fail(err_invalid_argument, "mapping 0 bytes at 0x%" PRIxPTR " (map at least one byte)", ptr);
  return alloc_.allocate_at(ptr, size, newly_live);
}

int arena::deallocate(device_ptr ptr, std::vector<page_range>* newly_dead) {
  range_allocation a;
  if (alloc_.find(ptr, &a) == ok && a.addr != ptr) {
    return fail(err_invalid_argument, "free(0x%" PRIxPTR "): an interior pointer of the allocation [0x%" PRIx64 ", +%" PRIu64
                "); pass the pointer malloc returned", ptr, a.addr, a.size);
  }
  const int rc = alloc_.deallocate(ptr, newly_dead);
  if (rc != ok) {
    return add_context(rc, "free(0x%" PRIxPTR "): not a live allocation (never allocated here, or freed already): ", ptr);
  }
  clear_advice(a.addr, a.addr + a.size);
  return ok;
}

void arena::clear_advice(uint64_t lo, uint64_t hi) {
  auto it = advice_.upper_bound(lo);
  if (it != advice_.begin() && std::prev(it)->second.end > lo) --it;
  while (it != advice_.end() && it->first < hi) {
    const uint64_t start = it->first;
    const advised r = it->second;
    it = advice_.erase(it);
    if (start < lo) advice_.emplace(start, advised{lo, r.what});
    if (r.end > hi) it = advice_.emplace(hi, advised{r.end, r.what}).first;
  }
}

int arena::advise(device_ptr ptr, uint64_t size, advice a) {
  range_allocation alloc;
  if (size == 0 || alloc_.find(ptr, &alloc) != ok || ptr + size > alloc.addr + alloc.size || ptr + size < ptr) {
    return fail(err_invalid_argument, "advise(0x%" PRIxPTR ", %" PRIu64 ", %s): the range is not inside one live allocation", ptr, size,
                advice_name(a));
  }
  if (a != advice::normal && a != advice::discardable && a != advice::read_mostly) {
    return fail(err_invalid_argument, "advise(0x%" PRIxPTR "): unknown advice %d", ptr, static_cast<int>(a));
  }
  clear_advice(ptr, ptr + size);
  if (a != advice::normal) advice_.emplace(ptr, advised{ptr + size, a});
  return ok;
}

advice arena::page_advice(uint64_t page) const {
  const uint64_t lo = page_address(page);
  const uint64_t hi = lo + page_size();
  std::vector<range_allocation> live;
  alloc_.overlapping(lo, hi, &live);
  if (live.empty()) return advice::normal;
  advice common = advice::normal;
  bool first = true;
  for (const range_allocation& a : live) {
    // Every byte of [from, to) must be covered by advice ranges of one kind.
    uint64_t from = std::max<uint64_t>(a.addr, lo);
    const uint64_t to = std::min<uint64_t>(a.addr + a.size, hi);
    auto it = advice_.upper_bound(from);
    if (it != advice_.begin() && std::prev(it)->second.end > from) --it;
    while (from < to) {
      if (it == advice_.end() || it->first > from) return advice::normal;  // a gap: plain bytes
      if (first) {
        common = it->second.what;
        first = false;
      } else if (it->second.what != common) {
        return advice::normal;
      }
      from = it->second.end;
      ++it;
    }
  }
  return common;
}

page_range arena::pages_of(device_ptr ptr, uint64_t size) const {
  const uint64_t first = (ptr - base_) / page_size();
  const uint64_t last = (ptr + size - 1 - base_) / page_size();
  return page_range{first, last - first + 1};
}

}  // namespace vramswap::detail
