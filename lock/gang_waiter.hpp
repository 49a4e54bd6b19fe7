// gang_waiter: the machinery of gangs shared by the gang acquire of one process
// (gang_acquire.cpp) and the gangs of several processes (rank_gang.cpp): taking several
// devices' internal mutexes in one order, deciding and making the all-at-once grant,
// sleeping on several slots. A friend of device_lock; internal to lock/.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "core/status.hpp"
#include "lock/crash_points.hpp"
#include "lock/device_lock.hpp"
#include "lock/futex.hpp"
#include "lock/process_identity.hpp"
#include "lock/queue_order.hpp"
#include "lock/segment_layout.hpp"
#include "lock/shared_segment.hpp"

namespace vramswap::detail {
using namespace lock_layout;

// The gang machinery, a friend of device_lock. Members are kept sorted by device key.
class gang_waiter {
 public:
  struct member {
    device_lock* lock = nullptr;
    size_t caller_index = 0;  // its place in the caller's array
    uint32_t slot = k_no_slot;
    uint64_t ticket = 0;
  };

  gang_waiter(member* members, size_t count) : m_(members), n_(count) {}

  // Take every member's internal mutex, in member order, by `deadline_ns`. On failure none
  // is held.
  int lock_all(uint64_t deadline_ns, bool interruptible) noexcept {
    for (size_t i = 0; i < n_; ++i) {
      if (const int rc = m_[i].lock->lock_mutex(deadline_ns, interruptible); rc != ok) {
        for (size_t j = i; j-- > 0;) m_[j].lock->unlock_mutex();
        return rc;
      }
    }
    return ok;
  }

  void unlock_all() noexcept {
    for (size_t j = n_; j-- > 0;) m_[j].lock->unlock_mutex();
  }

  // With every member mutex held: is the gang next on every member device, and is each free?
  bool grantable_locked() const noexcept {
    for (size_t i = 0; i < n_; ++i) {
      const lock_state* st = lock_state_of(m_[i].lock->segment_->base());
      const waiter_slot* slots = slots_of(m_[i].lock->segment_->base());
      const uint32_t h = st->holder_slot.load(std::memory_order_relaxed);
      if (h < k_slot_count && slots[h].state.load(std::memory_order_relaxed) == slot_holding) return false;
      const waiter_slot& mine = slots[m_[i].slot];
      if (mine.state.load(std::memory_order_relaxed) != slot_waiting || mine.ticket.load(std::memory_order_relaxed) != m_[i].ticket) {
        return false;
      }
      if (choose_next(slots, std::min(st->slot_high_water.load(), k_slot_count)) != m_[i].slot) return false;
    }
    return true;
  }

  // The same question without the mutexes: a hint, to decide whether to take them.
  bool looks_grantable() const noexcept {
    for (size_t i = 0; i < n_; ++i) {
      const lock_state* st = lock_state_of(m_[i].lock->segment_->base());
      if (st->holder_slot.load(std::memory_order_relaxed) != k_no_slot) return false;
      if (m_[i].lock->next_in_line() != m_[i].slot) return false;
    }
    return true;
  }

  // With every member mutex held and grantable_locked(): grant every member slot. False
  // (nothing granted) when a member left the queue meanwhile (a reservation failed).
  bool grant_locked() noexcept {
    for (size_t i = 0; i < n_; ++i) {
      uint32_t expected = slot_waiting;
      if (!slot_of(i).state.compare_exchange_strong(expected, slot_granting, std::memory_order_acq_rel)) {
        for (size_t j = 0; j < i; ++j) slot_of(j).state.store(slot_waiting, std::memory_order_release);
        return false;
      }
    }
    at_crash_point(crash_point::gang_reserved);
    const uint64_t now = monotonic_ns();
    for (size_t i = 0; i < n_; ++i) {
      lock_state* st = lock_state_of(m_[i].lock->segment_->base());
      waiter_slot& s = slot_of(i);
      // The dispatch's order: tell the grantee about a dead predecessor, then grant, then
      // fix the hints, then forget the death.
      s.dead_holder_pid_ns = st->dead_holder_pid_ns;
      s.dead_holder_pid = st->dead_holder_pid;
      s.granted_ns.store(now, std::memory_order_relaxed);
      s.state.store(slot_holding, std::memory_order_release);
      st->holder_slot = m_[i].slot;
      st->holder_granted_ns.store(now, std::memory_order_relaxed);
      if (st->waiter_count > 0) --st->waiter_count;
      st->dead_holder_pid = 0;
      if (i == 0) at_crash_point(crash_point::gang_granted_one);
    }
    for (size_t i = 0; i < n_; ++i) futex_wake_one(&slot_of(i).state);
    return true;
  }

