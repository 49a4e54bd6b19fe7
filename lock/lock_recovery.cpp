// Death recovery (device_lock.hpp, Death): the one recovery function, run after a death
// inside the internal mutex or by the liveness scan, and what it stands on: whether a slot's
// owner is alive (its liveness lease, lock/liveness_lease.hpp), and this object's leases of
// the slots it takes and frees.
#include "lock/device_lock.hpp"

#include "core/log.hpp"
#include "core/status.hpp"
#include "lock/crash_points.hpp"
#include "lock/futex.hpp"
#include "lock/liveness_lease.hpp"
#include "lock/process_identity.hpp"
#include "lock/segment_layout.hpp"
#include "lock/shared_segment.hpp"

namespace vramswap::detail {
using namespace lock_layout;

namespace {

// What the slots say once the dead are gone: who holds the lock, how many wait, and one past
// the last slot in use.
struct slot_census {
  uint32_t holder = k_no_slot;
  uint32_t waiters = 0;
  uint32_t high_water = 0;
};

// Count the slots of segment `name`; err_internal, marking the segment broken, when two of
// them hold the lock.
int take_census(lock_state* st, const waiter_slot* slots, const char* name, slot_census* out) {
  for (uint32_t i = 0; i < k_slot_count; ++i) {
    const uint32_t state = slots[i].state.load(std::memory_order_relaxed);
    if (state == slot_free) continue;
    out->high_water = i + 1;
    if (state == slot_waiting) {
      ++out->waiters;
    } else if (out->holder == k_no_slot) {
      out->holder = i;
    } else {
      st->broken = 1;
      return fail(err_internal,
                  "lock: slots %u and %u of %s both hold the lock, which no sequence of deaths can cause "
                  "(memory corruption); the segment is now marked broken: stop every process using this device and "
                  "remove it",
                  out->holder, i, name);
    }
  }
  return ok;
}

}  // namespace

// --- the recovery function ----------------------------------------------------------------

int device_lock::recover_after_owner_death(void* self) noexcept {
  auto* lock = static_cast<device_lock*>(self);
  log(log_level::warn, "lock: a process died inside the internal critical section of %s; repairing",
      lock->segment_->name().c_str());
  return lock->repair_locked();
}

// The recovery function. Called with the mutex held, after EOWNERDEAD or by the periodic
// liveness scan. It trusts only the authoritative fields (each slot's state and its
// complete contents once published, next_ticket, dead_holder_pid): it removes the slots of
// dead processes, recomputes every hint from the slots, and grants the lock if nobody holds
// it. Each step is idempotent, so a death in the middle of it is repaired by the next run.
int device_lock::repair_locked() noexcept {
  lock_state* st = lock_state_of(segment_->base());
  bool repaired = free_slots_of_dead_owners_locked();
  at_crash_point(crash_point::recovery_midway);
  slot_census census;
  VS_TRY(take_census(st, slots_of(segment_->base()), segment_->name().c_str(), &census));
  const uint32_t holder = census.holder;
  const uint32_t holder_before = st->holder_slot.load(std::memory_order_relaxed);
  if (holder_before != holder || st->waiter_count != census.waiters || st->slot_high_water != census.high_water) repaired = true;
  st->holder_slot = holder;
  st->waiter_count = census.waiters;
  st->slot_high_water = census.high_water;
  // With nobody holding, a waiter should have been granted, unless the next is a gang
  // member waiting for its other devices (which is not a repair).
  if (holder == k_no_slot && census.waiters > 0 && dispatch_locked(k_no_slot) != k_no_slot) repaired = true;
  if (repaired) ++st->recoveries;
  // A dead holder's yielding jobs run again (or look at the next holder).
  if (st->holder_slot.load(std::memory_order_relaxed) != holder_before &&
      st->compute_watchers.load(std::memory_order_seq_cst) != 0) {
    futex_wake_all(&st->holder_slot);
  }
  return ok;
}

// The recovery function's first step: free the slots whose owners are dead (and those in a
// state no code writes). Returns whether it changed anything.
bool device_lock::free_slots_of_dead_owners_locked() noexcept {
  lock_state* st = lock_state_of(segment_->base());
  waiter_slot* slots = slots_of(segment_->base());
  bool repaired = false;
  for (uint32_t i = 0; i < k_slot_count; ++i) {
    const uint32_t state = slots[i].state.load(std::memory_order_relaxed);
    if (state == slot_free) continue;
    if (state == slot_granting) {
      // Its gang's granter died between reserving the members and granting them (a live
      // one holds this mutex throughout): the member waits again, and its gang learns of
      // the death (lock/gang.hpp) or grants it anew.
      slots[i].state.store(slot_waiting, std::memory_order_release);
      repaired = true;
      if (!slot_owner_alive(i)) slots[i].state.store(slot_free, std::memory_order_release);
      continue;
    }
    if (state != slot_waiting && state != slot_holding) {
      log(log_level::warn, "lock: slot %u of %s has unknown state %u; freeing it", i, segment_->name().c_str(),
          state);
      slots[i].state.store(slot_free, std::memory_order_release);
      repaired = true;
      continue;
    }
    if (slot_owner_alive(i)) continue;
    if (state == slot_holding) {
      // Record the death before freeing the slot: a death between the two stores then
      // reports the death twice, never zero times.
      st->dead_holder_pid_ns = slots[i].pid_ns;
      st->dead_holder_pid = slots[i].pid;
      char who[192];
      describe_process_in(slots[i].pid, slots[i].pid_ns, who, sizeof who);
      log(log_level::warn, "lock: holder %s of %s died holding the lock; passing it on", who, segment_->name().c_str());
    }
    slots[i].state.store(slot_free, std::memory_order_release);
    repaired = true;
  }
  return repaired;
}

// --- when it runs -------------------------------------------------------------------------

void device_lock::liveness_tick(uint64_t deadline_ns) noexcept {
  lock_state* st = lock_state_of(segment_->base());
  if (lock_mutex(deadline_ns) != 0) return;  // the next wait (or its timeout) will report it
  const uint64_t now = monotonic_ns();
  if (now - st->last_liveness_scan_ns >= static_cast<uint64_t>(k_liveness_poll_ns)) {
    st->last_liveness_scan_ns = now;
    repair_locked();
    // We wait: a holder past its limit is marked now, whether or not its process looks.
    note_over_limit_locked(st->holder_slot.load(std::memory_order_relaxed), now);
  }
  unlock_mutex();
}

int device_lock::repair_now(int64_t wait_ns) noexcept {
  if (segment_ == nullptr) return fail(err_invalid_argument, "device_lock::repair_now: this lock is not open");
  lock_state* st = lock_state_of(segment_->base());
  if (const int mrc = lock_mutex(deadline_after(monotonic_ns(), wait_ns)); mrc != ok) {
    return add_context(mrc, "device_lock::repair_now: ");
  }
  st->last_liveness_scan_ns = monotonic_ns();
  const int rc = repair_locked();
  unlock_mutex();
  return rc;
}

int device_lock::repair_for_short_wait_locked(uint32_t mine, int64_t timeout_ns) noexcept {
  lock_state* st = lock_state_of(segment_->base());
  waiter_slot& slot = slots_of(segment_->base())[mine];
  // A try, or a wait shorter than a waiter's liveness scan, would never see a dead holder go
  // (with no other waiter and no pool server to repair it, it would be refused for good):
  // it asks the holder's lease itself, and repairs (which grants the best waiter) when it is gone.
  const uint32_t holder = st->holder_slot.load(std::memory_order_relaxed);
  if (holder != k_no_slot && timeout_ns >= 0 && timeout_ns < k_liveness_poll_ns && holder < k_slot_count &&
      !slot_owner_alive(holder)) {
    if (const int rrc = repair_locked(); rrc != ok) {
      slot.state.store(slot_free, std::memory_order_release);
      --st->waiter_count;
      unlock_mutex();
      let_go_of_lease(mine);
      return rrc;
    }
  }
  return ok;
}

// --- liveness of slot owners, and our leases ------------------------------------------------

// Is the owner of published slot `i` alive? Ours when this object holds its lease (the
// kernel does not show a description its own locks), else whoever holds the lease elsewhere.
// In a forked child that has not opened the segment anew, every owner is taken to be alive:
// its lease descriptor was its parent's (now /dev/null), so it cannot tell.
bool device_lock::slot_owner_alive(uint32_t i) noexcept {
  if (!segment_->opened_in_this_process()) return true;
  return segment_->own_leases().has(i) || lease_held_elsewhere(segment_->lease_fd(), i);
}

// After our slot `i` was freed: drop its lease, then forget it. Until it is forgotten no
// thread of this object takes the slot again (acquire skips slots in own_leases), so a drop
// never takes away the lease of a new owner that shares our open file description.
void device_lock::let_go_of_lease(uint32_t i) noexcept {
  drop_lease(segment_->lease_fd(), i);
  segment_->own_leases().remove(i);
}

// After our slot `i` was freed by a release: kept as the spare for the next acquire when
// there is none yet (its lease too), else let go of.
void device_lock::keep_or_let_go_of_lease(uint32_t i) noexcept {
  uint32_t none = k_no_slot;
  if (segment_->opened_in_this_process() && segment_->spare_slot().compare_exchange_strong(none, i, std::memory_order_acq_rel)) return;
  let_go_of_lease(i);
}

}  // namespace vramswap::detail
