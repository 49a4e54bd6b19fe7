// slot_provider: where a tiered store (swap/tiered_store.hpp) gets the pinned host slots
// that hold saved pages, one page each. The first link of a store's chain; the budget and
// the backing tier (the swap file) are the store's.
//
//   pinned_slots    this process's own pinned chunks, grown on demand, up to a limit
//   pool_slots      slots of the host pool shared by all processes of a device (vramswapd's
//                   VRAMSWAP_HOST_POOL): a slot may come free when another process gives one back
//   fallback_slots  one provider, and another when the first has none free (rmm's fallback
//                   adaptor): the shared pool with a few own pinned slots behind it, so that a
//                   process with a swap file can still stage pages to and from disk when other
//                   processes hold the whole pool
//
// Not thread-safe: the store calls under its mutex (wait_for_give_back excepted: it is
// called with the store's mutex released and touches no state of the provider's own).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace vramswap::detail {

class slot_provider {
 public:
  virtual ~slot_provider() = default;
  virtual size_t slot_size() const noexcept = 0;
  // A free slot in `*slot`. `past_limit`: the caller has no other choice (every slot it
  // holds may still be in a copy), so a provider of this process's own memory goes past
  // its limit; a shared pool cannot. err_busy, with no detail recorded, when none is free
  // now; other errors (no host memory left to pin) with their detail.
  virtual int take(bool past_limit, char** slot) = 0;
  // The slot holds nothing any more; it may go to someone else at once.
  virtual void give_back(char* slot) = 0;
  // Does `slot` come from this provider?
  virtual bool owns(const char* slot) const noexcept = 0;
  // Slots take(false) would hand out now: a hint for writing ahead. SIZE_MAX: no limit.
  virtual size_t free_now() const = 0;
  // Bytes of host memory this provider pinned for this process (a shared pool's memory is
  // pinned by the pool connection, not counted here).
  virtual uint64_t bytes_pinned() const noexcept = 0;
  // Calls `fn` with every pinned region the slots lie in, now and as regions are added, so
  // that a backing tier can register them for its transfers.
  virtual void watch_regions(std::function<void(char* base, size_t bytes)> fn) = 0;

  // Make slots ahead of need, in the background, until `slots` exist in all (at most the
  // limit): a hint, for providers that make their memory as they go.
  virtual void make_ahead(size_t slots) { (void)slots; }
  // The owner maps device memory meanwhile (page_store::owner_mapping): making ahead starts
  // no new chunk nor registration until it is done, waiting a bounded time at each. Nests.
  virtual void owner_mapping(bool mapping) { (void)mapping; }
  // Stop making ahead and wait for the chunk in the making: from then on the watchers hear
  // of nothing from another thread (their owner may be about to go).
  virtual void stop_making_ahead() {}
  // Shared providers: slots also come free when other processes give theirs back.
  virtual bool shared() const noexcept { return false; }
  // A count every give-back bumps; read it before take() and pass it to wait_for_give_back,
  // so that a slot given back in between ends the wait at once.
  virtual uint32_t give_back_count() const noexcept { return 0; }
  // Sleep until a slot may have been given back, at most a short slice; an error with its
  // detail once `waited_ns` has passed the provider's patience or the pool's owner is gone
  // (the error says who holds the slots and what to set).
  virtual int wait_for_give_back(uint32_t seen, uint64_t waited_ns);
};

}  // namespace vramswap::detail
