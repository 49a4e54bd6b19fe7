// The queue of a device's lock: slots and tickets. acquire() takes a free slot (and its
// lease), publishes it as waiting with the next ticket, and dispatch grants the best waiter
// (lock/queue_order.hpp) whenever nobody holds the lock; a waiter that gives up leaves
// without the mutex (withdraw). Observers read the queue: describe_queue for errors and
// notices, snapshot for `vramswap status`. The wait for the grant is in lock_wait.cpp.
#include "lock/device_lock.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "core/status.hpp"
#include "lock/crash_points.hpp"
#include "lock/futex.hpp"
#include "lock/lease_mutex.hpp"
#include "lock/liveness_lease.hpp"
#include "lock/lock_messages.hpp"
#include "lock/ownership.hpp"
#include "lock/process_identity.hpp"
#include "lock/queue_order.hpp"
#include "lock/segment_layout.hpp"
#include "lock/shared_segment.hpp"

namespace vramswap::detail {
using namespace lock_layout;

namespace {

bool valid_priority(lock_priority p) { return p == lock_priority::normal || p == lock_priority::high; }

// err_invalid_argument unless an acquire of a lock (`open` or not) may go ahead with these.
int check_acquire(bool open, lock_priority priority, int64_t timeout_ns) {
  if (!open) {
    return fail(err_invalid_argument, "device_lock::acquire: this lock is not open; call device_lock::open first");
  }
  if (!valid_priority(priority)) {
    return fail(err_invalid_argument, "device_lock::acquire: priority %u is not a lock_priority (normal=1, high=2)",
                static_cast<unsigned>(priority));
  }
  if (timeout_ns < -1) {
    return fail(err_invalid_argument,
                "device_lock::acquire: timeout %lld ns is negative; use -1 to wait forever, 0 to only try",
                static_cast<long long>(timeout_ns));
  }
  return ok;
}

}  // namespace

// --- acquire ----------------------------------------------------------------------------

int device_lock::acquire(lock_priority priority, int64_t timeout_ns, acquire_info* info) noexcept {
  const uint64_t start_ns = monotonic_ns();
  if (info != nullptr) *info = acquire_info{};
  VS_TRY(check_acquire(segment_ != nullptr, priority, timeout_ns));
  VS_TRY(reopen_if_forked());
  process_identity me{};
  VS_TRY(current_process(&me));
  const pid_t tid = current_tid();
  if (held_by(me.pid, tid)) return reenter(info);

  const uint64_t deadline = deadline_after(start_ns, timeout_ns);
  queue_place place;
  VS_TRY(enqueue(priority, timeout_ns, start_ns, deadline, me, tid, &place));
  VS_TRY(wait_for_grant(place.slot, start_ns, timeout_ns, deadline));
  // The penalty is spent by this grant (unless a later long hold has set a new one).
  uint64_t spent = place.penalty;
  if (spent != 0) penalty_behind_.compare_exchange_strong(spent, 0, std::memory_order_relaxed);
  became_holder(place.slot, place.ticket, me.pid, tid, start_ns, info);
  return ok;
}

int device_lock::reenter(acquire_info* info) noexcept {
  if (depth_ == std::numeric_limits<uint32_t>::max()) {
    return fail(err_invalid_argument, "device_lock::acquire: re-entered %u times without release", depth_);
  }
  ++depth_;
  if (info != nullptr) info->reentered = true;
  return ok;
}

int device_lock::enqueue(lock_priority priority, int64_t timeout_ns, uint64_t start_ns, uint64_t deadline,
                         const process_identity& me, pid_t tid, queue_place* place) noexcept {
  lock_state* st = lock_state_of(segment_->base());
  waiter_slot* slots = slots_of(segment_->base());
  // The internal mutex is held for microseconds; a try or a short timeout still waits a
  // little for it rather than fail against a running owner.
  const uint64_t mutex_deadline = std::max(deadline, start_ns + static_cast<uint64_t>(k_mutex_try_ns));
  if (const int mrc = lock_mutex(mutex_deadline, /*interruptible=*/true); mrc != ok) {
    if (mrc == err_timeout && timeout_ns == 0) return add_context(err_busy, "device_lock::try_acquire: ");
    return mrc;
  }
  uint32_t mine = k_no_slot;
  if (const int trc = take_slot_locked(&mine); trc != ok) {
    unlock_mutex();
    return trc;
  }
  // A penalty from our last hold; one above our own ticket is left from a segment that was
  // removed and made anew since, and means nothing here.
  const uint64_t penalty = penalty_behind_.load(std::memory_order_relaxed);
  publish_slot_locked(mine, static_cast<uint32_t>(priority), me, tid, start_ns, penalty <= st->next_ticket ? penalty : 0, 0);
  waiter_slot& slot = slots[mine];
  VS_TRY(repair_for_short_wait_locked(mine, timeout_ns));
  if (st->holder_slot == k_no_slot) dispatch_locked(mine);
  const uint64_t my_ticket = slot.ticket;

  if (slot.state.load(std::memory_order_relaxed) != slot_holding && timeout_ns == 0) {
    return refuse_try_locked(mine, priority, my_ticket);
  }
  unlock_mutex();
  *place = queue_place{mine, my_ticket, penalty};
  return ok;
}

int device_lock::refuse_try_locked(uint32_t mine, lock_priority priority, uint64_t my_ticket) noexcept {
  lock_state* st = lock_state_of(segment_->base());
  waiter_slot& slot = slots_of(segment_->base())[mine];
  slot.state.store(slot_free, std::memory_order_release);
  at_crash_point(crash_point::timeout_slot_freed);
  --st->waiter_count;
  unlock_mutex();
  let_go_of_lease(mine);
  char queue[768];
  describe_queue(static_cast<uint32_t>(priority), my_ticket, queue, sizeof queue);
  return fail(err_busy, "device_lock::try_acquire: %s is taken: %s", segment_->name().c_str(), queue);
}

// --- slots and tickets ------------------------------------------------------------------

// A free slot whose lease we can take: one just freed may still be leased by its owner
// for a moment (it drops the lease after freeing the slot), another process's or ours.
// With the mutex held. err_busy when every slot is taken; a lease error as is.
int device_lock::take_slot_locked(uint32_t* out) noexcept {
  waiter_slot* slots = slots_of(segment_->base());
  // First the spare slot a release of this object kept, leased already (no system call).
  if (const uint32_t spare = segment_->spare_slot().exchange(k_no_slot, std::memory_order_acq_rel); spare != k_no_slot) {
    if (slots[spare].state.load(std::memory_order_relaxed) == slot_free) {
      *out = spare;
      return ok;
    }
    let_go_of_lease(spare);  // cannot happen while we lease it; never use it if it does
  }
  for (uint32_t i = 0; i < k_slot_count; ++i) {
    if (slots[i].state.load(std::memory_order_relaxed) != slot_free || segment_->own_leases().has(i)) continue;
    const int lrc = take_lease(segment_->lease_fd(), i, segment_->name().c_str());
    if (lrc == ok) {
      segment_->own_leases().add(i);
      *out = i;
      return ok;
    }
    if (lrc != err_busy) return lrc;
  }
  return fail(err_busy,
              "device_lock::acquire: all %u slots of %s are taken (that many threads already hold or wait "
              "for this device); retry later",
              k_slot_count, segment_->name().c_str());
}

// With the mutex held: fill slot `mine` (leased by us) and publish it as waiting with the
// next ticket. Publication order: fill the slot, then publish it with the state store.
void device_lock::publish_slot_locked(uint32_t mine, uint32_t priority_word, const process_identity& me, pid_t tid,
                                      uint64_t start_ns, uint64_t behind, uint64_t gang_id) noexcept {
  lock_state* st = lock_state_of(segment_->base());
  waiter_slot& slot = slots_of(segment_->base())[mine];
  slot.priority = priority_word;
  slot.ticket = st->next_ticket;
  st->next_ticket = slot.ticket + 1;
  slot.pid = me.pid;
  slot.tid = tid;
  slot.pid_start_time = me.start_time;
  slot.pid_ns = me.pid_ns;
  slot.uid = uid_;
  slot.enqueue_ns = start_ns;
  slot.dead_holder_pid = 0;
  slot.dead_holder_pid_ns = 0;
  slot.max_hold_ns.store(max_hold_ns_, std::memory_order_relaxed);
  slot.behind_ticket.store(behind, std::memory_order_relaxed);
  slot.granted_ns.store(0, std::memory_order_relaxed);
  slot.over_limit_since_ns.store(0, std::memory_order_relaxed);
  slot.release_requested_ns.store(0, std::memory_order_relaxed);
  slot.release_requester_pid.store(0, std::memory_order_relaxed);
  slot.release_requester_pid_ns.store(0, std::memory_order_relaxed);
  slot.release_requester_uid.store(0, std::memory_order_relaxed);
  slot.gang_id.store(gang_id, std::memory_order_relaxed);
  at_crash_point(crash_point::enqueue_slot_filled);
  slot.state.store(slot_waiting, std::memory_order_release);
  ++st->waiter_count;
  if (mine >= st->slot_high_water) st->slot_high_water = mine + 1;
  at_crash_point(crash_point::enqueue_published);
}

// --- dispatch and withdrawal ------------------------------------------------------------

// Grant the lock to the best waiter, if any; precondition: nobody holds it. Wakes that
// waiter's futex and nobody else's (not the caller's own slot, `caller_slot`: the caller is
// awake). Returns its slot, or k_no_slot.
uint32_t device_lock::dispatch_locked(uint32_t caller_slot) noexcept {
  lock_state* st = lock_state_of(segment_->base());
  waiter_slot* slots = slots_of(segment_->base());
  uint32_t best = k_no_slot;
  const uint64_t now = monotonic_ns();
  for (;;) {
    best = choose_next(slots, std::min(st->slot_high_water.load(), k_slot_count));
    if (best == k_no_slot) return k_no_slot;
    if (is_gang(slots[best])) {
      // A gang member is next: it is granted only with the rest of its gang, by its own
      // waiter, which this wakes to look (docs/lock.md, "Gangs"). The device idles until
      // then: the waiters behind the gang stay behind it (FIFO), which is what keeps a gang
      // from starving behind a stream of single-device users.
      futex_wake_one(&slots[best].state);
      return k_no_slot;
    }
    // Order: tell the grantee about a dead predecessor and when its hold begins, then grant
    // (the state change is the grant), then fix the hints, then forget the death. A
    // compare-and-swap, because a waiter leaves without the mutex (withdraw): if it just
    // left, choose again.
    slots[best].dead_holder_pid_ns = st->dead_holder_pid_ns;
    slots[best].dead_holder_pid = st->dead_holder_pid;
    slots[best].granted_ns.store(now, std::memory_order_relaxed);
    uint32_t expected = slot_waiting;
    if (slots[best].state.compare_exchange_strong(expected, slot_holding, std::memory_order_acq_rel)) break;
  }
  waiter_slot& next = slots[best];
  at_crash_point(crash_point::grant_state_stored);
  st->holder_slot = best;
  st->holder_granted_ns.store(now, std::memory_order_relaxed);
  if (st->waiter_count > 0) --st->waiter_count;
  st->dead_holder_pid = 0;
  at_crash_point(crash_point::grant_before_wake);
  if (best != caller_slot) futex_wake_one(&next.state);
  return best;
}

bool device_lock::withdraw(uint32_t mine) noexcept {
  lock_state* st = lock_state_of(segment_->base());
  waiter_slot& slot = slots_of(segment_->base())[mine];
  uint32_t expected = slot_waiting;
  if (!slot.state.compare_exchange_strong(expected, slot_free, std::memory_order_acq_rel)) return false;
  at_crash_point(crash_point::timeout_slot_freed);
  let_go_of_lease(mine);
  // A hint: never below zero; a death before this leaves it one high until the next repair.
  uint32_t n = st->waiter_count.load(std::memory_order_relaxed);
  while (n > 0 && !st->waiter_count.compare_exchange_weak(n, n - 1, std::memory_order_relaxed)) {
  }
  return true;
}

// --- observers --------------------------------------------------------------------------

void device_lock::describe_queue(uint32_t priority, uint64_t ticket, char* buf, size_t size) const noexcept {
  // Without the mutex (it may be the thing that is stuck): a diagnostic, read word by word.
  const lock_state* st = lock_state_of(segment_->base());
  const waiter_slot* slots = slots_of(segment_->base());
  size_t used = 0;
  buf[0] = '\0';
  const uint64_t now = monotonic_ns();
  char who[192];
  uint32_t holder = k_no_slot;
  for (uint32_t i = 0; i < k_slot_count && holder == k_no_slot; ++i) {
    if (slots[i].state.load(std::memory_order_acquire) == slot_holding) holder = i;
  }
  if (holder == k_no_slot) {
    appendf(buf, size, &used, "nobody holds it now");
  } else {
    const pid_t pid = __atomic_load_n(&slots[holder].pid, __ATOMIC_RELAXED);
    const uint64_t pid_ns = __atomic_load_n(&slots[holder].pid_ns, __ATOMIC_RELAXED);
    describe_process_in(pid, pid_ns, who, sizeof who);
    std::string owner;
    try {
      owner = describe_uid(__atomic_load_n(&slots[holder].uid, __ATOMIC_RELAXED));
    } catch (...) {  // out of memory: the uid's name is a nicety
    }
    appendf(buf, size, &used, "held by %s%s%s", who, owner.empty() ? "" : " of ", owner.c_str());
    const uint64_t granted = st->holder_slot.load(std::memory_order_relaxed) == holder
                                 ? st->holder_granted_ns.load(std::memory_order_relaxed) : 0;
    if (granted != 0 && granted < now) appendf(buf, size, &used, " for %.3f s", static_cast<double>(now - granted) / 1e9);
    const uint64_t over = slots[holder].over_limit_since_ns.load(std::memory_order_relaxed);
    if (over != 0) {
      char limit[32];
      format_duration(slots[holder].max_hold_ns.load(std::memory_order_relaxed), limit, sizeof limit);
      appendf(buf, size, &used, ", past its VRAMSWAP_MAX_HOLD of %s", limit);
    }
    if (slots[holder].release_requested_ns.load(std::memory_order_relaxed) != 0) {
      appendf(buf, size, &used, ", asked to release it");
    }
    if (visible_here(pid_ns) && is_stopped_state(process_state(pid))) {
      appendf(buf, size, &used, " (kill -CONT %d resumes it)", static_cast<int>(pid));
    }
  }
  if (ticket != 0) {
    uint32_t ahead = 0;
    for (uint32_t i = 0; i < k_slot_count; ++i) {
      if (slots[i].state.load(std::memory_order_acquire) != slot_waiting) continue;
      const uint32_t p = class_of(slots[i].priority.load(std::memory_order_relaxed));
      const uint64_t t = slots[i].ticket.load(std::memory_order_relaxed);
      if (t == ticket || !(p > priority || (p == priority && t < ticket))) continue;
      if (ahead++ < 4) {
        describe_process_in(__atomic_load_n(&slots[i].pid, __ATOMIC_RELAXED), __atomic_load_n(&slots[i].pid_ns, __ATOMIC_RELAXED),
                            who, sizeof who);
        appendf(buf, size, &used, "%s%s", ahead == 1 ? "; waiters ahead: " : ", ", who);
      }
    }
    if (ahead > 4) appendf(buf, size, &used, " and %u more", ahead - 4);
    if (ahead == 0) appendf(buf, size, &used, "; no waiter ahead");
  }
  const pid_t tid = lease_mutex_locked(&st->mutex) ? st->mutex.owner_tid.load(std::memory_order_relaxed) : 0;
  if (tid != 0 && visible_here(st->mutex.owner_pid_ns.load(std::memory_order_relaxed)) && is_stopped_state(process_state(tid))) {
    describe_process(process_of_thread(tid), who, sizeof who);
    appendf(buf, size, &used, "; its internal mutex is held by thread %d of %s", static_cast<int>(tid), who);
  }
}

int device_lock::snapshot(std::vector<lock_queue_entry>* out, int64_t wait_ns) noexcept {
  if (segment_ == nullptr) return fail(err_invalid_argument, "device_lock::snapshot: this lock is not open");
  waiter_slot* slots = slots_of(segment_->base());
  try {
    out->clear();
    out->reserve(k_slot_count);  // no allocation while the mutex is held
  } catch (...) {
    return fail(err_out_of_memory, "device_lock::snapshot: out of memory");
  }
  if (const int mrc = lock_mutex(deadline_after(monotonic_ns(), wait_ns)); mrc != ok) {
    return add_context(mrc, "device_lock::snapshot: ");
  }
  for (uint32_t i = 0; i < k_slot_count; ++i) {
    const uint32_t state = slots[i].state.load(std::memory_order_relaxed);
    if (state != slot_waiting && state != slot_holding) continue;
    const bool holding = state == slot_holding;
    out->push_back({slots[i].pid, slots[i].tid, static_cast<lock_priority>(class_of(slots[i].priority.load())), slots[i].ticket.load(),
                    holding, slots[i].enqueue_ns, slots[i].pid_ns, slots[i].uid, slot_owner_alive(i), slots[i].max_hold_ns.load(std::memory_order_relaxed),
                    holding ? 0 : slots[i].behind_ticket.load(std::memory_order_relaxed),
                    holding ? slots[i].granted_ns.load(std::memory_order_relaxed) : 0,
                    holding ? slots[i].over_limit_since_ns.load(std::memory_order_relaxed) : 0,
                    holding ? slots[i].release_requested_ns.load(std::memory_order_relaxed) : 0,
                    slots[i].gang_id.load(std::memory_order_relaxed)});
  }
  unlock_mutex();
  std::sort(out->begin(), out->end(), [](const lock_queue_entry& a, const lock_queue_entry& b) {
    if (a.holding != b.holding) return a.holding;
    if (a.priority != b.priority) return a.priority > b.priority;
    return a.ticket < b.ticket;
  });
  return ok;
}

}  // namespace vramswap::detail