  // Try to grant, taking the mutexes by `deadline_ns`. True when granted.
  bool try_grant(uint64_t deadline_ns) noexcept {
    if (lock_all(deadline_ns, false) != ok) {
      clear_error();
      return false;
    }
    const bool granted = grantable_locked() && grant_locked();
    unlock_all();
    return granted;
  }

  bool all_holding() const noexcept {
    for (size_t i = 0; i < n_; ++i) {
      if (slot_of(i).state.load(std::memory_order_acquire) != slot_holding) return false;
    }
    return true;
  }

  // Sleep until a member slot changes or is woken, or `deadline_ns`. EINTR when a signal
  // handler ran.
  int sleep(uint64_t deadline_ns) noexcept {
    std::atomic<uint32_t>* words[device_lock::k_max_gang];
    uint32_t expected[device_lock::k_max_gang];
    for (size_t i = 0; i < n_; ++i) {
      words[i] = &slot_of(i).state;
      expected[i] = slot_waiting;
    }
    int rc = futex_wait_any(words, expected, static_cast<unsigned>(n_), deadline_ns);
    if (rc == ENOSYS) {
      // No futex_waitv: sleep on the first slot in short slices (a dispatch on another
      // member device wakes nobody then; the slice bounds the delay).
      const uint64_t now = monotonic_ns();
      const uint64_t slice = std::min<uint64_t>(deadline_ns > now ? deadline_ns - now : 0, 1'000'000);
      rc = futex_wait(words[0], slot_waiting, slice);
    }
    return rc == EINTR ? EINTR : 0;
  }

  // Leave every member queue (the gang was not granted). A free member device that had the
  // gang next is then dispatched to those behind it, rather than wait for their liveness scan.
  void withdraw_all() noexcept {
    for (size_t i = 0; i < n_; ++i) {
      device_lock* l = m_[i].lock;
      if (!l->withdraw(m_[i].slot)) {
        // Granted meanwhile, which only this thread does; so not granted: gone (the segment
        // was reset). Its lease is not ours any more either.
        if (slot_of(i).state.load(std::memory_order_acquire) != slot_holding) l->let_go_of_lease(m_[i].slot);
      }
    }
    for (size_t i = 0; i < n_; ++i) {
      device_lock* l = m_[i].lock;
      if (l->lock_mutex(monotonic_ns() + static_cast<uint64_t>(device_lock::k_mutex_try_ns)) != ok) {
        clear_error();
        continue;
      }
      lock_state* st = lock_state_of(l->segment_->base());
      if (st->holder_slot == k_no_slot && st->waiter_count > 0) l->dispatch_locked(lock_layout::k_no_slot);
      l->unlock_mutex();
    }
  }

  // "device host-0: held by ...; device host-1: nobody holds it now; ...", for errors.
  void describe(uint32_t priority, char* buf, size_t size) const noexcept {
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n_ && used + 1 < size; ++i) {
      char queue[512];
      m_[i].lock->describe_queue(priority, m_[i].ticket, queue, sizeof queue);
      const int w = std::snprintf(buf + used, size - used, "%s%s: %s", i == 0 ? "" : "; ", m_[i].lock->segment_->name().c_str(), queue);
      if (w < 0) break;
      used = std::min(size - 1, used + static_cast<size_t>(w));
    }
  }

