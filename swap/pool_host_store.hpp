// pool_host_store: the page store of a process whose device has a shared host pool.
//
// vramswapd, run with VRAMSWAP_HOST_POOL, makes one memfd of frame-size slots that every
// member maps and registers (pinned) once at attach (pool/pool_connection.hpp), and keeps
// its slot table in the pool segment (pool/pool_layout.hpp: one compare-and-swap word per
// slot, free or used by a member). This store saves each page in a slot of that pool
// instead of in pinned memory of its own, so the processes of a device together pin about
// what they save at once (their memory less the device pool, plus slack) instead of each
// pinning up to its whole memory: two 60 GiB processes on a 61 GiB device pool need ~60 GiB
// of pinned host memory, not 120.
//
// Taking a slot: scan the table from a hint for a free word and CAS it to used(me). When
// none is free, slot_for_write sleeps on the pool's slots_freed futex (bumped by every
// give-back and by the server's repair) and scans again, until `wait_timeout_ns`
// (VRAMSWAP_EVICT_TIMEOUT) has passed: then err_out_of_memory naming the pool's size, which
// members hold its slots, and what to set. try_slot_for_write never waits (err_busy), so
// the pager can give back frames before it blocks (core/page_store.hpp; the deadlock
// argument is in docs/swap.md, "Shared host pool").
//
// Giving back: release(key) CASes the slot to free and wakes every waiter. The pager
// releases a saved copy as soon as that page's copy in has completed, so a process
// restoring during a handoff hands slots to the process evicting for it.
//
// Slots are not zeroed between owners: a slot's bytes are read (slot_for_read) only by the
// member that took it, and only after that member wrote the whole slot (the pager copies a
// whole frame into it and marks the page saved only when the copy completed). What a dead
// or departed member left in a slot is never read back by anyone through vramswap.
//
// No disk tier: with a shared host pool, VRAMSWAP_HOST_LIMIT and the swap file are not
// used (the session logs it); the host pool must be sized for what is saved at once.
//
// Thread-safe (one mutex for this process's key -> slot map; the table is shared atomics).
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_map>

#include "core/page_store.hpp"
#include "pool/pool_segment.hpp"

namespace vramswap::detail {

class pool_host_store final : public page_store {
 public:
  // `base`: this process's mapping of the host pool (slot i at base + i * slot size), pinned.
  // `server_alive` is asked while waiting, so a dead server ends the wait with a clear error.
  pool_host_store(pool_segment& pool, uint32_t me, char* base, uint64_t wait_timeout_ns, std::function<bool()> server_alive);
  ~pool_host_store() override;  // gives back every slot still held
  pool_host_store(const pool_host_store&) = delete;
  pool_host_store& operator=(const pool_host_store&) = delete;

  int slot_for_write(uint64_t key, size_t size, void** host) override;
  int try_slot_for_write(uint64_t key, size_t size, void** host) override;
  int slot_for_read(uint64_t key, void** host) override;
  int release(uint64_t key) override;
  bool holds(uint64_t key) const override;
  uint64_t bytes_held() const override;

  uint32_t slots_held() const;
  uint64_t slot_size() const noexcept { return pool_.host_slot_size(); }

 private:
  int write_slot(uint64_t key, size_t size, bool wait, void** host);
  bool try_take_free(uint32_t* slot);
  int exhausted_error(uint64_t waited_ns) const;

  pool_segment& pool_;
  const uint32_t me_;
  char* const base_;
  const uint64_t wait_timeout_ns_;
  std::function<bool()> server_alive_;
  mutable std::mutex mutex_;
  std::unordered_map<uint64_t, uint32_t> held_;  // key -> slot index
  uint32_t scan_hint_ = 0;                       // under mutex_
};

}  // namespace vramswap::detail
