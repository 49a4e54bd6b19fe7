#include "swap/pool_host_store.hpp"

#include <memory>

#include "swap/pool_slots.hpp"

namespace vramswap::detail {

namespace {
tier_chain pool_slots_only(pool_segment& pool, uint32_t me, char* base, uint64_t wait_timeout_ns, std::function<bool()> pool_alive) {
  tier_chain chain;
  chain.slots = std::make_unique<pool_slots>(pool, me, base, wait_timeout_ns, std::move(pool_alive));
  return chain;
}
}  // namespace

pool_host_store::pool_host_store(pool_segment& pool, uint32_t me, char* base, uint64_t wait_timeout_ns,
                                 std::function<bool()> pool_alive)
    : tiered_store(pool_slots_only(pool, me, base, wait_timeout_ns, std::move(pool_alive))) {}

uint32_t pool_host_store::slots_held() const {
  return with_slots([](const slot_provider& slots) { return static_cast<const pool_slots&>(slots).slots_taken(); });
}

}  // namespace vramswap::detail
