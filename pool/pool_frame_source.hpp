// pool_frame_source: the pager's frames come from the device's shared pool.
//
// Every process imported every pool frame once (pool_connection); frame i of the pool is
// local frame_id local[i] here. Which process may map which frame is decided in the pool
// segment's frame table (pool/pool_layout.hpp), one compare-and-swap per transition.
//
// Taking (the lock holder; outside the lock, see below): prepare(n) counts the free frames and, for the
// shortfall, asks the owners of frames lent to oversubscribed processes, then of idle frames,
// the owner predicted to acquire furthest from now first (pool/victim_order.hpp), to evict
// them (lent/idle -> requested, then a futex wake of each owner's pager thread). Frames
// already asked of their owners, by anyone, count as coming: they come free. take() returns a free frame
// as soon as one exists, sleeping on the pool's "frame freed" futex in between: the owners
// free frames one by one as their copies out complete, while the pager maps and copies in
// each frame it gets, so the two processes' transfers overlap.
//
// A requested frame whose owner neither frees it nor dies within VRAMSWAP_EVICT_TIMEOUT
// is never taken by force: take() fails with err_timeout naming the owner's pid. A dead
// owner's frames are freed by the pool server (scrubbed first).
//
// Outside the lock (try_take_not_resident): a process that does not hold the lock may take
// a free frame, and only a free one, never waiting nor asking anyone; it goes straight to
// idle (this process's, stamped with the pool clock), so a holder that needs it asks for it
// like any other idle frame, and the owner's service thread saves its page first. At the
// owner's next acquire it becomes active with the rest (reclaim_own).
//
// Ahead of need (ask_ahead): a member not holding the lock that is predicted to acquire next
// asks, for what its next acquire will need and the pool does not have free, the owners
// predicted to acquire after it, furthest first, so that its acquire finds the frames free.
// A member predicted without a gap of its own (it acquired once) asks only within one mean
// gap of its prediction.
//
// Giving back: frames are zeroed by the pager before they are given back
// (scrub_before_give_back), then go to free and every waiter is woken.
//
// Thread-safety: take/give_back/prepare are called under the pager's mutex; the session's
// reclaim_own/release_own and the view's requested_of_me run under the session's. The frame table itself is
// shared-memory atomics.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/frame_source.hpp"
#include "pool/member_frames.hpp"
#include "pool/pool_segment.hpp"

namespace vramswap::detail {

class pool_frame_source final : public frame_source {
 public:
  // `local[i]` is this process's handle of pool frame i. `pool_alive` is asked while
  // waiting, so that a pool gone for good (pool_connection::pool_alive) ends the wait with a
  // clear error. A stopped server alone does not end it: members keep freeing frames, and
  // the next server repairs those of members that died meanwhile.
  pool_frame_source(pool_segment& pool, uint32_t me, std::vector<frame_id> local, uint64_t evict_timeout_ns,
                    std::function<bool()> pool_alive);

  int take(int device, size_t size, frame_id* out) override;
  int try_take(int device, size_t size, frame_id* out) override;
  // A free frame, taken straight to idle(me) (stamped as if used now): for memory allocated
  // while this process does not hold the lock. Never waits, never asks anyone; a holder
  // that needs the frame asks for it like any idle frame, and our service thread saves the
  // page first.
  int try_take_not_resident(int device, size_t size, frame_id* out) override;
  int give_back(frame_id frame) override;
  int prepare(int device, size_t count) override;
  bool scrub_before_give_back(frame_id) const override { return true; }

  // At acquire: this process's idle or requested frames become active again (an eviction
  // asked for but not yet done is cancelled: the frame keeps backing our page).
  void reclaim_own();
  // At release: this process's active frames become idle, stamped with the pool clock.
  void release_own();
  // This member's view of the frame table (requested_of_me, owned, ...): pool/member_frames.hpp.
  const member_frames& frames() const noexcept { return view_; }
  // Eviction ahead of need: when this member is next (it waits for the lock with no one
  // queued before it, or its own history predicts it next; no one else is bringing memory
  // in and no other request is in flight), ask the owners that come after it (every idle
  // one, while it waits for the lock) for what `need` frames the free ones do not cover,
  // furthest predicted first. Returns the frames asked for (0: nothing to do, or not ours to do).
  uint32_t ask_ahead(size_t need, uint64_t now_ns);
  // Frames this member asked others for: ahead of its acquires, and during them (prepare).
  uint64_t frames_asked_ahead() const noexcept { return asked_ahead_.load(std::memory_order_relaxed); }
  uint64_t frames_asked_at_acquire() const noexcept { return asked_at_acquire_.load(std::memory_order_relaxed); }
  uint32_t member() const noexcept { return me_; }

 private:
  // `bound`: what ended the wait (VRAMSWAP_EVICT_TIMEOUT, or the acquire's own timeout).
  int timed_out_error(uint64_t waited_ns, const char* bound) const;
  // Ask for up to `wanted` of `frames` (in that order) that are still lent or idle; wake
  // their owners. Returns how many were asked.
  uint32_t ask_in_order(const std::vector<uint32_t>& frames, uint32_t wanted);

  pool_segment& pool_;
  const uint32_t me_;
  member_frames view_;
  const uint64_t evict_timeout_ns_;
  std::function<bool()> pool_alive_;
  std::atomic<uint64_t> asked_ahead_{0};
  std::atomic<uint64_t> asked_at_acquire_{0};
};

}  // namespace vramswap::detail
