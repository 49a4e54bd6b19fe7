// The lock word: who holds a device's lock and how it changes hands. The internal mutex taken
// within a bound (and the error that names a stuck owner), the holder recorded after a grant,
// release and the hand-on to the next waiter, the hold times kept for prediction, and the
// holder word that low-priority jobs watch (device_lock.hpp, Bounded waits and Waiting).
#include "lock/device_lock.hpp"

#include <algorithm>
#include <cstdio>
#include <string>

#include "core/log.hpp"
#include "core/status.hpp"
#include "lock/crash_points.hpp"
#include "lock/futex.hpp"
#include "lock/lease_mutex.hpp"
#include "lock/lock_messages.hpp"
#include "lock/process_identity.hpp"
#include "lock/segment_layout.hpp"
#include "lock/shared_segment.hpp"

namespace vramswap::detail {
using namespace lock_layout;

namespace {

// Fold the hold that ends at `now` into the moving averages (weight 1/4 for the newest).
// Returns the hold, 0 when its grant time is unknown.
uint64_t record_hold(lock_state* st, uint64_t now) {
  const uint64_t granted = st->holder_granted_ns.load(std::memory_order_relaxed);
  if (granted == 0 || now < granted) return 0;
  const int64_t hold = static_cast<int64_t>(now - granted);
  const int64_t mean = static_cast<int64_t>(st->hold_mean_ns.load(std::memory_order_relaxed));
  if (mean == 0) {
    st->hold_mean_ns.store(static_cast<uint64_t>(hold), std::memory_order_relaxed);
    st->hold_jitter_ns.store(static_cast<uint64_t>(hold), std::memory_order_relaxed);  // unknown: as irregular as can be
    return static_cast<uint64_t>(hold);
  }
  const int64_t dev = hold > mean ? hold - mean : mean - hold;
  const int64_t jitter = static_cast<int64_t>(st->hold_jitter_ns.load(std::memory_order_relaxed));
  st->hold_mean_ns.store(static_cast<uint64_t>(mean + (hold - mean) / 4), std::memory_order_relaxed);
  st->hold_jitter_ns.store(static_cast<uint64_t>(jitter + (dev - jitter) / 4), std::memory_order_relaxed);
  return static_cast<uint64_t>(hold);
}

}  // namespace

// --- the internal mutex ------------------------------------------------------------------

int device_lock::lock_mutex(uint64_t deadline_ns, bool interruptible) noexcept {
  // A forked child locks with a token of its own (its parent's is its parent's).
  VS_TRY(reopen_if_forked());
  lock_state* st = lock_state_of(segment_->base());
  const uint64_t started = monotonic_ns();
  for (;;) {
    // An interruptible take waits in slices, asking the thread's wait_interrupt between them.
    const uint64_t slice_end =
        interruptible ? std::min(deadline_ns, monotonic_ns() + static_cast<uint64_t>(k_liveness_poll_ns)) : deadline_ns;
    const int rc = lease_mutex_lock(&st->mutex, segment_->mutex_owner(), slice_end, &device_lock::recover_after_owner_death, this);
    if (rc == ok) break;
    if (rc != err_timeout) return rc;
    if (slice_end >= deadline_ns) return mutex_timeout(monotonic_ns() - started);
    if (interrupted_now(false)) {
      return fail(err_interrupted, "device_lock::acquire: interrupted while waiting for the internal mutex of %s; not queued",
                  segment_->name().c_str());
    }
  }
  if (st->broken != 0) {
    unlock_mutex();
    return fail(err_internal,
                "lock: %s is marked broken (two holders were found: memory corruption); stop every process "
                "using this device and remove the segment",
                segment_->name().c_str());
  }
  return ok;
}

void device_lock::unlock_mutex() noexcept { lease_mutex_unlock(&lock_state_of(segment_->base())->mutex); }

int device_lock::mutex_timeout(uint64_t waited_ns) const noexcept {
  const lock_state* st = lock_state_of(segment_->base());
  const pid_t tid = lease_mutex_locked(&st->mutex) ? st->mutex.owner_tid.load(std::memory_order_relaxed) : 0;
  const uint64_t owner_ns = st->mutex.owner_pid_ns.load(std::memory_order_relaxed);
  if (tid != 0 && !visible_here(owner_ns)) {
    return fail(err_timeout,
                "lock: the internal mutex of %s has been held for over %.3f s by thread %d of a process in another PID "
                "namespace (pid:[%llu]: another container), which holds it for microseconds when running; nobody can take, "
                "leave or hand on this device's lock meanwhile: if that lasts, find that thread where its namespace is "
                "visible (the node: `vramswap status`) and resume or end it (a dead owner is repaired at once)",
                segment_->name().c_str(), static_cast<double>(waited_ns) / 1e9, static_cast<int>(tid),
                static_cast<unsigned long long>(owner_ns));
  }
  const pid_t pid = process_of_thread(tid);
  if (tid == 0 || pid == 0) {
    return fail(err_timeout, "lock: the internal mutex of %s stayed taken for %.3f s (its owner has just let go); retry",
                segment_->name().c_str(), static_cast<double>(waited_ns) / 1e9);
  }
  char who[192];
  describe_process(pid, who, sizeof who);
  char advice[160];
  if (is_stopped_state(process_state(tid))) {
    std::snprintf(advice, sizeof advice, "resume it (kill -CONT %d) or end it (kill %d: a dead owner is repaired at once)",
                  static_cast<int>(pid), static_cast<int>(pid));
  } else {
    std::snprintf(advice, sizeof advice, "if that lasts, end it (kill %d: a dead owner is repaired at once)", static_cast<int>(pid));
  }
  return fail(err_timeout,
              "lock: the internal mutex of %s has been held for over %.3f s by thread %d of %s, which it holds for "
              "microseconds when running; nobody can take, leave or hand on this device's lock meanwhile: %s",
              segment_->name().c_str(), static_cast<double>(waited_ns) / 1e9, static_cast<int>(tid), who, advice);
}

// --- the grant recorded, release and hand-on ---------------------------------------------

void device_lock::became_holder(uint32_t mine, uint64_t my_ticket, pid_t pid, pid_t tid, uint64_t start_ns,
                                acquire_info* info) noexcept {
  waiter_slot& slot = slots_of(segment_->base())[mine];
  holder_slot_.store(mine, std::memory_order_relaxed);
  hold_ticket_.store(my_ticket, std::memory_order_release);
  depth_ = 1;
  holder_pid_.store(pid, std::memory_order_relaxed);
  holder_tid_.store(tid, std::memory_order_relaxed);
  const uint64_t waited_ns = monotonic_ns() - start_ns;
  turns_of(segment_->base())->wait.observe(waited_ns);
  if (info != nullptr) {
    info->waited_ns = waited_ns;
    info->previous_holder_died = slot.dead_holder_pid != 0;
    info->dead_holder_pid = slot.dead_holder_pid;
    info->dead_holder_pid_ns = slot.dead_holder_pid_ns;
  }
  if (slot.dead_holder_pid != 0) {
    char who[192];
    describe_process_in(slot.dead_holder_pid, slot.dead_holder_pid_ns, who, sizeof who);
    log(log_level::warn, "lock: acquired %s from holder %s, which died holding it", segment_->name().c_str(), who);
  }
}

int device_lock::release() noexcept {
  if (segment_ == nullptr) {
    return fail(err_not_owner, "device_lock::release: this lock is not open, so it cannot be held");
  }
  process_identity me{};
  VS_TRY(current_process(&me));
  const pid_t tid = current_tid();
  if (!held_by(me.pid, tid)) return not_the_holder(me.pid, tid);
  if (depth_ > 1) {
    --depth_;
    return ok;
  }
  const uint32_t mine = holder_slot_.load(std::memory_order_relaxed);
  waiter_slot& slot = slots_of(segment_->base())[mine];
  const bool ours = slot.pid == me.pid && slot.tid == tid && slot.pid_start_time == me.start_time;
  const int mrc = lock_mutex(monotonic_ns() + static_cast<uint64_t>(k_release_mutex_ns));
  if (mrc == err_timeout && ours) return release_without_mutex(mine);
  VS_TRY(mrc);
  if (slot.state.load(std::memory_order_relaxed) != slot_holding || !ours) {
    unlock_mutex();
    forget_holding();
    let_go_of_lease(mine);
    return fail(err_internal,
                "device_lock::release: %s no longer records thread %d as its holder (the segment was removed "
                "and recreated, or reset); nothing was released",
                segment_->name().c_str(), tid);
  }
  return hand_on_locked(mine);
}

int device_lock::not_the_holder(pid_t pid, pid_t tid) const noexcept {
  const pid_t holder_pid = holder_pid_.load(std::memory_order_relaxed);
  if (holder_pid != 0 && holder_pid != pid) {
    return fail(err_not_owner,
                "device_lock::release: %s was acquired by process %d; a forked child (here pid %d) never "
                "inherits the lock",
                segment_->name().c_str(), holder_pid, pid);
  }
  return fail(err_not_owner,
              "device_lock::release: thread %d does not hold %s (release without acquire, a double release, "
              "or a release from another thread than the one that acquired)",
              tid, segment_->name().c_str());
}

int device_lock::release_without_mutex(uint32_t mine) noexcept {
  lock_state* st = lock_state_of(segment_->base());
  waiter_slot& slot = slots_of(segment_->base())[mine];
  // The mutex's owner is stuck (stopped): free our slot without it, so that the lock is
  // not held; the next repair (a waiter's liveness scan, once the mutex is free again)
  // recomputes the hints and grants the next waiter.
  const std::string why = last_error();
  forget_holding();
  if (slot.over_limit_since_ns.load(std::memory_order_relaxed) != 0) {
    penalty_behind_.store(__atomic_load_n(&st->next_ticket, __ATOMIC_RELAXED), std::memory_order_relaxed);
  }
  uint32_t expected = slot_holding;
  if (slot.state.compare_exchange_strong(expected, slot_free, std::memory_order_acq_rel)) {
    at_crash_point(crash_point::release_slot_freed);
    // holder_slot still names the slot until the next repair; a yielding job looks at
    // the slot's state too (holder_claims_compute), so a wake is enough.
    if (st->compute_watchers.load(std::memory_order_seq_cst) != 0) futex_wake_all(&st->holder_slot);
    let_go_of_lease(mine);
  }
  log(log_level::warn, "lock: released %s without handing it on (%s); the next waiter is granted once that mutex is free",
      segment_->name().c_str(), why.c_str());
  return ok;
}

int device_lock::hand_on_locked(uint32_t mine) noexcept {
  lock_state* st = lock_state_of(segment_->base());
  waiter_slot* slots = slots_of(segment_->base());
  waiter_slot& slot = slots[mine];
  // Fair turns: a hold past its limit while others waited (marked now if nobody has yet)
  // puts this process behind every one of them still waiting at its next acquire: they all
  // have tickets below the counter's value now.
  const uint64_t now = monotonic_ns();
  const uint64_t over_since = note_over_limit_locked(mine, now);
  const uint64_t ticket = slot.ticket.load(std::memory_order_relaxed);
  const uint64_t held_ns = now - std::min(now, slot.granted_ns.load(std::memory_order_relaxed));
  waiter_list waiters;
  if (over_since != 0) {
    penalty_behind_.store(st->next_ticket, std::memory_order_relaxed);
    if (warned_over_ticket_.load(std::memory_order_relaxed) != ticket) {
      waiters.collect(slots, std::min(st->slot_high_water.load(), k_slot_count));
    }
  }
  // Forget first: once the slot is freed, another thread of this process may be granted
  // the lock through this same object and write these fields itself.
  forget_holding();
  slot.state.store(slot_free, std::memory_order_release);
  at_crash_point(crash_point::release_slot_freed);
  st->holder_slot = k_no_slot;
  const uint64_t recorded_ns = record_hold(st, now);
  if (st->waiter_count > 0) dispatch_locked(k_no_slot);
  unlock_mutex();
  // Low-priority jobs yielding to this hold run again (or look at the next holder).
  if (st->compute_watchers.load(std::memory_order_seq_cst) != 0) futex_wake_all(&st->holder_slot);
  keep_or_let_go_of_lease(mine);
  if (recorded_ns != 0) turns_of(segment_->base())->hold.observe(recorded_ns);
  if (over_since != 0) warn_over_limit_at_release(ticket, held_ns, now, waiters);
  return ok;
}

// --- hold times --------------------------------------------------------------------------

device_lock::hold_stats device_lock::holds() const noexcept {
  hold_stats h;
  if (segment_ == nullptr) return h;
  const lock_state* st = lock_state_of(segment_->base());
  h.mean_ns = st->hold_mean_ns.load(std::memory_order_relaxed);
  h.jitter_ns = st->hold_jitter_ns.load(std::memory_order_relaxed);
  h.predictable = h.mean_ns != 0 && h.jitter_ns * 2 <= h.mean_ns;
  h.holder_granted_ns = st->holder_slot.load(std::memory_order_relaxed) != k_no_slot
                            ? st->holder_granted_ns.load(std::memory_order_relaxed) : 0;
  return h;
}

// --- the holder word, for low-priority compute -------------------------------------------

const std::atomic<uint32_t>* device_lock::holder_word() const noexcept {
  static_assert(k_no_holder == k_no_slot);
  return segment_ == nullptr ? nullptr : &lock_state_of(segment_->base())->holder_slot;
}

bool device_lock::holder_claims_compute(uint32_t seen) const noexcept {
  if (segment_ == nullptr || seen >= k_slot_count) return false;
  const waiter_slot& h = slots_of(segment_->base())[seen];
  if (h.state.load(std::memory_order_acquire) != slot_holding) return false;  // released without the mutex
  return h.priority.load(std::memory_order_relaxed) >= static_cast<uint32_t>(lock_priority::normal);
}

void device_lock::wait_holder_change(uint32_t seen, uint64_t timeout_ns) noexcept {
  if (segment_ == nullptr) return;
  lock_state* st = lock_state_of(segment_->base());
  // Counted in before the word is compared (inside FUTEX_WAIT): a release that changes the
  // word after our comparison sees the count and wakes us; one that changed it before makes
  // the comparison fail. Both sides use sequentially consistent operations for that.
  st->compute_watchers.fetch_add(1, std::memory_order_seq_cst);
  if (st->holder_slot.load(std::memory_order_seq_cst) == seen) futex_wait(&st->holder_slot, seen, timeout_ns);
  st->compute_watchers.fetch_sub(1, std::memory_order_seq_cst);
  if (st->holder_slot.load(std::memory_order_acquire) != seen || !holder_claims_compute(seen)) return;
  // Still the same hold: make sure its owner lives (a holder that died holding is found by
  // waiters' scans, and a job may be the only one looking). The rate limit is read without
  // the mutex first, so that parked threads take it once per scan period, not once a wake.
  const uint64_t now = monotonic_ns();
  if (now - std::min(now, __atomic_load_n(&st->last_liveness_scan_ns, __ATOMIC_RELAXED)) <
      static_cast<uint64_t>(k_liveness_poll_ns)) {
    return;
  }
  liveness_tick(now + static_cast<uint64_t>(k_mutex_try_ns));
}

}  // namespace vramswap::detail