  waiter_slot& slot_of(size_t i) const noexcept { return slots_of(m_[i].lock->segment_->base())[m_[i].slot]; }

  static int acquire(device_lock* const* locks, size_t count, lock_priority priority, int64_t timeout_ns,
                     acquire_info* infos, uint64_t gang_id) noexcept;

  // The device lock's internals that a rank gang (rank_gang.cpp) needs too.
  static int lock_mutex(device_lock* l, uint64_t deadline_ns, bool interruptible = false) noexcept {
    return l->lock_mutex(deadline_ns, interruptible);
  }
  static void unlock_mutex(device_lock* l) noexcept { l->unlock_mutex(); }
  static shared_segment* segment_of(device_lock* l) noexcept { return l->segment_.get(); }
  static int take_slot_locked(device_lock* l, uint32_t* out) noexcept { return l->take_slot_locked(out); }
  static void publish_slot_locked(device_lock* l, uint32_t mine, uint32_t word, const process_identity& me, pid_t tid,
                                  uint64_t start_ns, uint64_t gang_id) noexcept {
    l->publish_slot_locked(mine, word, me, tid, start_ns, 0, gang_id);
  }
  static bool withdraw(device_lock* l, uint32_t slot) noexcept { return l->withdraw(slot); }
  static void let_go_of_lease(device_lock* l, uint32_t slot) noexcept { l->let_go_of_lease(slot); }
  static void liveness_tick(device_lock* l, uint64_t deadline_ns) noexcept { l->liveness_tick(deadline_ns); }
  static int reopen_if_forked(device_lock* l) noexcept { return l->reopen_if_forked(); }
  static bool held_by(device_lock* l, pid_t pid, pid_t tid) noexcept { return l->held_by(pid, tid); }
  static void became_holder(device_lock* l, uint32_t slot, uint64_t ticket, pid_t pid, pid_t tid, uint64_t start_ns,
                            acquire_info* info) noexcept {
    l->became_holder(slot, ticket, pid, tid, start_ns, info);
  }
  static void dispatch_if_free_locked(device_lock* l) noexcept {
    lock_state* st = lock_state_of(l->segment_->base());
    if (st->holder_slot == k_no_slot && st->waiter_count > 0) l->dispatch_locked(lock_layout::k_no_slot);
  }

 private:
  // The steps of acquire (gang_acquire.cpp), in the order it takes them.
  // The gang's size, priority and timeout are ones acquire takes.
  static int check_request(device_lock* const* locks, size_t count, lock_priority priority, int64_t timeout_ns) noexcept;
  // `out`: the members of `locks`, in the order of their device keys; each open, each device once.
  static int sort_members(device_lock* const* locks, size_t count, member* out) noexcept;
  // Every member held by this thread already: the re-entry is counted (*reentered). Some of
  // them held: an error (waiting for the rest while holding those could deadlock).
  int reenter_if_held(pid_t pid, pid_t tid, acquire_info* infos, bool* reentered) noexcept;
  // Take every member mutex, then a slot on each (all or none), then publish them all. On
  // success the mutexes stay held; on failure none is, and no slot is left taken.
  int enqueue(lock_priority priority, int64_t timeout_ns, uint64_t mutex_deadline, const process_identity& me, pid_t tid,
              uint64_t start_ns, uint64_t gang_id) noexcept;
  // A try, with every member mutex held, not granted at once: free the slots, let the
  // mutexes go, and say why (err_busy).
  int give_up_try_locked(lock_priority priority) noexcept;
  // Wait (no mutex held) until the gang is granted (true), `deadline` passes or this
  // thread's wait_interrupt says stop (*stop; false).
  bool wait_for_grant(uint64_t deadline, bool* stop) noexcept;
  // Not granted: leave every queue and say why (interrupted, or the timeout).
  int give_up_wait(lock_priority priority, bool stop, uint64_t start_ns, int64_t timeout_ns) noexcept;

  member* m_;
  size_t n_;
};

}  // namespace vramswap::detail
