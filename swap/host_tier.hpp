// host_tier: the chain of one tier, this process's own pinned slots (swap/pinned_slots.hpp),
// with no budget and nothing behind it: saved pages stay in pinned host memory, which grows
// in chunks of `chunk_slots` slots as needed and is reused, never pinned per swap. reserve()
// grows it ahead of time so that a later eviction does not pay for pinning. The store of a
// process with no swap file, and of the tests and benchmarks of the pager.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/backend.hpp"
#include "swap/tiered_store.hpp"

namespace vramswap::detail {

class host_tier final : public tiered_store {
 public:
  // `slot_size`: bytes per page. `chunk_slots`: slots per pinned chunk (growth step).
  // `make_ahead`: pin slots ahead of need as the owner's memory grows (may_save).
  host_tier(backend& be, size_t slot_size, size_t chunk_slots = 16, bool make_ahead = false);

  // Make sure at least `bytes` of pinned slots exist (held or free).
  int reserve(uint64_t bytes);
  uint64_t bytes_pinned() const;
};

}  // namespace vramswap::detail
