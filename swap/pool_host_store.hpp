// pool_host_store: the chain of one tier, the slots of the device's shared host pool
// (swap/pool_slots.hpp), with nothing behind it: the store of a process whose device has a
// shared host pool (vramswapd's VRAMSWAP_HOST_POOL) and no swap file. With VRAMSWAP_SWAP_DIR
// as well, make_page_store (swap/store_chain.hpp) puts the swap file behind the pool instead.
//
// With no free slot, slot_for_write sleeps until another process gives one back (every
// give-back wakes the pool's slots_freed futex), up to `wait_timeout_ns`
// (VRAMSWAP_EVICT_TIMEOUT): then err_out_of_memory naming the pool's size, which members
// hold its slots, and what to set. try_slot_for_write never waits (err_busy), so the pager
// can give back frames before it blocks (core/page_store.hpp; the deadlock argument is in
// docs/swap.md, "Shared host pool"). release(key) gives the slot back and wakes every
// waiter; the pager releases a saved copy as soon as that page's copy in has completed, so
// a process restoring during a handoff hands slots to the process evicting for it.
#pragma once

#include <cstdint>
#include <functional>

#include "pool/pool_segment.hpp"
#include "swap/tiered_store.hpp"

namespace vramswap::detail {

class pool_host_store final : public tiered_store {
 public:
  // `base`: this process's mapping of the host pool (slot i at base + i * slot size), pinned.
  // `pool_alive` is asked while waiting, so a pool gone for good ends the wait with a clear error.
  pool_host_store(pool_segment& pool, uint32_t me, char* base, uint64_t wait_timeout_ns, std::function<bool()> pool_alive);

  uint32_t slots_held() const;
};

}  // namespace vramswap::detail
