// session: one process's memory on one device, as runtime.cpp holds it (one per device).
//
// Two policies implement it:
//   device_session (runtime/device_session.hpp): time-sharing. The process takes turns under
//     the device lock; its memory is resident while it holds the lock, and its service thread
//     evicts frames that other processes ask for between turns.
//   oversubscribed_session (runtime/oversubscribed_session.hpp): VRAMSWAP_OVERSUBSCRIBE=1.
//     Low priority, no lock; its memory is always mapped (pool frames while free, else host
//     frames), and its service thread moves pages to host frames when a lock holder asks.
//
// The skeleton is here, once: open() joins the device's pool (pool/pool_member.hpp), lets
// the policy build its frame source and page store, makes the pager over them and starts
// the member's service thread, which calls the policy's serve(); close() (each policy's
// destructor calls it first) lets the policy leave (a held lock is released), stops the
// service thread and destroys the pager while the policy's frame source and store still
// exist, which the policy then destroys, before the pool membership goes last.
//
// Return codes: 0, or a negative vramswap::detail::status with the detail in last_error().
#pragma once

#include <cstdint>
#include <memory>

#include "core/backend.hpp"
#include "core/frame_source.hpp"
#include "core/page_store.hpp"
#include "core/pager.hpp"
#include "lock/device_lock.hpp"
#include "lock/rank_gang.hpp"
#include "pool/pool_member.hpp"
#include "vramswap/vramswap.h"

namespace vramswap::detail {

class session {
 public:
  virtual ~session();
  session(const session&) = delete;
  session& operator=(const session&) = delete;

  // This process's memory on the device (malloc/free/advise/stats).
  pager& memory() noexcept { return *pager_; }
  const pager& memory() const noexcept { return *pager_; }
  backend& get_backend() noexcept { return *be_; }
  int device() const noexcept { return device_; }

  // Device memory this process got past vramswap changed by `delta` bytes (published in its
  // member slot for `vramswap status`).
  void note_outside_pool(int64_t delta) noexcept;
  // Whether this is the oversubscribed policy (VRAMSWAP_OVERSUBSCRIBE=1).
  virtual bool oversubscribed() const noexcept = 0;
  // Whether this process's memory is mapped even while it does not hold the lock, so that
  // it may be used without the lock (true only for the oversubscribed policy).
  virtual bool mapped_without_lock() const noexcept = 0;

  // The device lock (time-sharing only; the oversubscribed policy refuses with
  // err_invalid_argument, naming VRAMSWAP_OVERSUBSCRIBE). Re-entry by the holding thread is
  // counted, as the lock's own.
  virtual int acquire(lock_priority priority = lock_priority::normal, int64_t timeout_ns = -1, acquire_info* info = nullptr) = 0;
  virtual int release() = 0;
  virtual bool holding() const noexcept = 0;
  // Fair turns (lock/device_lock.hpp): this process's hold checked at a safe point (its
  // over-limit warning and an operator's release request are logged once per hold). Nothing
  // for a policy without the lock.
  virtual hold_check check_hold() noexcept { return {}; }

  // Gangs (several devices at once: lock/device_lock.hpp, acquire_gang). The runtime takes
  // the gang's device locks together, then lets each session bring its memory in:
  //   gang_lock(): the device's lock (nullptr: this policy has none, err_invalid_argument);
  //   asking(): before the locks are taken (observability); gave_up(): they were not;
  //   granted(): this session's lock is now held by this thread (`info` as its acquire said):
  //     bring the memory in, as acquire() does after its lock; on failure the lock is released.
  struct acquire_start {
    bool first = false;  // not a re-entry
    uint64_t asked_ns = 0;
    uint64_t t0_ns = 0;
  };
  virtual device_lock* gang_lock() noexcept { return nullptr; }
  // A gang of processes (lock/rank_gang.hpp): from now on this session's acquires are this
  // rank's rounds of `gang` (nullptr: plain acquires again). Only while no thread holds or
  // waits for the device. err_invalid_argument for a policy without the lock.
  virtual int set_rank_gang(std::unique_ptr<rank_gang> gang);
  virtual const rank_gang* joined_gang() const noexcept { return nullptr; }
  virtual void asking(lock_priority, acquire_start*) noexcept {}
  virtual void gave_up(const acquire_start&) noexcept {}
  virtual int granted(lock_priority, const acquire_start&, const acquire_info&) { return 0; }

  // Keep this process's memory resident from now on, without the lock (docs/sleep.md): its
  // frames are never asked of it, its memory leaves them only when it sleeps (memory_tags).
  // For processes that share the device by sleeping and waking (serving and training
  // colocated), not by taking turns. Time-sharing only (err_invalid_argument otherwise).
  virtual int keep_resident() = 0;
  virtual bool keeps_resident() const noexcept { return false; }

  // Whether all of this process's memory is mapped now.
  virtual bool resident() const noexcept = 0;
  // What memory_info reports (docs/api.md): the pool's bytes and what this process leaves free.
  virtual void memory_info(uint64_t* free_bytes, uint64_t* total_bytes) const = 0;
  // This policy's fields of the public stats (the rest are the runtime's: the stream
  // allocator's, the lock holder deaths). `out` is zeroed by the caller.
  virtual void fill_stats(vramswap_stats_t* out) const = 0;

 protected:
  session() = default;

  // The skeleton (see the top of this file): call once, from the policy's factory.
  int open(int device);
  // The first thing each policy's destructor calls. Idempotent.
  void close() noexcept;

  // Hooks for open() and close(), in the order they run:
  // Build the frame source and page store over `member`; fill the pager's config beyond
  // frame_size (which open() sets to the pool's).
  virtual int build(pool_member& member, frame_source** frames, page_store** store, pager_config* cfg) = 0;
  // The pager exists; the service thread is not started yet.
  virtual void opened() {}
  // One wake of the service thread (at a request, or k_service_poll_ns after the last).
  virtual void serve(uint32_t requests_seen) = 0;
  // close(): before the service thread stops (time-sharing releases a held lock).
  virtual void leaving() noexcept {}

  pool_member& member() noexcept { return *member_; }
  const pool_member& member() const noexcept { return *member_; }
  backend* be_ = nullptr;
  int device_ = -1;

 private:
  std::unique_ptr<pool_member> member_;
  std::unique_ptr<pager> pager_;
  bool closed_ = false;
};

}  // namespace vramswap::detail
