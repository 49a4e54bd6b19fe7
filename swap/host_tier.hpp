// The host tier: pinned host memory holding the contents of evicted pages.
//
// Memory comes in chunks of whole slots (one slot = one page = one frame's worth of bytes).
// A chunk is mapped, backed with transparent huge pages where the kernel allows, faulted in
// up front, and registered with the backend once (cuMemHostRegister of pre-faulted memory
// runs ~10x faster than cuMemHostAlloc: 26 vs 2.6 GB/s on the H200 machine). Chunks are
// kept and reused for the life of the tier: nothing is pinned per swap. reserve() grows the
// tier ahead of time so that a later eviction does not pay for pinning.
//
// Thread-safe. Slots are handed out from a free list; freed slots are reused first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/backend.hpp"
#include "core/page_store.hpp"

namespace vramswap::detail {

class host_tier final : public page_store {
 public:
  // `slot_size`: bytes per page. `chunk_slots`: slots per pinned chunk (growth step).
  host_tier(backend& be, size_t slot_size, size_t chunk_slots = 16);
  ~host_tier() override;
  host_tier(const host_tier&) = delete;
  host_tier& operator=(const host_tier&) = delete;

  int slot_for_write(uint64_t key, size_t size, void** host) override;
  int slot_for_read(uint64_t key, void** host) override;
  int release(uint64_t key) override;
  bool holds(uint64_t key) const override;
  uint64_t bytes_held() const override;

  // Make sure at least `bytes` of pinned slots exist (held or free).
  int reserve(uint64_t bytes);
  uint64_t bytes_pinned() const;
  size_t slot_size() const noexcept { return slot_size_; }

 private:
  struct chunk {
    char* base;
    size_t bytes;
  };
  int grow_locked();  // one more chunk; mutex_ held

  backend& be_;
  const size_t slot_size_;
  const size_t chunk_slots_;
  mutable std::mutex mutex_;
  std::vector<chunk> chunks_;
  std::vector<char*> free_;                   // slots not holding a page
  std::unordered_map<uint64_t, char*> held_;  // key -> slot
};

}  // namespace vramswap::detail
