// What the lock tells people (device_lock.hpp, Fair turns): the notice of a wait past
// VRAMSWAP_WAIT_NOTICE, a hold past its VRAMSWAP_MAX_HOLD while others wait (marked in the
// holder's slot and said once per hold), and an operator's request to release
// (request_release, reported by the holder's check_hold). Nothing here takes the lock from
// anyone.
#include "lock/device_lock.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <string>

#include "core/log.hpp"
#include "core/status.hpp"
#include "lock/crash_points.hpp"
#include "lock/lock_messages.hpp"
#include "lock/ownership.hpp"
#include "lock/process_identity.hpp"
#include "lock/queue_order.hpp"
#include "lock/segment_layout.hpp"
#include "lock/shared_segment.hpp"

namespace vramswap::detail {
using namespace lock_layout;

namespace {

// Who asked a holder to release, and when (0: nobody), copied from its slot.
struct release_asker {
  uint64_t asked_ns;
  pid_t pid;
  uint64_t pid_ns;
  uint32_t uid;
};

release_asker release_asker_of(const waiter_slot& slot) {
  return {slot.release_requested_ns.load(std::memory_order_acquire), slot.release_requester_pid.load(std::memory_order_relaxed),
          slot.release_requester_pid_ns.load(std::memory_order_relaxed), slot.release_requester_uid.load(std::memory_order_relaxed)};
}

// The holder's warning, at a safe point, that it has held `segment` past its limit.
void warn_held_past_limit(const char* segment, const char* held, uint64_t limit_ns, const waiter_list& waiters, uint64_t now) {
  char limit[32], who[1024];
  format_duration(limit_ns, limit, sizeof limit);
  waiters.describe(now, who, sizeof who);
  log(log_level::warn,
      "lock: this process has held %s for %s, past its VRAMSWAP_MAX_HOLD of %s, while others wait (%u waiting%s%s). "
      "Release it when you can: its next acquire queues behind every one still waiting then (docs/concepts.md, Fair turns)",
      segment, held, limit, waiters.count, waiters.count > 0 ? ": " : "", who);
}

// The holder's report of an operator's request to release `segment`, and the signal it asked
// for (release_signal, 0: none).
void tell_release_requested(const char* segment, const release_asker& asker, const char* held, uint32_t waiting,
                            int release_signal, uint64_t now) {
  char by[192];
  describe_process_in(asker.pid, asker.pid_ns, by, sizeof by);
  std::string owner;
  try {
    owner = describe_uid(asker.uid);
  } catch (...) {  // out of memory: the uid's name is a nicety
  }
  char ago[32];
  format_duration(now > asker.asked_ns ? now - asker.asked_ns : 0, ago, sizeof ago);
  log(log_level::warn,
      "lock: %s%s%s asked this process to release %s (`vramswap release-request`, %s ago), which it has held for %s; "
      "%u waiting. Nothing is taken from it: release the lock when you can (vramswap.release_requested() tells the "
      "program)%s",
      by, owner.empty() ? "" : " of ", owner.c_str(), segment, ago, held, waiting,
      release_signal != 0 ? "; VRAMSWAP_RELEASE_SIGNAL is set: sending it to this process" : "");
  if (release_signal != 0) ::kill(::getpid(), release_signal);
}

}  // namespace

// --- wait notices -----------------------------------------------------------------------

void device_lock::give_wait_notice(uint64_t start_ns, uint64_t now, uint64_t notice_s, uint32_t my_priority,
                                   uint64_t my_ticket) noexcept {
  // Once per wait, and at most once per k_wait_notice_spacing notice times: a job whose
  // every turn waits past it (several jobs sharing a device) says so once in a while,
  // with a count, rather than a line per turn for days.
  const uint64_t last = last_wait_notice_ns_.load(std::memory_order_relaxed);
  if (last != 0 && now - last < k_wait_notice_spacing * notice_s * 1'000'000'000) {
    wait_notices_held_.fetch_add(1, std::memory_order_relaxed);
  } else {
    last_wait_notice_ns_.store(now, std::memory_order_relaxed);
    const uint32_t held = wait_notices_held_.exchange(0, std::memory_order_relaxed);
    char queue[768];
    describe_queue(my_priority, my_ticket, queue, sizeof queue);
    char since[96] = "";
    if (held > 0) std::snprintf(since, sizeof since, "; %u more wait(s) that long since the last notice", held);
    log(log_level::warn, "lock: waiting %.1f s for %s: %s (VRAMSWAP_WAIT_NOTICE=%" PRIu64 "; said once per wait, at most every %" PRIu64
        " s%s)", static_cast<double>(now - start_ns) / 1e9, segment_->name().c_str(), queue, notice_s,
        k_wait_notice_spacing * notice_s, since);
  }
}

// --- holds past their limit -------------------------------------------------------------

uint64_t device_lock::note_over_limit_locked(uint32_t holder, uint64_t now) noexcept {
  if (holder >= k_slot_count) return 0;
  lock_state* st = lock_state_of(segment_->base());
  waiter_slot* slots = slots_of(segment_->base());
  waiter_slot& h = slots[holder];
  if (h.state.load(std::memory_order_relaxed) != slot_holding) return 0;
  const uint64_t marked = h.over_limit_since_ns.load(std::memory_order_relaxed);
  if (marked != 0) return marked;
  const uint64_t limit = h.max_hold_ns.load(std::memory_order_relaxed);
  const uint64_t granted = h.granted_ns.load(std::memory_order_relaxed);
  if (limit == 0 || granted == 0 || now < granted || now - granted < limit) return 0;
  // Past the limit; since when did someone wait? (The earliest waiter now: one that gave up
  // meanwhile no longer counts.)
  uint64_t first_wait = UINT64_MAX;
  const uint32_t end = std::min(st->slot_high_water.load(), k_slot_count);
  for (uint32_t i = 0; i < end; ++i) {
    if (!in_order(slots[i])) continue;  // a gang rank whose gang is still forming waits for its peers, not for us
    first_wait = std::min(first_wait, slots[i].enqueue_ns);
  }
  if (first_wait == UINT64_MAX) return 0;
  const uint64_t since = std::min(now, std::max(granted + limit, first_wait));
  h.over_limit_since_ns.store(since, std::memory_order_release);
  at_crash_point(crash_point::over_limit_marked);
  return since;
}

void device_lock::warn_over_limit_at_release(uint64_t ticket, uint64_t held_ns, uint64_t now,
                                             const waiter_list& waiters) noexcept {
  uint64_t unwarned = warned_over_ticket_.load(std::memory_order_relaxed);
  if (unwarned != ticket && warned_over_ticket_.compare_exchange_strong(unwarned, ticket)) {
    // Not said while holding (no safe point came): say it now, once.
    char held[32], limit[32], who[1024];
    format_duration(held_ns, held, sizeof held);
    format_duration(max_hold_ns_, limit, sizeof limit);
    waiters.describe(now, who, sizeof who);
    log(log_level::warn,
        "lock: this process held %s for %s, past its VRAMSWAP_MAX_HOLD of %s, while others waited (%u waiting at its release%s%s); "
        "its next acquire queues behind them (docs/concepts.md, Fair turns)",
        segment_->name().c_str(), held, limit, waiters.count, waiters.count > 0 ? ": " : "", who);
  }
}

bool device_lock::holder_over_hold_limit(uint64_t* since_ns) const noexcept {
  if (segment_ == nullptr) return false;
  const lock_state* st = lock_state_of(segment_->base());
  const waiter_slot* slots = slots_of(segment_->base());
  const uint32_t h = st->holder_slot.load(std::memory_order_relaxed);
  if (h >= k_slot_count || slots[h].state.load(std::memory_order_acquire) != slot_holding) return false;
  const uint64_t since = slots[h].over_limit_since_ns.load(std::memory_order_acquire);
  if (since == 0) return false;
  if (since_ns != nullptr) *since_ns = since;
  return true;
}

// --- the holder's check, and release requests -------------------------------------------

hold_check device_lock::check_hold() noexcept {
  hold_check out;
  if (segment_ == nullptr || !segment_->opened_in_this_process()) return out;
  process_identity me{};
  if (current_process(&me) != ok || holder_pid_.load(std::memory_order_acquire) != me.pid) return out;
  const uint32_t mine = holder_slot_.load(std::memory_order_relaxed);
  const uint64_t ticket = hold_ticket_.load(std::memory_order_acquire);
  if (mine >= k_slot_count) return out;
  lock_state* st = lock_state_of(segment_->base());
  waiter_slot* slots = slots_of(segment_->base());
  waiter_slot& slot = slots[mine];
  const uint64_t now = monotonic_ns();
  // Without the mutex first: most checks find nothing new to say.
  const uint64_t granted = slot.granted_ns.load(std::memory_order_relaxed);
  out.holding = true;
  out.max_hold_ns = max_hold_ns_;
  out.held_ns = granted != 0 && now > granted ? now - granted : 0;
  out.over_limit_since_ns = slot.over_limit_since_ns.load(std::memory_order_relaxed);
  out.release_requested = slot.release_requested_ns.load(std::memory_order_relaxed) != 0;
  const bool may_be_over = out.over_limit_since_ns != 0 ||
                           (max_hold_ns_ != 0 && out.held_ns >= max_hold_ns_ && st->waiter_count.load(std::memory_order_relaxed) > 0);
  const bool warn_over = may_be_over && warned_over_ticket_.load(std::memory_order_relaxed) != ticket;
  const bool tell_request = out.release_requested && told_release_ticket_.load(std::memory_order_relaxed) != ticket;
  if (!warn_over && !tell_request) return out;

  // Something to say: make sure, under the mutex, that the slot is still this hold, mark it,
  // and copy what the messages name.
  if (lock_mutex(now + static_cast<uint64_t>(k_mutex_try_ns)) != ok) return out;  // the next check tries again
  if (slot.state.load(std::memory_order_relaxed) != slot_holding || slot.ticket.load(std::memory_order_relaxed) != ticket ||
      slot.pid != me.pid) {
    unlock_mutex();
    return hold_check{};  // released meanwhile
  }
  out.over_limit_since_ns = note_over_limit_locked(mine, now);
  waiter_list waiters;
  waiters.collect(slots, std::min(st->slot_high_water.load(), k_slot_count));
  const release_asker asker = release_asker_of(slot);
  unlock_mutex();

  char held[32];
  format_duration(out.held_ns, held, sizeof held);
  uint64_t unwarned = warned_over_ticket_.load(std::memory_order_relaxed);
  if (out.over_limit_since_ns != 0 && unwarned != ticket && warned_over_ticket_.compare_exchange_strong(unwarned, ticket)) {
    warn_held_past_limit(segment_->name().c_str(), held, max_hold_ns_, waiters, now);
  }
  uint64_t untold = told_release_ticket_.load(std::memory_order_relaxed);
  if (asker.asked_ns != 0 && untold != ticket && told_release_ticket_.compare_exchange_strong(untold, ticket)) {
    tell_release_requested(segment_->name().c_str(), asker, held, waiters.count, release_signal_, now);
  }
  out.release_requested = asker.asked_ns != 0;
  return out;
}

int device_lock::request_release(release_request_result* out, int64_t wait_ns) noexcept {
  if (segment_ == nullptr) return fail(err_invalid_argument, "device_lock::request_release: this lock is not open");
  if (out == nullptr) return fail(err_invalid_argument, "device_lock::request_release: out is null");
  *out = release_request_result{};
  process_identity me{};
  VS_TRY(current_process(&me));
  lock_state* st = lock_state_of(segment_->base());
  waiter_slot* slots = slots_of(segment_->base());
  if (const int mrc = lock_mutex(deadline_after(monotonic_ns(), wait_ns)); mrc != ok) {
    return add_context(mrc, "device_lock::request_release: ");
  }
  const uint64_t now = monotonic_ns();
  const uint32_t h = st->holder_slot.load(std::memory_order_relaxed);
  if (h < k_slot_count && slots[h].state.load(std::memory_order_relaxed) == slot_holding) {
    waiter_slot& slot = slots[h];
    note_over_limit_locked(h, now);
    const uint64_t granted = slot.granted_ns.load(std::memory_order_relaxed);
    out->held = true;
    out->pid = slot.pid;
    out->pid_ns = slot.pid_ns;
    out->uid = slot.uid;
    out->held_ns = granted != 0 && now > granted ? now - granted : 0;
    out->max_hold_ns = slot.max_hold_ns.load(std::memory_order_relaxed);
    out->over_limit_since_ns = slot.over_limit_since_ns.load(std::memory_order_relaxed);
    out->already_asked = slot.release_requested_ns.load(std::memory_order_relaxed) != 0;
    if (!out->already_asked) {
      // Publication order: who asks, then when (the time is the flag).
      slot.release_requester_pid.store(me.pid, std::memory_order_relaxed);
      slot.release_requester_pid_ns.store(me.pid_ns, std::memory_order_relaxed);
      slot.release_requester_uid.store(static_cast<uint32_t>(::geteuid()), std::memory_order_relaxed);
      at_crash_point(crash_point::release_request_stored);
      slot.release_requested_ns.store(now, std::memory_order_release);
    }
  }
  unlock_mutex();
  return ok;
}

}  // namespace vramswap::detail
