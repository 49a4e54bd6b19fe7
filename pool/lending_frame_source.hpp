// lending_frame_source: the frames of an oversubscribed (low-priority) process.
//
// Such a process (VRAMSWAP_OVERSUBSCRIBE=1) runs without the device lock and must never fail
// an allocation for want of pool frames while host memory lasts. take() therefore gives, in
// this order:
//   1. a free pool frame, marked lent to this member (free -> lent(me), one CAS; a lock
//      holder may ask for it back at any time, before any idle frame), unless a lock user is
//      on its way to a turn (lock_user_on_its_way): the free frames are about to be its;
//   2. a host frame (backend::create_host_frame: cuMemCreate in host memory, reached by the
//      device over its link), up to VRAMSWAP_OVERSUBSCRIBE_LIMIT bytes in all;
//   3. err_out_of_memory, saying which limit was hit.
// It never waits: an oversubscribed process asks nobody to evict anything.
//
// Host frames given back are kept as spares, and taken before new ones: creating a host
// frame pins its memory, milliseconds per frame (one at a time: the driver
// does not create them faster from several threads), which a reclaim pays per page, while
// the lock holder waits. Spares count against the limit like frames in use (in use + spare
// <= limit always); the session releases them when no reclaim came for a while.
//
// Host frames made ahead: the session also makes spares before any reclaim asks
// (make_spares, from its service thread while no reclaim runs), as many as the pool frames
// lent to it, so that a reclaim takes spares only and creates no frame while the lock
// holder waits. They are spares like the others: in the limit, taken first by allocations.
//
// Requested frames (a lock holder wants them) are found with frames().requested_of_me(); the session
// moves their pages into host frames (pager::demote_frames) and gives them back (-> free).
// When the pool has free frames again, take_pool_frame() hands one out for a promotion
// (which the session makes only while no lock user is on its way to a turn).
//
// Thread-safety: take/give_back run under the pager's mutex, the rest under the session's;
// host frames may be taken from several threads at once (the limit is reserved with a CAS,
// the spares are under a mutex).
// The byte count of host frames is atomic (read by the memory-info view without locks).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "core/backend.hpp"
#include "core/frame_source.hpp"
#include "pool/member_frames.hpp"
#include "pool/pool_segment.hpp"

namespace vramswap::detail {

class lending_frame_source final : public frame_source {
 public:
  // `local[i]` is this process's handle of pool frame i; `host_limit`: bytes of host frames
  // this process may hold.
  lending_frame_source(backend& be, pool_segment& pool, uint32_t me, std::vector<frame_id> local, uint64_t host_limit);
  ~lending_frame_source();  // releases the spare host frames
  lending_frame_source(const lending_frame_source&) = delete;
  lending_frame_source& operator=(const lending_frame_source&) = delete;

  int take(int device, size_t size, frame_id* out) override;
  int give_back(frame_id frame) override;
  // Pool frames are scrubbed (they go to another process next); host frames are released.
  bool scrub_before_give_back(frame_id frame) const override { return is_pool_frame(frame); }

