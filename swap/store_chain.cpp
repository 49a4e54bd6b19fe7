#include "swap/store_chain.hpp"

#include <algorithm>
#include <cinttypes>
#include <string>

#include "core/log.hpp"
#include "core/options.hpp"
#include "core/status.hpp"
#include "swap/fallback_slots.hpp"
#include "swap/host_tier.hpp"
#include "swap/pinned_slots.hpp"
#include "swap/pool_host_store.hpp"
#include "swap/pool_slots.hpp"
#include "swap/tiered_store.hpp"

namespace vramswap::detail {

int make_pool_chain_with_swap_file(backend& be, const shared_host_pool& pool, const tiered_config& tc,
                                   std::unique_ptr<tiered_store>* out) {
  if (tc.slot_size != pool.segment->host_slot_size()) {
    return fail(err_invalid_argument, "tiered store for %s: pages of %zu bytes, but the shared host pool's slots are %" PRIu64 " bytes",
                tc.label.c_str(), tc.slot_size, pool.segment->host_slot_size());
  }
  swap_file_config fc;
  VS_TRY(swap_file_config_from_options(tc, &fc));
  tier_chain chain;
  chain.label = tc.label;
  chain.write_window = tc.write_window;
  chain.spill_ahead = tc.spill_ahead;
  chain.read_ahead = tc.read_ahead;
  VS_TRY(swap_file::open(fc, &chain.backing));
  // Own slots for when other processes hold the whole pool: the newest copies (which may
  // not go to disk yet), the writes and reads ahead, one more. Pinned only when used.
  const unsigned ahead = pages_ahead(fc, tc.slot_size);
  const size_t reserve = size_t{chain.write_window} + (tc.spill_ahead != 0 ? tc.spill_ahead : ahead) +
                         (tc.read_ahead != 0 ? tc.read_ahead : ahead) + 1;
  auto shared = std::make_unique<pool_slots>(*pool.segment, pool.member, pool.base, pool.wait_timeout_ns, pool.pool_alive);
  auto own = std::make_unique<pinned_slots>(be, tc.slot_size, std::min<size_t>(reserve, tc.chunk_slots), reserve,
                                            "staging slots of " + tc.label);
  chain.slots = std::make_unique<fallback_slots>(std::move(shared), std::move(own));
  return tiered_store::assemble(std::move(chain), out);
}

int make_page_store(backend& be, int device, pool_connection& conn, uint64_t wait_timeout_ns, std::unique_ptr<page_store>* out) {
  const std::string label = "device " + std::to_string(device);
  if (conn.host_pool() != nullptr) {
    // Saved pages go to the device's shared host pool (vramswapd's VRAMSWAP_HOST_POOL),
    // pinned once at attach; past it, to this process's swap file if VRAMSWAP_SWAP_DIR is set.
    if (!option_is_default(option_id::host_limit)) {
      log(log_level::warn,
          "%s: the pool server has a shared host pool (%u slots): saved pages go there; VRAMSWAP_HOST_LIMIT is not used (no "
          "per-process host budget)",
          label.c_str(), conn.host_slot_count());
    }
    const shared_host_pool pool{&conn.segment(), conn.member(), conn.host_pool(), wait_timeout_ns,
                                [c = &conn] { return c->pool_alive(); }};
    if (!option_is_default(option_id::swap_dir)) {
      tiered_config tc;
      tc.slot_size = conn.frame_size();
      tc.label = label;
      std::unique_ptr<tiered_store> chain;
      if (make_pool_chain_with_swap_file(be, pool, tc, &chain) == ok) {
        *out = std::move(chain);
        return ok;
      }
      log(log_level::warn, "%s: no swap file behind the shared host pool (%s); saved pages stay in the host pool", label.c_str(),
          last_error());
    }
    *out = std::make_unique<pool_host_store>(conn.segment(), conn.member(), conn.host_pool(), wait_timeout_ns,
                                             [c = &conn] { return c->pool_alive(); });
    return ok;
  }
  // Saved pages: pinned host memory up to VRAMSWAP_HOST_LIMIT, then the swap file. Where no
  // swap file can be made (a directory without O_DIRECT, say), keep them in host memory.
  // The host memory is pinned ahead of need (VRAMSWAP_HOST_PIN_AHEAD) as the process's device
  // memory grows, so that its first eviction does not run at the rate of pinning.
  uint64_t pin_ahead = 0;
  VS_TRY(option_uint(option_id::host_pin_ahead, &pin_ahead));
  tiered_config tc;
  tc.slot_size = conn.frame_size();
  tc.label = label;
  tc.make_ahead = pin_ahead == 1;
  std::unique_ptr<tiered_store> tiered;
  if (tiered_store::create(be, tc, &tiered) == ok) {
    *out = std::move(tiered);
    return ok;
  }
  log(log_level::warn, "%s: no disk tier (%s); saved pages stay in host memory without a limit", label.c_str(), last_error());
  *out = std::make_unique<host_tier>(be, conn.frame_size(), /*chunk_slots=*/16, tc.make_ahead);
  return ok;
}

}  // namespace vramswap::detail
