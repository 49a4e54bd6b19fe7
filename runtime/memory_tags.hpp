// memory_tags: one process's memory classes on one device ("weights", "kv_cache", ...), and
// their sleep and wake (docs/sleep.md).
//
// A tagged allocation lives in address ranges that hold that tag's allocations only: each
// tag owns regions, reservations of the process's arena (pager::reserve) aligned to whole
// pages, and places its allocations inside them with a range_allocator of its own (best
// fit, as the arena's), then backs them with pager::malloc_at. So no page is shared by two
// tags, nor by a tag and untagged memory, and a tag's pages can leave their frames while
// the rest stays.
//
// sleep(): the pages of the named tags leave their frames, which go back to the pool for
// whoever needs them next, and stay out, whatever the lock does, until wake(); per tag:
//   offload  the bytes are saved in the page store (host memory, disk past its limit) as an
//            eviction saves them; the addresses stay valid; wake() brings them back;
//   discard  the bytes are dropped; wake() gives the pages back zero-filled.
// wake(): the tags' pages are awake again: brought in now when the session's memory is
// resident (the lock held, or a session that keeps its memory resident), else at the next
// acquire with the rest. While a tag sleeps its memory must not be touched (an illegal
// address on CUDA, a SIGSEGV on the host backend), and allocating in it is refused.
//
// Errors (0 or a negative status, detail in last_error()): err_invalid_argument (a bad tag
// name, an unknown tag, allocating in a sleeping tag, a pointer that is no tagged
// allocation), and what the pager returns; a failed call says what state it left each tag
// in. Thread-safe: one mutex serializes the calls (the pager has its own beneath).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/pager.hpp"
#include "core/range_allocator.hpp"

namespace vramswap::detail {

enum class sleep_mode : uint8_t { offload = 0, discard = 1 };
const char* sleep_mode_name(sleep_mode m) noexcept;

// One tag as tags() reports it.
struct tag_report {
  std::string name;
  uint64_t allocated_bytes = 0;  // live allocations (rounded to 256 B)
  uint64_t allocations = 0;
  uint64_t reserved_bytes = 0;   // its regions' addresses
  bool asleep = false;
  sleep_mode mode = sleep_mode::offload;  // how it sleeps (the last sleep's), while asleep
};

struct tag_sleep {
  std::string tag;
  sleep_mode mode = sleep_mode::offload;
};

class memory_tags {
 public:
  static constexpr size_t k_max_tags = 64;
  static constexpr size_t k_max_name = 63;

  explicit memory_tags(pager& memory) : memory_(memory) {}
  // err_invalid_argument (detail set) unless `name` is a valid tag name.
  static int check_name(const std::string& name);
  memory_tags(const memory_tags&) = delete;
  memory_tags& operator=(const memory_tags&) = delete;

  // `size` bytes (256-byte aligned) of tag `tag`'s memory; the tag is made on first use.
  // Backed as pager::malloc backs memory (`when_not_resident`).
  int malloc(const std::string& tag, uint64_t size, backing when_not_resident, device_ptr* out);
  // Whether `ptr` lies in some tag's regions.
  bool owns(device_ptr ptr) const;
  // Free a tagged allocation (its start). err_invalid_argument for anything else.
  int free(device_ptr ptr);
  // Sleep the named tags (each once), discarding ones first (they free frames at once).
  int sleep(const std::vector<tag_sleep>& tags);
  // Wake the named tags; an empty list wakes every sleeping tag. A tag awake already is
  // left as it is.
  int wake(const std::vector<std::string>& tags);
  std::vector<tag_report> report() const;
  // Bytes of the sleeping tags' allocations (the public stats' asleep_bytes).
  uint64_t asleep_bytes() const;

 private:
  struct region {
    device_ptr base = 0;
    uint64_t size = 0;
    range_allocator placement;
  };
  struct tag_entry {
    std::string name;
    std::vector<std::unique_ptr<region>> regions;
    bool asleep = false;
    sleep_mode mode = sleep_mode::offload;
  };

  tag_entry* find(const std::string& name);
  int entry_for(const std::string& name, tag_entry** out);  // made when new
  int known(const std::string& name, tag_entry** out);      // err_invalid_argument when unknown
  std::string known_names() const;
  // Add a region of at least `size` bytes to `t`.
  int grow(tag_entry& t, uint64_t size);
  region* region_of(device_ptr ptr) const;
  std::vector<page_range> pages_of(const tag_entry& t) const;
  // The pages of all of `tags`; their names, quoted, appended to *names (for messages).
  std::vector<page_range> pages_of(const std::vector<tag_entry*>& tags, std::string* names) const;
  int sleep_all_of(const std::vector<tag_entry*>& tags, sleep_mode mode);

  pager& memory_;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<tag_entry>> tags_;
};

}  // namespace vramswap::detail
