// page_table: where each page of an arena's contents is.
//
//   unbacked  no frame and no saved copy: a page no live allocation touches, or one
//             allocated while the process was evicted and not yet brought in
//   resident  mapped at its address in frame `frame`, accessible
//   host      not mapped; its bytes are saved in the page store (in which of the store's
//             tiers is the store's business: page_store::tier_of)
//   discarded not mapped; its contents were dropped on eviction (discardable advice) and
//             come back zero-filled
//
// Flags: host_copy_valid says a resident page's saved copy in the store still equals its
// device bytes (read_mostly pages keep it after restore), so evicting it again copies
// nothing. frame_stale says a resident page's frame does not hold its bytes: a scrub or a
// partial copy in reached the frame, and neither leaving it nor copying the saved bytes
// back worked. Its saved copy is then its only home: the pager copies it in again before
// the page is used (restore_all, a malloc on the page) and evicts it without copying the
// frame out. asleep says a live page was put to sleep (pager::sleep): it is never resident,
// and restore_all leaves it where it is (host, discarded or unbacked) until pager::wake.
// Not thread-safe: the pager serializes calls.
#pragma once

#include <cstdint>
#include <vector>

#include "core/backend.hpp"

namespace vramswap::detail {

enum class page_state : uint8_t { unbacked, resident, host, discarded };
const char* page_state_name(page_state s) noexcept;

struct page_entry {
  page_state state = page_state::unbacked;
  bool host_copy_valid = false;
  bool frame_stale = false;  // resident, and only the saved copy holds the bytes
  bool asleep = false;       // live, not resident, and left so until woken
  frame_id frame = 0;  // valid when resident
  uint32_t frees = 0;  // times the last allocation on this page was freed (placement by use's hint)
};

class page_table {
 public:
  explicit page_table(uint64_t pages = 0) : entries_(pages) {}
  page_entry& operator[](uint64_t page) { return entries_[page]; }
  const page_entry& operator[](uint64_t page) const { return entries_[page]; }
  uint64_t size() const noexcept { return entries_.size(); }
  uint64_t count(page_state s) const noexcept {
    uint64_t n = 0;
    for (const page_entry& e : entries_) n += e.state == s;
    return n;
  }

 private:
  std::vector<page_entry> entries_;
};

}  // namespace vramswap::detail
