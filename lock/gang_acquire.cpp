// The gang acquire (device_lock::acquire_gang): several devices' locks at once, all or none.
// The design and its reasons are in docs/lock.md, "Gangs"; in short:
//
// Enqueue. The gang takes every member device's internal mutex, in the order of the device
// keys (the same order for everyone, so two gangs never wait for each other's mutexes;
// single acquires take one mutex only), and only then publishes a slot on each: every
// gang's places are taken in one step, so any two gangs stand in the same order on every
// device they share (two-phase locking). Member slots are marked k_gang_member; a dispatch
// never grants one (it wakes it instead), so a member device that comes free while its gang
// is next there idles, and those queued behind the gang stay behind it.
//
// Grant. The gang's own waiter grants it: with every member mutex held, when no member
// device is held and the gang's slot is the next on each, it reserves each slot
// (waiting -> granting) and then grants each (granting -> holding). Waiting, it sleeps on
// all its slots at once (futex_waitv), so a dispatch on any member device that finds it
// next wakes it to look; it also looks after each liveness period.
//
// No deadlock: a gang member is never a fair-turns substitute and carries no penalty
// (lock/queue_order.hpp), so the slot a device would grant next, when it is a gang's, is
// that device's first by class and ticket; and the gangs' tickets agree on every device.
// So the first waiting gang of the node (by class, then by the step in which it queued) is
// the next on each of its devices as soon as the single users ahead of it there are done,
// and is granted then. Holders never wait for anything, so the only waits are behind
// holders, which release.
//
// Death. The gang's slots are this thread's, leased like any: a death anywhere leaves
// published slots whose lease is gone, which each device's liveness scan frees. A death
// between reserving and granting leaves slots `granting` with every member mutex's owner
// dead; each device's recovery function (run at EOWNERDEAD) turns them back to waiting.
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>

#include "core/log.hpp"
#include "core/options.hpp"
#include "core/status.hpp"
#include "lock/crash_points.hpp"
#include "lock/device_lock.hpp"
#include "lock/futex.hpp"
#include "lock/liveness_lease.hpp"
#include "lock/process_identity.hpp"
#include "lock/queue_order.hpp"
#include "lock/segment_layout.hpp"
#include "lock/shared_segment.hpp"

namespace vramswap::detail {
using namespace lock_layout;

namespace {
constexpr uint64_t k_forever = std::numeric_limits<uint64_t>::max();
}  // namespace

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
    for (size_t i = 0; i < n_; ++i) words[i] = &slot_of(i).state;
    int rc = futex_wait_any(words, static_cast<unsigned>(n_), slot_waiting, deadline_ns);
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
      if (st->holder_slot == k_no_slot && st->waiter_count > 0) l->dispatch_locked();
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

 private:
  member* m_;
  size_t n_;
};

