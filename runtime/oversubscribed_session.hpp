// oversubscribed_session: the oversubscription policy of a session (runtime/session.hpp): a
// low-priority process's memory on one device.
//
// VRAMSWAP_OVERSUBSCRIBE=1 makes a process low priority: it never takes the device lock and
// runs beside whoever holds it. Its memory is always mapped, so its kernels may run at any
// time: every page is backed either by a pool frame lent to it (free frames only; it never
// asks anyone to evict) or by a host frame (host memory at the same address, reached by the
// device over its link), up to VRAMSWAP_OVERSUBSCRIBE_LIMIT (pool/lending_frame_source.hpp).
// Allocations therefore succeed while host memory lasts, however small the pool.
//
// Reclaim (demotion): a lock holder that needs frames asks for lent frames first. The
// member's service thread (pool/pool_member.hpp) wakes, takes host frames for them (spares first: host frames
// are kept for reuse, pool/lending_frame_source.hpp), closes the launch gate
// (core/launch_gate.hpp: no new device work of this process starts, and the work inside
// drains), synchronizes the device, and moves each asked-for page into a host frame
// (pager::remap_pages), scrubbing and freeing its pool frame at once. It keeps the gate
// closed for requests already waiting, and may wait k_burst_linger_ns for a next one (a
// lock holder asks once per allocation), so that a burst waits for this process's running
// kernels once; the wait is made only where it can save that (linger_pays). The
// process's kernels then run on at the same addresses, slower, reading host memory.
//
// Host frames made ahead: while no reclaim runs (from a second after the last request), the
// service thread makes host frames ahead of one (spares), as many as this process's pages in lent pool frames (bounded by
// VRAMSWAP_OVERSUBSCRIBE_AHEAD and, with the frames in use, by VRAMSWAP_OVERSUBSCRIBE_LIMIT),
// for k_ahead_slice_ns at a time with as long a pause after it, so that it takes at most
// half of one thread and a reclaim waits for at most one frame being made. A reclaim then
// takes spares only, and creates no frame while the lock holder waits.
//
// Promotion: when the pool has had free frames for k_promote_quiet_ns with no request for
// ours (no lock holder is short of frames), pages in host frames move back into free pool
// frames the same way, up to the number free. Their host frames become spares; those beyond
// the number kept ahead (above) are released when no reclaim came for k_spare_keep_ns.
//
// Placement by use (VRAMSWAP_OVERSUBSCRIBE_PLACEMENT, runtime/oversubscribed_placement.cpp):
// the shim records which pages kernel launches use (runtime/use_tracker.hpp); once a second,
// with no request pending, the service thread observes them, and when the policy
// (runtime/placement_policy.hpp) finds a sustained difference that pays for a closing of the
// gate, the most used pages in host frames swap with the least used in pool frames under one
// closing, the number of lent frames unchanged.
//
// Compute (VRAMSWAP_OVERSUBSCRIBE_COMPUTE): with yield (the default) or share:N, the session
// registers the device's lock with the launch gate, whose entry then holds this process's
// new device work back while a lock holder holds (core/launch_gate.hpp). The lock stays open
// for the life of the process (a thread may be asleep on its holder word at any time).
//
// All of it needs the gate: the preload shim (libvramswap_preload.so) brackets the process's
// device work with it. Without the shim nothing does, and the session says so once.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/backend.hpp"
#include "core/launch_gate.hpp"
#include "core/pager.hpp"
#include "pool/lending_frame_source.hpp"
#include "runtime/placement_policy.hpp"
#include "runtime/session.hpp"
#include "runtime/use_tracker.hpp"
#include "swap/host_tier.hpp"

