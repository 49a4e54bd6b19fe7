// The order of a device's queue: which waiting slot is granted next. Shared by the single
// acquire (lock_queue.cpp) and the gang acquire (gang_acquire.cpp), which must agree.
#pragma once

#include <algorithm>
#include <cstdint>

#include "lock/segment_layout.hpp"

namespace vramswap::detail::lock_layout {

// Is slot `a` served before slot `b`? Higher class first, then lower ticket.
inline bool served_before(const waiter_slot& a, const waiter_slot& b) {
  const uint32_t pa = class_of(a.priority.load(std::memory_order_relaxed));
  const uint32_t pb = class_of(b.priority.load(std::memory_order_relaxed));
  if (pa != pb) return pa > pb;
  return a.ticket.load(std::memory_order_relaxed) < b.ticket.load(std::memory_order_relaxed);
}

// Is slot `s` in the order at all? Waiting, and not a gang member whose gang is still forming.
inline bool in_order(const waiter_slot& s) {
  return s.state.load(std::memory_order_relaxed) == slot_waiting &&
         (s.priority.load(std::memory_order_relaxed) & k_gang_forming) == 0;
}

inline bool is_gang(const waiter_slot& s) { return (s.priority.load(std::memory_order_relaxed) & k_gang_member) != 0; }

// The waiting slot among slots[0, end) to grant now: the best by served_before, unless that
// one carries a penalty (behind_ticket) while a slot that waited for it still waits; then
// the best of those instead, by the same rule again. Each substitute has a lower ticket than
// the slot it stands in for, so the choice ends, at a slot that is granted. Relaxed reads:
// under the mutex this is the decision, without it a hint.
//
// Gangs (docs/lock.md, "Gangs"): a gang member never carries a penalty and is never a
// substitute, so when the choice is a gang member it is the best slot by served_before.
// That keeps the order of gangs the same on every device (their tickets were taken under
// all their devices' mutexes at once), which is what makes gangs deadlock-free.
inline uint32_t choose_next(const waiter_slot* slots, uint32_t end) {
  uint32_t best = k_no_slot;
  for (uint32_t i = 0; i < end; ++i) {
    if (!in_order(slots[i])) continue;
    if (best == k_no_slot || served_before(slots[i], slots[best])) best = i;
  }
  while (best != k_no_slot) {
    const uint64_t behind = slots[best].behind_ticket.load(std::memory_order_relaxed);
    if (behind == 0 || is_gang(slots[best])) break;
    const uint64_t below = std::min(behind, slots[best].ticket.load(std::memory_order_relaxed));
    uint32_t substitute = k_no_slot;
    for (uint32_t i = 0; i < end; ++i) {
      if (!in_order(slots[i]) || is_gang(slots[i])) continue;
      if (slots[i].ticket.load(std::memory_order_relaxed) >= below) continue;
      if (substitute == k_no_slot || served_before(slots[i], slots[substitute])) substitute = i;
    }
    if (substitute == k_no_slot) break;
    best = substitute;
  }
  return best;
}

}  // namespace vramswap::detail::lock_layout
