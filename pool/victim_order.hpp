// victim_order: whose idle frames a member asks for, and whether it is the member predicted
// to acquire the device next.
//
// Each member publishes in its member slot (pool/pool_layout.hpp, its last line) when it last
// released the lock, when it last called acquire(), and a moving mean of its idle gaps (from
// a release to its next acquire() call). From these a member's next acquire is predicted:
//   - a member at the lock (waiting for it, bringing its memory in, or holding it): its
//     acquire() call, which is in the past, so it sorts before everyone;
//   - a member that never released: now (it is allocating before its first turn, or about
//     to take it);
//   - otherwise its last release plus its idle gap once it has measured two (its rhythm:
//     the first gap follows its first turn, most often its setup);
//   - with one gap of its own, plus the others' mean rhythm where some member has one, else
//     plus its one gap;
//   - before it has a gap (it acquired only once), plus the others' mean gap, or plus 0 when
//     nobody has one yet.
// The last rule makes the order most-recently-released-first (MRU) when there is no history
// at all, which is right for jobs that take turns in a cycle or periodically: the one that
// released last comes back last. Least recently used is the worst choice there.
//
// order(): the frames to ask for, in the order to ask for them: frames lent to oversubscribed
// members first (they run without the lock and take no turns), then idle frames of the
// others, owner by owner, furthest predicted next acquire first; ties by the more recent
// release, then by member index; within an owner by frame index. Deterministic for a given
// frame table and member table.
//
// All of it reads hints (relaxed atomics of other processes): a stale word orders an owner
// wrongly, which costs an eviction that was not needed yet, never a frame or a byte.
#pragma once

#include <cstdint>
#include <vector>

#include "pool/pool_layout.hpp"
#include "pool/pool_segment.hpp"

namespace vramswap::detail::victim_order {

struct prediction {
  uint64_t next_ns = 0;      // predicted CLOCK_MONOTONIC of its next acquire() call
  uint64_t released_ns = 0;  // its last release (0: none), for ties
  bool at_lock = false;      // waiting for the lock, restoring or holding it now
  bool from_history = false; // next_ns from its own idle gaps (false: the others' mean gap, or none)
};

// The live members' mean idle gap: of those with a rhythm (two gaps or more) where any has
// one (settled), else of those with one gap; 0 when none has a gap.
struct mean_gap_of_members {
  uint64_t ns = 0;
  bool settled = false;
};
mean_gap_of_members mean_gap(const pool_segment& pool) noexcept;
// `others`: mean_gap(pool), read once by a caller that predicts several members.
prediction predict(const pool_segment& pool, uint32_t member, uint64_t now_ns, const mean_gap_of_members& others) noexcept;

struct options {
  uint32_t me = pool_layout::k_no_member;  // never its own frames
  bool lent = true;                        // include frames lent to oversubscribed members
  // Only owners predicted to acquire strictly after this instant (and never one at the
  // lock); 0: every owner.
  uint64_t only_after_ns = 0;
  // With only_after_ns: the asker waits for the lock, so every owner not at the lock comes
  // after it whatever its prediction (it would queue behind: the queue is FIFO within a
  // priority class), and all of them may be asked, furthest predicted first.
  bool asker_queued = false;
};
std::vector<uint32_t> order(const pool_segment& pool, uint64_t now_ns, const options& o);

}  // namespace vramswap::detail::victim_order