namespace vramswap::detail {

class device_lock;

struct oversubscribed_stats {
  uint64_t demotions = 0;        // requests served (batches of pages moved to host frames)
  uint64_t bursts = 0;           // closings of the gate for them (a burst serves requests that follow closely)
  uint64_t pages_demoted = 0;
  uint64_t pages_promoted = 0;
  double demote_seconds = 0;     // total time the gate was closed for demotions (bursts of requests)
  double last_demote_seconds = 0;
  uint64_t host_frame_bytes = 0;  // pages in host frames now
  uint64_t pool_frame_bytes = 0;  // pages in lent pool frames now
  uint64_t spare_host_bytes = 0;  // host frames kept for the next reclaim (given back or made ahead)
  uint64_t host_frames_made_ahead = 0;         // host frames made by the service thread before a reclaim asked
  uint64_t host_frames_created_in_reclaim = 0;  // host frames a reclaim had to create while the lock holder waited
  // The burst's wait for a next request (k_burst_linger_ns), after a request was served and
  // none was waiting: waits made, waits a request ended, the time they took; and the times a
  // burst ended at once instead, without waiting (nothing a wait could save).
  uint64_t lingers = 0;
  uint64_t lingers_caught = 0;
  double linger_seconds = 0;
  uint64_t lingers_skipped = 0;
  // Compute yielded to lock holders (VRAMSWAP_OVERSUBSCRIBE_COMPUTE; the process's launch
  // gate, all devices): launches that waited, and the time they waited (summed over threads).
  uint64_t yield_waits = 0;
  double yield_seconds = 0;
  // Placement by use (VRAMSWAP_OVERSUBSCRIBE_PLACEMENT; runtime/oversubscribed_placement.cpp):
  // rounds that swapped pages, rounds the cost model skipped (their gain was below their
  // cost), pages moved into pool frames and out of them, the time the gate was closed for
  // it; launches whose arguments were observed (all devices), and sampled launches whose
  // arguments could not be read.
  uint64_t placement_rounds = 0;
  uint64_t placement_rounds_skipped = 0;
  uint64_t pages_placed_in = 0;
  uint64_t pages_placed_out = 0;
  double placement_seconds = 0;
  uint64_t launches_observed = 0;
  uint64_t launches_unreadable = 0;
};

class oversubscribed_session final : public session {
 public:
  static int open(int device, std::unique_ptr<oversubscribed_session>* out);
  ~oversubscribed_session() override;

  bool oversubscribed() const noexcept override { return true; }
  bool mapped_without_lock() const noexcept override { return true; }
  // The lock is not this process's to take: err_invalid_argument, naming VRAMSWAP_OVERSUBSCRIBE.
  int acquire(lock_priority priority = lock_priority::normal, int64_t timeout_ns = -1, acquire_info* info = nullptr) override;
  // Never holding, so never released: err_not_owner.
  int release() override;
  bool holding() const noexcept override { return false; }
  bool resident() const noexcept override { return true; }  // every page is in a pool or host frame
  int keep_resident() override;
  // The memory-info view (docs/oversubscription.md): total = pool + the host limit; free =
  // free pool frames + the host limit not yet used.
  void memory_info(uint64_t* free_bytes, uint64_t* total_bytes) const override;
  void fill_stats(vramswap_stats_t* out) const override;

  oversubscribed_stats stats() const;
  // Bytes of [ptr, ptr + size) in pool frames now (whole pages; the tests look where
  // placement by use put an allocation).
  uint64_t pool_bytes_of(device_ptr ptr, uint64_t size) const;

