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
#include "lock/gang_waiter.hpp"
#include "lock/futex.hpp"
#include "lock/liveness_lease.hpp"
#include "lock/process_identity.hpp"
#include "lock/queue_order.hpp"
#include "lock/segment_layout.hpp"
#include "lock/shared_segment.hpp"
#include "lock/wait_bounds.hpp"

namespace vramswap::detail {
using namespace lock_layout;

int gang_waiter::acquire(device_lock* const* locks, size_t count, lock_priority priority, int64_t timeout_ns,
                         acquire_info* infos, uint64_t gang_id) noexcept {
  const uint64_t start_ns = monotonic_ns();
  if (infos != nullptr) {
    for (size_t i = 0; i < count; ++i) infos[i] = acquire_info{};
  }
  VS_TRY(check_request(locks, count, priority, timeout_ns));
  member members[device_lock::k_max_gang];
  VS_TRY(sort_members(locks, count, members));
  if (count == 1) return locks[0]->acquire(priority, timeout_ns, infos);
  for (size_t i = 0; i < count; ++i) VS_TRY(members[i].lock->reopen_if_forked());
  process_identity me{};
  VS_TRY(current_process(&me));
  const pid_t tid = current_tid();
  gang_waiter gang(members, count);
  bool reentered = false;
  VS_TRY(gang.reenter_if_held(me.pid, tid, infos, &reentered));
  if (reentered) return ok;
  if (gang_id == 0) gang_id = (static_cast<uint64_t>(static_cast<uint32_t>(me.pid)) << 32) | static_cast<uint32_t>(tid);

  const uint64_t deadline = deadline_after(start_ns, timeout_ns);
  const uint64_t mutex_deadline = std::max(deadline, start_ns + static_cast<uint64_t>(device_lock::k_mutex_try_ns));
  VS_TRY(gang.enqueue(priority, timeout_ns, mutex_deadline, me, tid, start_ns, gang_id));
  bool granted = gang.grantable_locked() && gang.grant_locked();
  if (!granted && timeout_ns == 0) return gang.give_up_try_locked(priority);
  gang.unlock_all();

  bool stop = false;
  if (!granted) granted = gang.wait_for_grant(deadline, &stop);
  if (!granted) return gang.give_up_wait(priority, stop, start_ns, timeout_ns);
  for (size_t i = 0; i < count; ++i) {
    acquire_info* info = infos != nullptr ? &infos[members[i].caller_index] : nullptr;
    members[i].lock->became_holder(members[i].slot, members[i].ticket, me.pid, tid, start_ns, info);
  }
  return ok;
}

int gang_waiter::check_request(device_lock* const* locks, size_t count, lock_priority priority, int64_t timeout_ns) noexcept {
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
  return ok;
}

int gang_waiter::sort_members(device_lock* const* locks, size_t count, member* out) noexcept {
  for (size_t i = 0; i < count; ++i) {
    if (locks[i] == nullptr || locks[i]->segment_ == nullptr) {
      return fail(err_invalid_argument, "device_lock::acquire_gang: lock %zu of the gang is not open; call device_lock::open first", i);
    }
    out[i].lock = locks[i];
    out[i].caller_index = i;
  }
  // The one order in which everybody takes several devices' mutexes.
  std::sort(out, out + count, [](const member& a, const member& b) { return a.lock->device_key_ < b.lock->device_key_; });
  for (size_t i = 1; i < count; ++i) {
    if (out[i].lock->device_key_ == out[i - 1].lock->device_key_) {
      return fail(err_invalid_argument, "device_lock::acquire_gang: device %s is in the gang twice; list each device once",
                  out[i].lock->device_key_.c_str());
    }
  }
  return ok;
}

int gang_waiter::reenter_if_held(pid_t pid, pid_t tid, acquire_info* infos, bool* reentered) noexcept {
  size_t held = 0;
  for (size_t i = 0; i < n_; ++i) held += m_[i].lock->held_by(pid, tid) ? 1 : 0;
  if (held == n_) {
    for (size_t i = 0; i < n_; ++i) {
      if (m_[i].lock->depth_ == std::numeric_limits<uint32_t>::max()) {
        return fail(err_invalid_argument, "device_lock::acquire_gang: re-entered %u times without release", m_[i].lock->depth_);
      }
    }
    for (size_t i = 0; i < n_; ++i) {
      ++m_[i].lock->depth_;
      if (infos != nullptr) infos[m_[i].caller_index].reentered = true;
    }
    *reentered = true;
    return ok;
  }
  if (held != 0) {
    std::string which;
    for (size_t i = 0; i < n_; ++i) {
      if (m_[i].lock->held_by(pid, tid)) which += (which.empty() ? "" : ", ") + m_[i].lock->segment_->name();
    }
    return fail(err_invalid_argument,
                "device_lock::acquire_gang: this thread already holds %s of the gang's %zu devices; waiting for the rest while "
                "holding those could deadlock. Release them first, or hold the whole gang",
                which.c_str(), n_);
  }
  return ok;
}

int gang_waiter::enqueue(lock_priority priority, int64_t timeout_ns, uint64_t mutex_deadline, const process_identity& me, pid_t tid,
                         uint64_t start_ns, uint64_t gang_id) noexcept {
  if (const int mrc = lock_all(mutex_deadline, /*interruptible=*/true); mrc != ok) {
    if (mrc == err_timeout && timeout_ns == 0) return add_context(err_busy, "device_lock::acquire_gang (try): ");
    return add_context(mrc, "device_lock::acquire_gang: ");
  }
  // Every slot first (any may be the one that fails), then publish them all.
  for (size_t i = 0; i < n_; ++i) {
    if (const int trc = m_[i].lock->take_slot_locked(&m_[i].slot); trc != ok) {
      for (size_t j = 0; j < i; ++j) m_[j].lock->let_go_of_lease(m_[j].slot);
      unlock_all();
      return trc;
    }
  }
  const uint32_t word = static_cast<uint32_t>(priority) | k_gang_member;
  for (size_t i = 0; i < n_; ++i) {
    device_lock* l = m_[i].lock;
    m_[i].ticket = lock_state_of(l->segment_->base())->next_ticket;
    l->publish_slot_locked(m_[i].slot, word, me, tid, start_ns, /*behind=*/0, gang_id);
    if (i == 0) at_crash_point(crash_point::gang_enqueued_one);
  }
  return ok;
}

int gang_waiter::give_up_try_locked(lock_priority priority) noexcept {
  for (size_t i = 0; i < n_; ++i) {
    lock_state* st = lock_state_of(m_[i].lock->segment_->base());
    slot_of(i).state.store(slot_free, std::memory_order_release);
    at_crash_point(crash_point::timeout_slot_freed);
    --st->waiter_count;
  }
  unlock_all();
  for (size_t i = 0; i < n_; ++i) m_[i].lock->let_go_of_lease(m_[i].slot);
  char queues[1536];
  describe(static_cast<uint32_t>(priority), queues, sizeof queues);
  return fail(err_busy, "device_lock::acquire_gang (try): not every device of the gang is free for it now: %s", queues);
}

bool gang_waiter::wait_for_grant(uint64_t deadline, bool* stop) noexcept {
  uint64_t last_tick = monotonic_ns();
  for (;;) {
    if (all_holding()) return true;
    const uint64_t now = monotonic_ns();
    if (now >= deadline || *stop) return false;
    if (now - last_tick >= static_cast<uint64_t>(device_lock::k_liveness_poll_ns)) {
      // Each member device's liveness scan (a dead holder passes the device on), then a look.
      for (size_t i = 0; i < n_; ++i) {
        m_[i].lock->liveness_tick(std::min(deadline, now + static_cast<uint64_t>(device_lock::k_liveness_poll_ns)));
      }
      last_tick = now;
      *stop = interrupted_now(false);
      if (looks_grantable() && try_grant(std::min(deadline, monotonic_ns() + static_cast<uint64_t>(device_lock::k_mutex_try_ns)))) {
        return true;
      }
      continue;
    }
    const uint64_t wake = std::min(deadline, last_tick + static_cast<uint64_t>(device_lock::k_liveness_poll_ns));
    if (sleep(wake) == EINTR) {
      *stop = interrupted_now(true);
      continue;
    }
    if (looks_grantable() && try_grant(std::min(deadline, monotonic_ns() + static_cast<uint64_t>(device_lock::k_mutex_try_ns)))) {
      return true;
    }
  }
}

int gang_waiter::give_up_wait(lock_priority priority, bool stop, uint64_t start_ns, int64_t timeout_ns) noexcept {
  withdraw_all();
  char queues[1536];
  describe(static_cast<uint32_t>(priority), queues, sizeof queues);
  if (stop) {
    return fail(err_interrupted, "device_lock::acquire_gang: interrupted after %.3f s of waiting for %zu devices (%s); this thread left their queues",
                static_cast<double>(monotonic_ns() - start_ns) / 1e9, n_, queues);
  }
  return fail(err_timeout,
              "device_lock::acquire_gang: the gang of %zu devices was not granted within %.3f s (it is granted when it is next "
              "on every one of them): %s. Wait longer, or see `vramswap status`",
              n_, static_cast<double>(timeout_ns) / 1e9, queues);
}

int device_lock::acquire_gang(device_lock* const* locks, size_t count, lock_priority priority, int64_t timeout_ns,
                              acquire_info* infos, uint64_t gang_id) noexcept {
  return gang_waiter::acquire(locks, count, priority, timeout_ns, infos, gang_id);
}

}  // namespace vramswap::detail
