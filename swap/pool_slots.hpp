// pool_slots: a slot provider (swap/slot_provider.hpp) of the host pool shared by all the
// processes of a device.
//
// vramswapd, run with VRAMSWAP_HOST_POOL, makes one memfd of frame-size slots that every
// member maps and registers (pinned) once at attach (pool/pool_connection.hpp), and keeps
// its slot table in the pool segment (pool/pool_layout.hpp: one compare-and-swap word per
// slot, free or used by a member). Saving pages in that pool instead of in pinned memory
// of each process's own means the processes of a device together pin about what they save
// at once instead of each pinning up to its whole memory.
//
// take: scan the table from a hint for a free or dirty word and CAS it to used(me); err_busy
// when there is none. give_back: CAS the word to dirty(me) and wake every waiter on the
// pool's slots_freed futex (bumped by every give-back and by the server's repair).
// wait_for_give_back sleeps on that futex; once `wait_timeout_ns` (VRAMSWAP_EVICT_TIMEOUT)
// has passed it fails with err_out_of_memory naming the pool's size, which members hold
// its slots, and what to set.
//
// No free slot holds anyone's bytes: every member maps the whole host pool, so a page left in
// a free slot would stay readable by the others after this process left. A slot given back
// is dirty (pool/pool_layout.hpp) until whichever comes first: a member takes it and writes a
// whole page over it (a process evicting while this one restores: the handoff that a memset
// of every slot on the restore's path would slow down), or this object's scrubber thread,
// a moment later, takes it back, zeroes it and frees it. The destructor zeroes every slot
// this process still holds or left dirty; a member that dies has them zeroed by the server's
// repair.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "pool/pool_segment.hpp"
#include "swap/slot_provider.hpp"

namespace vramswap::detail {

class pool_slots final : public slot_provider {
 public:
  // `base`: this process's mapping of the host pool (slot i at base + i * slot size), pinned.
  // `pool_alive` is asked while waiting, so a pool gone for good ends the wait with a clear error.
  pool_slots(pool_segment& pool, uint32_t me, char* base, uint64_t wait_timeout_ns, std::function<bool()> pool_alive);
  ~pool_slots() override;  // zeroes and frees every slot still taken or left dirty

  size_t slot_size() const noexcept override { return pool_.host_slot_size(); }
  int take(bool past_limit, char** slot) override;
  void give_back(char* slot) override;
  bool owns(const char* slot) const noexcept override;
  size_t free_now() const override;
  uint64_t bytes_pinned() const noexcept override { return 0; }
  void watch_regions(std::function<void(char*, size_t)> fn) override;
  bool shared() const noexcept override { return true; }
  uint32_t give_back_count() const noexcept override;
  int wait_for_give_back(uint32_t seen, uint64_t waited_ns) override;

  uint32_t slots_taken() const noexcept { return static_cast<uint32_t>(taken_.size()); }

  // How long a slot given back stays dirty before the scrubber zeroes it, if nobody took it:
  // long enough for an evicting process to take what a restoring one gives back.
  static constexpr std::chrono::milliseconds k_scrub_after{20};

 private:
  struct dirty_slot {
    uint32_t slot;
    std::chrono::steady_clock::time_point scrub_at;
  };

  int exhausted_error(uint64_t waited_ns) const;
  // CAS slot `s` from used(me) to (to, owner); false, logged, if it is no longer ours.
  bool move_own_slot(uint32_t s, pool_layout::slot_state to, uint32_t owner);
  void free_slot(uint32_t s);
  void scrub(uint32_t s) noexcept;
  // Zero and free slot `s` if it is still dirty(me): claimed first (CAS to used(me)), so that
  // no member takes it while it is zeroed. False if another member took it meanwhile.
  bool scrub_if_dirty(uint32_t s);
  void scrubber_main();

  pool_segment& pool_;
  const uint32_t me_;
  char* const base_;
  const uint64_t wait_timeout_ns_;
  std::function<bool()> pool_alive_;
  std::unordered_set<uint32_t> taken_;
  uint32_t scan_hint_ = 0;

  // The scrubber's queue, in the order given back (each one's scrub_at is later than the one
  // before it); its thread starts at the first give-back.
  std::mutex dirty_mutex_;
  std::condition_variable dirty_changed_;
  std::deque<dirty_slot> dirty_;
  bool stopping_ = false;
  std::thread scrubber_;
};

}  // namespace vramswap::detail
