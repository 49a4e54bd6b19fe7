// A waiter's wait for its grant (device_lock.hpp, Waiting): it sleeps on its own slot's
// futex, wakes every liveness period to run the liveness scan, spins through a heads-up
// (announce_release, the holder's side, is here too) and through a predicted release, and
// leaves the queue without the mutex when its time runs out or its wait_interrupt says stop.
#include "lock/device_lock.hpp"

#include <algorithm>
#include <cerrno>

#include "core/options.hpp"
#include "core/status.hpp"
#include "lock/futex.hpp"
#include "lock/process_identity.hpp"
#include "lock/queue_order.hpp"
#include "lock/segment_layout.hpp"
#include "lock/shared_segment.hpp"

namespace vramswap::detail {
using namespace lock_layout;

// Sleep until our slot is granted, the time runs out, or the thread's wait_interrupt says
// stop. Wakes every k_liveness_poll_ns to let the liveness scan run (rate-limited across all
// waiters of the segment).
int device_lock::wait_for_grant(uint32_t mine, uint64_t start_ns, int64_t timeout_ns, uint64_t deadline) noexcept {
  waiter_slot& slot = slots_of(segment_->base())[mine];
  const uint32_t my_priority = class_of(slot.priority.load(std::memory_order_relaxed));
  const uint64_t my_ticket = slot.ticket.load(std::memory_order_relaxed);
  uint64_t last_tick = monotonic_ns();
  uint64_t spun_for = 0;  // the predicted release this waiter already spun for
  bool stop = false;
  // Once, after VRAMSWAP_WAIT_NOTICE: a wait of minutes says whom it waits for.
  uint64_t notice_s = 0;
  bool noticed = option_uint(option_id::wait_notice, &notice_s) != ok || notice_s == 0;
  for (;;) {
    if (slot.state.load(std::memory_order_acquire) == slot_holding) return ok;
    const uint64_t now = monotonic_ns();
    if (now >= deadline || stop) break;
    if (!noticed && now - start_ns >= notice_s * 1'000'000'000) {
      noticed = true;
      give_wait_notice(start_ns, now, notice_s, my_priority, my_ticket);
    }
    if (now - last_tick >= static_cast<uint64_t>(k_liveness_poll_ns)) {
      liveness_tick(std::min(deadline, now + static_cast<uint64_t>(k_liveness_poll_ns)));
      last_tick = now;
      stop = interrupted_now(false);
      continue;
    }
    stop = sleep_for_grant(mine, now, last_tick, deadline, &spun_for);
  }
  return leave_queue_after_wait(mine, start_ns, timeout_ns, stop, my_priority, my_ticket);
}

// One sleep of a waiter, or a spin through a predicted release; returns true when a signal
// handler ran on this thread and its wait_interrupt says stop.
bool device_lock::sleep_for_grant(uint32_t mine, uint64_t now, uint64_t last_tick, uint64_t deadline,
                                  uint64_t* spun_for) noexcept {
  waiter_slot& slot = slots_of(segment_->base())[mine];
  uint64_t sleep_ns = std::min(last_tick + static_cast<uint64_t>(k_liveness_poll_ns) - now, deadline - now);
  // A regular holder's release is predictable: be awake for it.
  uint64_t predicted_until = 0;
  const uint64_t spin_from = predicted_spin_start(mine, &predicted_until);
  if (spin_from != 0 && predicted_until > now && *spun_for != predicted_until) {
    if (now >= spin_from) {
      *spun_for = predicted_until;  // one spin per predicted release
      const uint64_t until = std::min(predicted_until, deadline);
      while (slot.state.load(std::memory_order_acquire) == slot_waiting && monotonic_ns() < until) cpu_relax();
      return false;
    }
    sleep_ns = std::min(sleep_ns, spin_from - now);
  }
  const int wrc = futex_wait(&slot.state, slot_waiting, sleep_ns);
  if (wrc == EINTR) {
    // A signal handler ran on this thread: the caller may want to stop.
    return interrupted_now(true);
  }
  // Back well before the timeout and not granted: a heads-up (announce_release), most
  // likely. The grant follows within microseconds; spin for it rather than sleep again.
  const uint64_t woke = monotonic_ns();
  if (woke - now < sleep_ns && slot.state.load(std::memory_order_acquire) == slot_waiting) {
    const uint64_t heads_up_until = std::min(woke + static_cast<uint64_t>(k_heads_up_spin_ns), deadline);
    while (slot.state.load(std::memory_order_acquire) == slot_waiting && monotonic_ns() < heads_up_until) cpu_relax();
  }
  return false;
}

// The wait ended without a grant seen (time ran out, or `stopped` by the wait_interrupt).
// `my_priority` and `my_ticket`: the waiter's, read before it leaves (the slot may be
// reused after that).
int device_lock::leave_queue_after_wait(uint32_t mine, uint64_t start_ns, int64_t timeout_ns, bool stopped,
                                        uint32_t my_priority, uint64_t my_ticket) noexcept {
  waiter_slot& slot = slots_of(segment_->base())[mine];
  // Leave the queue without the mutex (its owner may be stopped), unless the grant came.
  if (!withdraw(mine)) {
    const uint32_t state = slot.state.load(std::memory_order_acquire);
    if (state == slot_holding) return ok;
    let_go_of_lease(mine);  // the slot is no longer ours: neither is its lease
    return fail(err_internal, "device_lock::acquire: our queue slot %u of %s was removed while we waited (state %u)",
                mine, segment_->name().c_str(), state);
  }
  char queue[768];
  describe_queue(my_priority, my_ticket, queue, sizeof queue);
  if (stopped) {
    return fail(err_interrupted, "device_lock::acquire: interrupted after %.3f s of waiting for %s (%s); this thread left the queue",
                static_cast<double>(monotonic_ns() - start_ns) / 1e9, segment_->name().c_str(), queue);
  }
  return fail(err_timeout, "device_lock::acquire: %s not granted within %.3f s: %s. Wait longer, or see `vramswap status`",
              segment_->name().c_str(), static_cast<double>(timeout_ns) / 1e9, queue);
}

// --- the heads-up and the predicted release ---------------------------------------------

void device_lock::announce_release() noexcept {
  if (segment_ == nullptr || depth_ != 1) return;
  process_identity me{};
  if (current_process(&me) != ok || !held_by(me.pid, current_tid())) return;
  // Without the mutex: this is a hint. A slot read mid-change at worst wakes the wrong
  // waiter, which spins briefly and sleeps again.
  const uint32_t best = next_in_line();
  if (best != k_no_slot) futex_wake_one(&slots_of(segment_->base())[best].state);
}

uint32_t device_lock::next_in_line() const noexcept {
  const lock_state* st = lock_state_of(segment_->base());
  return choose_next(slots_of(segment_->base()), std::min(st->slot_high_water.load(), k_slot_count));
}

uint64_t device_lock::predicted_spin_start(uint32_t mine, uint64_t* spin_until) const noexcept {
  const lock_state* st = lock_state_of(segment_->base());
  const uint64_t granted = st->holder_granted_ns.load(std::memory_order_relaxed);
  const hold_stats h = holds();
  if (granted == 0 || !h.predictable || st->holder_slot == k_no_slot) return 0;
  const uint64_t mean = h.mean_ns, jitter = h.jitter_ns;
  if (next_in_line() != mine) return 0;
  const uint64_t expected = granted + mean;
  const uint64_t margin = static_cast<uint64_t>(k_predict_margin_ns) + jitter;
  const uint64_t from = expected > margin ? expected - margin : 1;
  *spin_until = std::min(expected + margin, from + static_cast<uint64_t>(k_predict_spin_max_ns));
  return from;
}

}  // namespace vramswap::detail
