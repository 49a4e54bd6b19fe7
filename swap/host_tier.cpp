#include "swap/host_tier.hpp"

#include <memory>

#include "swap/pinned_slots.hpp"

namespace vramswap::detail {

namespace {
tier_chain own_slots_only(backend& be, size_t slot_size, size_t chunk_slots, bool make_ahead) {
  tier_chain chain;
  chain.make_ahead = make_ahead;
  chain.slots = std::make_unique<pinned_slots>(be, slot_size, chunk_slots, /*limit_slots=*/0, "host tier");
  return chain;
}
}  // namespace

host_tier::host_tier(backend& be, size_t slot_size, size_t chunk_slots, bool make_ahead)
    : tiered_store(own_slots_only(be, slot_size, chunk_slots, make_ahead)) {}

int host_tier::reserve(uint64_t bytes) {
  return with_slots([&](slot_provider& slots) {
    return static_cast<pinned_slots&>(slots).reserve(static_cast<size_t>((bytes + slot_size() - 1) / slot_size()));
  });
}

uint64_t host_tier::bytes_pinned() const {
  return with_slots([](const slot_provider& slots) { return slots.bytes_pinned(); });
}

}  // namespace vramswap::detail