int gang_waiter::acquire(device_lock* const* locks, size_t count, lock_priority priority, int64_t timeout_ns,
                         acquire_info* infos, uint64_t gang_id) noexcept {
  const uint64_t start_ns = monotonic_ns();
  if (infos != nullptr) {
    for (size_t i = 0; i < count; ++i) infos[i] = acquire_info{};
  }
  if (locks == nullptr || count == 0 || count > device_lock::k_max_gang) {
    return fail(err_invalid_argument, "device_lock::acquire_gang: %zu locks; a gang has 1 to %zu", count, device_lock::k_max_gang);
  }
  if (priority != lock_priority::normal && priority != lock_priority::high) {
    return fail(err_invalid_argument, "device_lock::acquire_gang: priority %u is not a lock_priority (normal=1, high=2)",
                static_cast<unsigned>(priority));
  }
  if (timeout_ns < -1) {
    return fail(err_invalid_argument, "device_lock::acquire_gang: timeout %lld ns is negative; use -1 to wait forever, 0 to only try",
                static_cast<long long>(timeout_ns));
  }
  member members[device_lock::k_max_gang];
  for (size_t i = 0; i < count; ++i) {
    if (locks[i] == nullptr || locks[i]->segment_ == nullptr) {
      return fail(err_invalid_argument, "device_lock::acquire_gang: lock %zu of the gang is not open; call device_lock::open first", i);
    }
    members[i].lock = locks[i];
    members[i].caller_index = i;
  }
  // The one order in which everybody takes several devices' mutexes.
  std::sort(members, members + count, [](const member& a, const member& b) { return a.lock->device_key_ < b.lock->device_key_; });
  for (size_t i = 1; i < count; ++i) {
    if (members[i].lock->device_key_ == members[i - 1].lock->device_key_) {
      return fail(err_invalid_argument, "device_lock::acquire_gang: device %s is in the gang twice; list each device once",
                  members[i].lock->device_key_.c_str());
    }
  }
  if (count == 1) return locks[0]->acquire(priority, timeout_ns, infos);
  for (size_t i = 0; i < count; ++i) VS_TRY(members[i].lock->reopen_if_forked());
  process_identity me{};
  VS_TRY(current_process(&me));
  const pid_t tid = current_tid();
  size_t held = 0;
  for (size_t i = 0; i < count; ++i) held += members[i].lock->held_by(me.pid, tid) ? 1 : 0;
  if (held == count) {
    for (size_t i = 0; i < count; ++i) {
      if (members[i].lock->depth_ == std::numeric_limits<uint32_t>::max()) {
        return fail(err_invalid_argument, "device_lock::acquire_gang: re-entered %u times without release", members[i].lock->depth_);
      }
    }
    for (size_t i = 0; i < count; ++i) {
      ++members[i].lock->depth_;
      if (infos != nullptr) infos[members[i].caller_index].reentered = true;
    }
    return ok;
  }
  if (held != 0) {
    std::string which;
    for (size_t i = 0; i < count; ++i) {
      if (members[i].lock->held_by(me.pid, tid)) which += (which.empty() ? "" : ", ") + members[i].lock->segment_->name();
    }
    return fail(err_invalid_argument,
                "device_lock::acquire_gang: this thread already holds %s of the gang's %zu devices; waiting for the rest while "
                "holding those could deadlock. Release them first, or hold the whole gang",
                which.c_str(), count);
  }
  if (gang_id == 0) gang_id = (static_cast<uint64_t>(static_cast<uint32_t>(me.pid)) << 32) | static_cast<uint32_t>(tid);

  const uint64_t deadline = timeout_ns < 0 ? k_forever : start_ns + static_cast<uint64_t>(timeout_ns);
  const uint64_t mutex_deadline = std::max(deadline, start_ns + static_cast<uint64_t>(device_lock::k_mutex_try_ns));
  gang_waiter gang(members, count);
  if (const int mrc = gang.lock_all(mutex_deadline, /*interruptible=*/true); mrc != ok) {
    if (mrc == err_timeout && timeout_ns == 0) return add_context(err_busy, "device_lock::acquire_gang (try): ");
    return add_context(mrc, "device_lock::acquire_gang: ");
  }
  // Every slot first (any may be the one that fails), then publish them all.
  for (size_t i = 0; i < count; ++i) {
    if (const int trc = members[i].lock->take_slot_locked(&members[i].slot); trc != ok) {
      for (size_t j = 0; j < i; ++j) members[j].lock->let_go_of_lease(members[j].slot);
      gang.unlock_all();
      return trc;
    }
  }
  const uint32_t word = static_cast<uint32_t>(priority) | k_gang_member;
  for (size_t i = 0; i < count; ++i) {
    device_lock* l = members[i].lock;
    members[i].ticket = lock_state_of(l->segment_->base())->next_ticket;
    l->publish_slot_locked(members[i].slot, word, me, tid, start_ns, /*behind=*/0, gang_id);
    if (i == 0) at_crash_point(crash_point::gang_enqueued_one);
  }
  bool granted = gang.grantable_locked() && gang.grant_locked();
  if (!granted && timeout_ns == 0) {
    for (size_t i = 0; i < count; ++i) {
      lock_state* st = lock_state_of(members[i].lock->segment_->base());
      gang.slot_of(i).state.store(slot_free, std::memory_order_release);
      at_crash_point(crash_point::timeout_slot_freed);
      --st->waiter_count;
    }
    gang.unlock_all();
    for (size_t i = 0; i < count; ++i) members[i].lock->let_go_of_lease(members[i].slot);
    char queues[1536];
    gang.describe(static_cast<uint32_t>(priority), queues, sizeof queues);
    return fail(err_busy, "device_lock::acquire_gang (try): not every device of the gang is free for it now: %s", queues);
  }
  gang.unlock_all();

  uint64_t last_tick = monotonic_ns();
  bool stop = false;
  while (!granted) {
    if (gang.all_holding()) {
      granted = true;
      break;
    }
    const uint64_t now = monotonic_ns();
    if (now >= deadline || stop) break;
    if (now - last_tick >= static_cast<uint64_t>(device_lock::k_liveness_poll_ns)) {
      // Each member device's liveness scan (a dead holder passes the device on), then a look.
      for (size_t i = 0; i < count; ++i) {
        members[i].lock->liveness_tick(std::min(deadline, now + static_cast<uint64_t>(device_lock::k_liveness_poll_ns)));
      }
      last_tick = now;
      stop = interrupted_now(false);
      if (gang.looks_grantable()) granted = gang.try_grant(std::min(deadline, monotonic_ns() + static_cast<uint64_t>(device_lock::k_mutex_try_ns)));
      continue;
    }
    const uint64_t wake = std::min(deadline, last_tick + static_cast<uint64_t>(device_lock::k_liveness_poll_ns));
    if (gang.sleep(wake) == EINTR) {
      stop = interrupted_now(true);
      continue;
    }
    if (gang.looks_grantable()) granted = gang.try_grant(std::min(deadline, monotonic_ns() + static_cast<uint64_t>(device_lock::k_mutex_try_ns)));
  }
  if (!granted) {
    gang.withdraw_all();
    char queues[1536];
    gang.describe(static_cast<uint32_t>(priority), queues, sizeof queues);
    if (stop) {
      return fail(err_interrupted, "device_lock::acquire_gang: interrupted after %.3f s of waiting for %zu devices (%s); this thread left their queues",
                  static_cast<double>(monotonic_ns() - start_ns) / 1e9, count, queues);
    }
    return fail(err_timeout,
                "device_lock::acquire_gang: the gang of %zu devices was not granted within %.3f s (it is granted when it is next "
                "on every one of them): %s. Wait longer, or see `vramswap status`",
                count, static_cast<double>(timeout_ns) / 1e9, queues);
  }
  for (size_t i = 0; i < count; ++i) {
    acquire_info* info = infos != nullptr ? &infos[members[i].caller_index] : nullptr;
    members[i].lock->became_holder(members[i].slot, members[i].ticket, me.pid, tid, start_ns, info);
  }
  return ok;
}

int device_lock::acquire_gang(device_lock* const* locks, size_t count, lock_priority priority, int64_t timeout_ns,
                              acquire_info* infos, uint64_t gang_id) noexcept {
  return gang_waiter::acquire(locks, count, priority, timeout_ns, infos, gang_id);
}

}  // namespace vramswap::detail
