// device_session: the time-sharing policy of a session (runtime/session.hpp): one process's
// participation in time-sharing one device.
//
// It ties the parts together: the pool membership (pool/pool_member.hpp: frames imported
// from vramswapd, the member slot, the service thread), the device lock, a pager whose frames come from the pool (pool_frame_source), a page store
// (the device's shared host pool when vramswapd has one, swap/pool_host_store.hpp; else this
// process's host memory, spilling to disk past VRAMSWAP_HOST_LIMIT), and the member's service
// thread, which serves other processes' eviction requests (serve()).
//
// acquire(): take the device lock (FIFO, by priority); take back this process's own idle
//   frames (cancelling evictions asked for but not done); bring every non-resident page in
//   (pager.restore_all over the pool: free frames first, then frames other processes are
//   asked to evict, LRU first; their copies out overlap our copies in). Returns when all of
//   this process's memory is resident. On failure the lock is released again.
// release(): by default move nothing: the frames become idle (others may ask for them), the
//   lock is handed on, and then this process's device work is synchronized before release()
//   returns (the next holder does not wait for that device round trip; our frames are safe
//   because they change hands only through our eviction, which synchronizes first). With
//   VRAMSWAP_EAGER_RELEASE=1 or VRAMSWAP_STRICT=1 evict everything first (strict: so that
//   device access outside the lock faults), then hand the lock on.
// Allocation while not holding the lock is allowed. Its pages get free frames of the pool
//   at once when there are enough for all of them (taken as this process's idle frames,
//   without waiting or asking anyone), so memory allocated and written between turns (a
//   model moved to the GPU before the training loop) works, and is saved like the rest
//   when another process needs the frames. Otherwise they stay unbacked until the next
//   acquire (pager malloc, backing::when_free), or the allocation fails (backing::required:
//   the stream-ordered allocator, whose callers write at once). Device access to this
//   process's memory outside the lock is undefined: its pages may be mapped (idle, not yet
//   asked for), being evicted, or unmapped (faults; on the host backend a SIGSEGV, which
//   runtime/fault_report.hpp explains before the process dies).
//
// keep_resident(): the process leaves turns for good: its memory is brought in (frames taken
//   as an acquire takes them, asking idle owners) and its frames stay active, so no one asks
//   for them; from then on its memory leaves the device only by sleeping (memory_tags), and
//   acquire() is refused. What a process that shares the device by sleep and wake does.
// Re-entry: acquire by the thread that holds the lock is counted, as the lock's own.
// Fair turns: every wake of the service thread (at least every k_service_poll_ns) is a safe
// point where the lock checks this process's hold (lock/device_lock.hpp, check_hold): past
// VRAMSWAP_MAX_HOLD while others wait, or asked to release by an operator, it says so in
// this process's log, once per hold.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include "core/backend.hpp"
#include "core/page_store.hpp"
#include "core/pager.hpp"
#include "lock/device_lock.hpp"
#include "pool/pool_connection.hpp"
#include "pool/pool_frame_source.hpp"
#include "runtime/session.hpp"

namespace vramswap::detail {

struct session_stats {
  pager_stats pager;
  uint64_t disk_bytes = 0;        // of pager.host_bytes, those whose only copy is in the swap file
  uint64_t acquires = 0;
  uint64_t evictions_served = 0;  // frames evicted for other processes
  uint64_t frames_asked_ahead = 0;       // frames other processes were asked to evict before our acquire
  uint64_t frames_asked_at_acquire = 0;  // frames other processes were asked to evict during our acquire
  uint64_t host_pinned_bytes = 0;  // the host tier's own pinned slots, used or free
  double acquire_seconds = 0;     // total time from acquire() call to return, lock wait included
  double lock_wait_seconds = 0;   // of which waiting for the lock
  // CLOCK_MONOTONIC instants of the last switch, to split a handoff into its stages:
  uint64_t last_release_call_ns = 0;   // release() entered
  uint64_t last_synced_ns = 0;         // release(): the device synchronized (after the handoff)
  uint64_t last_unlock_ns = 0;         // release() about to hand the lock on
  uint64_t last_lock_granted_ns = 0;   // acquire(): the lock was ours
  uint64_t last_resident_ns = 0;       // acquire(): memory resident, about to return
};

class device_session final : public session {
 public:
  // Connect to `device`'s pool (starting vramswapd when none runs), open its lock, make the
  // pager. Errors say what failed (no server, version mismatch, a bad option, ...).
  static int open(int device, std::unique_ptr<device_session>* out);
  ~device_session() override;

  bool oversubscribed() const noexcept override { return false; }
  bool mapped_without_lock() const noexcept override { return false; }
  int acquire(lock_priority priority = lock_priority::normal, int64_t timeout_ns = -1, acquire_info* info = nullptr) override;
  int release() override;
  bool holding() const noexcept override { return lock_.held(); }
  hold_check check_hold() noexcept override { return lock_.check_hold(); }
  device_lock* gang_lock() noexcept override { return rank_ == nullptr ? &lock_ : nullptr; }
  int set_rank_gang(std::unique_ptr<rank_gang> gang) override;
  const rank_gang* joined_gang() const noexcept override { return rank_.get(); }
  void asking(lock_priority priority, acquire_start* out) noexcept override;
  void gave_up(const acquire_start& start) noexcept override;
  int granted(lock_priority priority, const acquire_start& start, const acquire_info& info) override;
  bool resident() const noexcept override { return memory().resident(); }
  int keep_resident() override;
  bool keeps_resident() const noexcept override { return kept_resident_.load(std::memory_order_acquire); }
  // Total: the pool's bytes; free: what this process's live pages (resident or saved) leave of it.
  void memory_info(uint64_t* free_bytes, uint64_t* total_bytes) const override;
  void fill_stats(vramswap_stats_t* out) const override;

  session_stats stats() const;

 private:
  device_session() = default;
  int build(pool_member& member, frame_source** frames, page_store** store, pager_config* cfg) override;
  void opened() override;
  void serve(uint32_t requests_seen) override;
  void leaving() noexcept override;
  int bring_memory_in();
  void hand_on(uint64_t called_ns, uint64_t evict_start_ns, uint64_t bytes_out_before);
  uint64_t saved_past_host_tier() const noexcept;
  // Observability: publish where the saved pages are (host / disk bytes).
  void publish_store() noexcept;

  // Eviction ahead of need (pool_frame_source::ask_ahead), from the service thread.
  void ask_ahead() noexcept;

  bool eager_release_ = false;
  bool evict_ahead_ = true;
  bool strict_ = false;
  uint64_t evict_timeout_ns_ = 0;
  device_lock lock_;
  std::unique_ptr<rank_gang> rank_;  // set: this process is a rank of a gang on this device
  std::unique_ptr<pool_frame_source> frames_;
  std::unique_ptr<page_store> store_;
  uint32_t depth_ = 0;  // re-entry count, touched by the holding thread only
  std::atomic<bool> kept_resident_{false};  // keep_resident(): for the rest of the session

  mutable std::mutex mutex_;  // acquire/release vs the eviction service
  session_stats stats_;
  // The eviction service's failure state: after an eviction fails (a full swap disk, a
  // failing device), the same requests are tried again only after a while, or at once on a
  // new request. Touched by the service thread only.
  bool evict_failing_ = false;
  uint64_t evict_retry_at_ns_ = 0;
  uint32_t evict_failed_at_requests_ = 0;
};

}  // namespace vramswap::detail
