// Where the contents of non-resident pages live, as the pager sees it: pinned host memory.
//
// The pager (core/) moves bytes between device frames and host memory over PCIe; a
// page_store (implemented in swap/: a chain of tiers, swap/tiered_store.hpp) owns that
// host memory. Keeping the interface here lets core/ stay independent of swap/ (arrows
// point one way: swap -> core).
//
// Tiers. A store is a chain: tier 0 holds the pinned slots the pager copies with; a store
// may keep pages further down (tier 1 and on: a swap file) and bring them back into tier 0
// for slot_for_read. Core names no tier: it asks the store which tier holds a page, and
// what the tier is called.
//
// A slot is identified by the caller's key (the pager uses the page's index in its arena).
// Slot memory is always pinned (registered with the backend once, reused), so copies run at
// the link's rate; the store never pins per swap.
#pragma once

#include <cstddef>
#include <cstdint>

namespace vramswap::detail {

class page_store {
 public:
  virtual ~page_store() = default;

  // Pinned host memory of `size` bytes that will hold page `key`'s saved bytes. Valid until
  // release(key). Asking again for a key that has a slot returns the same memory.
  virtual int slot_for_write(uint64_t key, size_t size, void** host) = 0;
  // Like slot_for_write, but never waits for another process: err_busy, with no detail
  // recorded, when a slot could only be had by waiting until another process gives one back
  // (a store shared between processes, swap/pool_host_store.hpp). The pager asks this first,
  // so that before it blocks it can finish the copies it has in flight and give their frames
  // back: a process waiting for a slot then holds no frame that another process, restoring
  // (and freeing slots as its copies in complete), may be waiting for. Stores of one process
  // only keep the default.
  virtual int try_slot_for_write(uint64_t key, size_t size, void** host) { return slot_for_write(key, size, host); }
  // Pinned host memory holding page `key`'s saved bytes (a store with tiers behind its
  // slots may read them back first). err_invalid_argument when the key has no slot.
  virtual int slot_for_read(uint64_t key, void** host) = 0;
  // The saved copy of `key` is no longer needed; its memory is reused. No-op if none.
  virtual int release(uint64_t key) = 0;
  virtual bool holds(uint64_t key) const = 0;
  // Bytes of saved pages held, in every tier: each saved page counts once.
  virtual uint64_t bytes_held() const = 0;
  // Host memory this store pinned of its own for saved pages, used or free (0: none, or
  // memory it borrows, as the shared host pool's slots).
  virtual uint64_t host_bytes_pinned() const { return 0; }

  // Where saved pages are. Tier 0 is the slots; tier_of says where `key`'s saved copy
  // lives (0 also when the key has none); bytes_in_tier(t) sums the pages tier_of puts in t.
  virtual unsigned tier_count() const { return 1; }
  virtual unsigned tier_of(uint64_t key) const {
    (void)key;
    return 0;
  }
  virtual uint64_t bytes_in_tier(unsigned tier) const { return tier == 0 ? bytes_held() : 0; }
  // A name for the tier, for reports ("host", "host pool", "swap file").
  virtual const char* tier_name(unsigned tier) const { return tier == 0 ? "host" : "?"; }

  // Optional, for stores with tiers behind their slots (defaults do nothing):
  //
  // The caller's copy out of slot_for_read(key)'s memory has completed. The saved copy stays
  // (until release), but a store that also has it further down may reuse the slot at once,
  // so a restore larger than the slots need not pin more than them. Without this call the
  // memory stays the caller's until release(key).
  virtual void read_done(uint64_t key) { (void)key; }
  // The caller is about to save up to `pages` pages it does not hold (slot_for_write for
  // new keys), as an eviction does before its first copy. A store with a tier behind its
  // slots reserves the room there for the part that will not fit the slots now, in one
  // piece, before any of it is written. A hint: 0 (ok) or an error (e.g. no space) that the saves
  // themselves will meet again, page by page; the caller may go on either way.
  virtual int expect_saves(uint64_t pages) {
    (void)pages;
    return 0;
  }
  // The caller's memory has grown to `pages` pages, all of which a later eviction may save.
  // A store that makes its host memory as needed may make it ahead of need, in the
  // background, so that the first eviction does not wait for memory to be pinned. A hint.
  virtual void may_save(uint64_t pages) { (void)pages; }
  // The caller maps device memory from now until owner_mapping(false) (a malloc backing its
  // pages, a restore bringing them in). Pinning host memory beside it (faulting pages in,
  // registering them with the driver) holds the driver's mapping calls up many times over
  // their own time, so a store that pins ahead of need starts no new pinning work meanwhile,
  // each wait bounded so that an owner that maps without pause still gets its memory
  // pinned. Calls nest. A hint.
  virtual void owner_mapping(bool mapping) { (void)mapping; }
};

}  // namespace vramswap::detail