 private:
  oversubscribed_session() = default;
  int build(pool_member& member, frame_source** frames, page_store** store, pager_config* cfg) override;
  void opened() override;
  void serve(uint32_t requests_seen) override;
  // Demotion: serve `wanted` and the requests that follow it closely, under one closing of
  // the gate. Returns the first failure (its pages stay where they are, still requested).
  int serve_requests(std::vector<frame_id> wanted);
  // serve_requests's steps: the requests served with the gate closed (`ready`: the host
  // frames made ahead, taken first; `gap_ns` as for linger_pays), and the burst in the stats
  // (under mutex_).
  struct reclaim_burst;
  int serve_burst(std::vector<frame_id> wanted, uint64_t gap_ns, std::vector<frame_id>* ready, reclaim_burst* b);
  void count_burst(const reclaim_burst& b, double closed_s, uint64_t created_before);
  int promote(uint32_t at_most);
  // How many spares this process keeps ready for a reclaim: its pages in pool frames,
  // bounded by VRAMSWAP_OVERSUBSCRIBE_AHEAD.
  size_t ahead_target() const;
  // Whether this process's launches wait at the gate now whatever the gate does: the yield
  // policy, and a lock holder that claims the device holds (a hint, read without a lock).
  bool launches_held_by_holder() const;
  // After a request of a burst was served and none is waiting: whether to keep the gate
  // closed for a next one (k_burst_linger_ns). `gap_ns`: how long before the burst's first
  // request the previous burst ended (UINT64_MAX: none before).
  bool linger_pays(uint64_t gap_ns) const;
  // Make host frames ahead of a reclaim until the target, a new request after `seen`, the
  // limit, or k_ahead_serve_ns.
  void make_frames_ahead(uint32_t seen);
  // Placement by use (runtime/oversubscribed_placement.cpp). start_placement: the use
  // tracker, at open. place_by_use: one round (the counts decay; pages swap when it pays).
  // host_frames_hottest_first: pages in host frames, most used first, for promotion.
  void start_placement();
  int place_by_use();
  // place_by_use's steps: the observation (the resident pages, their uses, which are
  // temporaries); a round the policy planned (host frames, the swaps, the books); its swaps
  // with the gate closed, chunk by chunk until a request after `seen` (the member's count
  // before the round) comes.
  struct placement_moves;
  std::vector<placement_page> observe_pages(uint64_t frame_size);
  int run_placement_round(const placement_plan& plan, uint64_t frame_size);
  int swap_placement_pairs(const placement_plan& plan, size_t pairs, uint32_t seen, std::vector<frame_id>* ready,
                           placement_moves* moved);
  std::vector<frame_id> host_frames_hottest_first(uint32_t at_most) const;
  void placement_summary() const;

  uint64_t limit_ = 0;  // VRAMSWAP_OVERSUBSCRIBE_LIMIT
  uint64_t ahead_bytes_ = UINT64_MAX;  // VRAMSWAP_OVERSUBSCRIBE_AHEAD (unset: no bound of its own)
  launch_gate::yield_policy compute_policy_ = launch_gate::yield_policy::yield;  // VRAMSWAP_OVERSUBSCRIBE_COMPUTE
  unsigned compute_share_ = 0;
  int yield_handle_ = -1;  // this device's lock in the launch gate's yield sources
  const device_lock* yield_lock_ = nullptr;  // that lock (kept for the process's life), or null with compute free
  std::unique_ptr<lending_frame_source> frames_;
  std::unique_ptr<host_tier> store_;  // the pager needs one; an oversubscribed pager never evicts
  mutable std::mutex mutex_;  // stats
  oversubscribed_stats stats_;
  // The service thread's state (touched by it only): when the last request came, and after
  // a demotion fails (host memory or VRAMSWAP_OVERSUBSCRIBE_LIMIT exhausted), when to try
  // the same requests again.
  uint64_t last_request_ns_ = 0;
  uint64_t last_burst_end_ns_ = 0;  // 0: no burst yet
  bool failing_ = false;
  uint64_t retry_at_ns_ = 0;
  uint32_t failed_at_requests_ = 0;
  // Making frames ahead: after a failure of the backend, when to try again; whether the
  // target was reached and said (logged once per filling).
  bool ahead_failing_ = false;
  uint64_t ahead_retry_at_ns_ = 0;
  bool ahead_ready_said_ = false;
  // Placement by use: the tracker (null when VRAMSWAP_OVERSUBSCRIBE_PLACEMENT=0), the
  // service thread's last counts (per page, taken each observation), the policy (its
  // history of the pages, its rounds' measurements), when the next observation is due.
  bool placement_ = true;
  std::unique_ptr<use_tracker> tracker_;
  std::vector<uint32_t> starts_;
  placement_policy policy_;
  std::vector<uint32_t> frees_seen_;    // per page: the pager's count of frees at the last observation
  std::vector<uint8_t> freed_periods_;  // per page: periods in a row in which it was freed (a temporary from 2)
  uint64_t next_placement_ns_ = 0;
};

}  // namespace vramswap::detail
