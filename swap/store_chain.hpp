// make_page_store: the page store of a device session, built from the options as a chain
// of tiers (swap/tiered_store.hpp):
//
//   the pool server has a shared host pool (VRAMSWAP_HOST_POOL), VRAMSWAP_SWAP_DIR set:
//       the pool's slots, a few pinned slots of this process's own behind them (to stage
//       pages to and from disk while other processes hold the whole pool), no budget, and
//       the swap file: saved pages past what the pool can give go to disk
//   a shared host pool, VRAMSWAP_SWAP_DIR not set:
//       the pool's slots only; with none free, an eviction waits for another process's
//       give-back (pool_host_store)
//   no shared host pool:
//       own pinned slots up to VRAMSWAP_HOST_LIMIT, then the swap file (tiered_store::create)
//
// Where the swap file cannot be made (a directory without O_DIRECT, say), the chain has no
// backing tier: the log says so, and saved pages stay in host memory (own slots without a
// limit, or the pool's). VRAMSWAP_HOST_LIMIT is not used with a shared host pool (the log
// says so when it is set).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "core/backend.hpp"
#include "core/page_store.hpp"
#include "pool/pool_connection.hpp"
#include "pool/pool_segment.hpp"
#include "swap/tiered_store.hpp"

namespace vramswap::detail {

// `wait_timeout_ns`: how long an eviction waits for a slot of the shared pool
// (VRAMSWAP_EVICT_TIMEOUT). The store keeps references to `be` and `conn`.
int make_page_store(backend& be, int device, pool_connection& conn, uint64_t wait_timeout_ns, std::unique_ptr<page_store>* out);

// This process's view of the device's shared host pool.
struct shared_host_pool {
  pool_segment* segment = nullptr;
  uint32_t member = 0;
  char* base = nullptr;  // slot i at base + i * slot size, pinned
  uint64_t wait_timeout_ns = 0;
  std::function<bool()> pool_alive;  // false once the pool is gone for good (pool_connection::pool_alive)
};

// The first chain above: the pool's slots, own pinned staging slots behind them, the swap
// file (`tc`'s swap settings, zeros from the options; its slot_size must be the pool's).
int make_pool_chain_with_swap_file(backend& be, const shared_host_pool& pool, const tiered_config& tc,
                                   std::unique_ptr<tiered_store>* out);

}  // namespace vramswap::detail
