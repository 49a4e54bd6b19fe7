// Where the contents of non-resident pages live, as the pager sees it: pinned host memory.
//
// The pager (core/) moves bytes between device frames and host memory over PCIe; a
// page_store (implemented in swap/: the host tier, later spilling to the disk tier) owns
// that host memory. Keeping the interface here lets core/ stay independent of swap/
// (arrows point one way: swap -> core).
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
  // Pinned host memory holding page `key`'s saved bytes (a store with a disk tier may read
  // them back first). err_invalid_argument when the key has no slot.
  virtual int slot_for_read(uint64_t key, void** host) = 0;
  // The saved copy of `key` is no longer needed; its memory is reused. No-op if none.
  virtual int release(uint64_t key) = 0;
  virtual bool holds(uint64_t key) const = 0;
  // Bytes of saved pages held, in every tier (pinned host memory and, for a store with a
  // disk tier, the swap file): each saved page counts once.
  virtual uint64_t bytes_held() const = 0;

  // Optional, for stores with a disk tier (defaults do nothing):
  //
  // The caller's copy out of slot_for_read(key)'s memory has completed. The saved copy stays
  // (until release), but a store that also has it on disk may reuse the host memory at once,
  // so a restore larger than the host budget need not pin more than the budget. Without
  // this call the memory stays the caller's until release(key).
  virtual void read_done(uint64_t key) { (void)key; }
  // Bytes of saved pages whose only copy is on disk.
  virtual uint64_t bytes_on_disk() const { return 0; }
  // Is `key`'s saved copy only on disk (not in host memory)?
  virtual bool on_disk(uint64_t key) const {
    (void)key;
    return false;
  }
  // The caller is about to save up to `pages` pages it does not hold (slot_for_write for
  // new keys), as an eviction does before its first copy. A store with a disk tier reserves
  // the disk space for the part that will not fit in host memory now, in one piece, before
  // any of it is written. A hint: 0 (ok) or an error (e.g. no space) that the saves
  // themselves will meet again, page by page; the caller may go on either way.
  virtual int expect_saves(uint64_t pages) {
    (void)pages;
    return 0;
  }
};

}  // namespace vramswap::detail