  // A free pool frame, lent to this member, or false when none is free (never waits).
  bool take_pool_frame(frame_id* out);
  // A host frame: a spare one when there is one, else a new one within the limit
  // (err_out_of_memory beyond it). *was_spare (optional): which it was. Thread-safe.
  int take_host_frame(int device, size_t size, frame_id* out, bool* was_spare = nullptr);
  // `count` host frames (spares first), appended to *out: all of them on success; on a
  // failure (the limit, host memory) the first error, and *out holds those taken before it.
  // *spares_used (optional): how many were spares.
  int take_host_frames(int device, size_t size, size_t count, std::vector<frame_id>* out, size_t* spares_used = nullptr);
  // Make up to `count` new host frames and keep them as spares (frames made ahead of a
  // reclaim). Asks `stop` before each frame and ends when it says so. Stops quietly where
  // one more would pass the limit (it bounds frames made ahead, not an error). *made: how
  // many were made. Returns the first failure of the backend (the frames made before it
  // are kept).
  int make_spares(int device, size_t size, size_t count, const std::function<bool()>& stop, size_t* made);
  // Release spare host frames beyond `keep` of them (the session does when no reclaim came
  // for a while, keeping the ones made ahead). Returns how many.
  size_t release_spares(size_t keep = 0);
  size_t spare_count() const;
  // New host frames created by take_host_frame (for allocations and reclaims, not made
  // ahead), since this source was made.
  uint64_t frames_created() const noexcept { return created_.load(std::memory_order_relaxed); }
  // Placement by use swaps pages between pool and host frames without lending more or
  // fewer: while keeping, a pool frame given back that is still lent to this process (no
  // lock holder asked for it) stays lent, kept for take_kept_pool_frame, instead of going
  // back to the pool. A frame a lock holder asks for is never kept: given back, it goes to
  // the pool, and one asked for while kept goes there at take_kept_pool_frame or at
  // release_kept_pool_frames. The pager's mutex orders these with give_back.
  void keep_pool_frames(bool on) noexcept { keeping_.store(on, std::memory_order_release); }
  bool take_kept_pool_frame(frame_id* out);
  // Every kept frame back to the pool (the end of a swap round). Returns how many.
  size_t release_kept_pool_frames();
  bool is_pool_frame(frame_id frame) const { return view_.is_pool_frame(frame); }
  // This member's view of the frame table: the pool frames lock holders asked this process
  // to give back (requested_of_me), the free ones, ... (pool/member_frames.hpp).
  const member_frames& frames() const noexcept { return view_; }
  // Requests whose requester is no longer a member of the pool (it exited or died while it
  // waited, e.g. after VRAMSWAP_EVICT_TIMEOUT) are taken back: requested -> lent(me), so
  // that nobody's pages move for a process that is gone. Returns how many.
  uint32_t withdraw_abandoned_requests();
  uint32_t free_pool_frames() const { return view_.free_frames(); }
  // Whether a lock user is on its way to a turn: queued for the lock, or holding it and
  // bringing its memory in. The pool's free frames are then about to be its (it may have
  // asked this process for them ahead of its grant), so a promotion must not take them.
  // Reads other members' slots: a hint.
  bool lock_user_on_its_way() const noexcept;
  // Bytes of host frames backing pages now (spares not counted).
  uint64_t host_bytes() const noexcept { return host_bytes_.load(std::memory_order_relaxed); }
  // Bytes of spare host frames: given back, kept for the next reclaim.
  uint64_t spare_bytes() const noexcept { return spare_bytes_.load(std::memory_order_relaxed); }
  // Host memory pinned for this process's pages: host frames in use and spare.
  uint64_t pinned_bytes() const noexcept { return host_bytes() + spare_bytes(); }
  uint64_t host_limit() const noexcept { return host_limit_; }
  uint32_t member() const noexcept { return me_; }

 private:
  backend& be_;
  pool_segment& pool_;
  const uint32_t me_;
  member_frames view_;
  const uint64_t host_limit_;
  std::atomic<uint64_t> host_bytes_{0};
  // Reserve `size` bytes of the limit for a new frame (spare_mutex_ held): host + spare +
  // size <= limit, else err_out_of_memory naming the limit.
  int reserve_locked(size_t size);

  mutable std::mutex spare_mutex_;
  std::vector<frame_id> spares_;  // host frames given back or made ahead, kept for reuse
  // Counts spares and frames being made ahead (reserved before they exist).
  std::atomic<uint64_t> spare_bytes_{0};
  std::atomic<uint64_t> created_{0};
  std::atomic<bool> keeping_{false};
  std::vector<frame_id> kept_;  // pool frames kept lent for a swap (under spare_mutex_)
};

}  // namespace vramswap::detail
