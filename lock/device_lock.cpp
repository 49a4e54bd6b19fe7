#include "lock/device_lock.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <limits>

#include "core/log.hpp"
#include "core/options.hpp"
#include "core/status.hpp"
#include "lock/crash_points.hpp"
#include "lock/futex.hpp"
#include "lock/liveness_lease.hpp"
#include "lock/ownership.hpp"
#include "lock/process_identity.hpp"
#include "lock/queue_order.hpp"
#include "lock/lease_mutex.hpp"
#include "lock/segment_layout.hpp"
#include "lock/shared_segment.hpp"

namespace vramswap::detail {
using namespace lock_layout;

namespace {

bool valid_priority(lock_priority p) { return p == lock_priority::normal || p == lock_priority::high; }

// "0.30 s", "12.5 s", "2.0 h": a duration for messages.
void format_duration(uint64_t ns, char* buf, size_t size) {
  const double s = static_cast<double>(ns) / 1e9;
  if (s < 10) {
    std::snprintf(buf, size, "%.2f s", s);
  } else if (s < 120) {
    std::snprintf(buf, size, "%.1f s", s);
  } else if (s < 7200) {
    std::snprintf(buf, size, "%.1f min", s / 60);
  } else {
    std::snprintf(buf, size, "%.1f h", s / 3600);
  }
}

// Up to four waiters, copied from the slots (under the mutex, so that no /proc read happens
// there) and described after it: "pid 12 (python3) of uid 1000, waiting 3.2 s, ...".
struct waiter_list {
  struct entry {
    pid_t pid;
    uint64_t pid_ns;
    uint32_t uid;
    uint64_t enqueue_ns;
  } first[4];
  uint32_t shown = 0;
  uint32_t count = 0;

  void collect(const waiter_slot* slots, uint32_t end) {
    for (uint32_t i = 0; i < end; ++i) {
      if (slots[i].state.load(std::memory_order_relaxed) != slot_waiting) continue;
      if (shown < 4) {
        first[shown++] = {__atomic_load_n(&slots[i].pid, __ATOMIC_RELAXED), __atomic_load_n(&slots[i].pid_ns, __ATOMIC_RELAXED),
                          __atomic_load_n(&slots[i].uid, __ATOMIC_RELAXED), __atomic_load_n(&slots[i].enqueue_ns, __ATOMIC_RELAXED)};
      }
      ++count;
    }
  }

  void describe(uint64_t now, char* buf, size_t size) const {
    size_t used = 0;
    buf[0] = '\0';
    char who[192], waited[32];
    for (uint32_t i = 0; i < shown; ++i) {
      describe_process_in(first[i].pid, first[i].pid_ns, who, sizeof who);
      std::string owner;
      try {
        owner = describe_uid(first[i].uid);
      } catch (...) {  // out of memory: the uid's name is a nicety
      }
      format_duration(now > first[i].enqueue_ns ? now - first[i].enqueue_ns : 0, waited, sizeof waited);
      const int n = std::snprintf(buf + used, size - used, "%s%s%s%s, waiting %s", i == 0 ? "" : "; ", who,
                                  owner.empty() ? "" : " of ", owner.c_str(), waited);
      if (n < 0 || static_cast<size_t>(n) >= size - used) return;
      used += static_cast<size_t>(n);
    }
    if (count > shown) std::snprintf(buf + used, size - used, "; and %u more", count - shown);
  }
};

int signal_of(const std::string& name) {
  if (name == "SIGINT") return SIGINT;
  if (name == "SIGTERM") return SIGTERM;
  if (name == "SIGUSR1") return SIGUSR1;
  if (name == "SIGUSR2") return SIGUSR2;
  return 0;
}

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

// Should this thread's wait stop? (device_lock.hpp, Interruption)
bool interrupted(bool signal_ran) noexcept { return interrupted_now(signal_ran); }

constexpr uint64_t k_forever = std::numeric_limits<uint64_t>::max();

uint64_t deadline_after(uint64_t now, int64_t wait_ns) {
  return wait_ns < 0 ? k_forever : now + static_cast<uint64_t>(wait_ns);
}

// Append printf-style to buf (size bytes, *used of them taken); truncates quietly.
void appendf(char* buf, size_t size, size_t* used, const char* fmt, ...) __attribute__((format(printf, 4, 5)));
void appendf(char* buf, size_t size, size_t* used, const char* fmt, ...) {
  if (*used + 1 >= size) return;
  va_list ap;
  va_start(ap, fmt);
  const int n = std::vsnprintf(buf + *used, size - *used, fmt, ap);
  va_end(ap);
  if (n > 0) *used = std::min(size - 1, *used + static_cast<size_t>(n));
}

}  // namespace

device_lock::device_lock() noexcept = default;

device_lock::~device_lock() {
  if (segment_ != nullptr && held()) {
    depth_ = 1;
    release();
  }
}

device_lock::device_lock(device_lock&& other) noexcept { *this = std::move(other); }

device_lock& device_lock::operator=(device_lock&& other) noexcept {
  if (this == &other) return *this;
  if (segment_ != nullptr && held()) {
    depth_ = 1;
    release();
  }
  segment_ = std::move(other.segment_);
  device_key_ = std::move(other.device_key_);
  holder_pid_.store(other.holder_pid_.load());
  holder_tid_.store(other.holder_tid_.load());
  holder_slot_.store(other.holder_slot_.load());
  depth_ = other.depth_;
  max_hold_ns_ = other.max_hold_ns_;
  release_signal_ = other.release_signal_;
  uid_ = other.uid_;
  penalty_behind_.store(other.penalty_behind_.load());
  hold_ticket_.store(other.hold_ticket_.load());
  warned_over_ticket_.store(other.warned_over_ticket_.load());
  told_release_ticket_.store(other.told_release_ticket_.load());
  other.penalty_behind_.store(0);
  other.holder_pid_.store(0);
  other.holder_tid_.store(0);
  other.depth_ = 0;
  return *this;
}

int device_lock::open(const std::string& device_key, device_lock* out) noexcept {
  if (out == nullptr) return fail(err_invalid_argument, "device_lock::open: out is null");
  process_identity me{};
  VS_TRY(current_process(&me));
  uint64_t max_hold_ns = 0;
  VS_TRY(add_context(option_duration_ns(option_id::max_hold, &max_hold_ns), "device_lock::open(%s): ", device_key.c_str()));
  std::string release_signal;
  try {
    release_signal = option_text(option_id::release_signal);
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "device_lock::open: out of host memory");
  }
  if (!release_signal.empty() && signal_of(release_signal) == 0) {
    VS_TRY(add_context(option_check(option_id::release_signal, release_signal.c_str()), "device_lock::open(%s): ",
                       device_key.c_str()));
  }
  std::unique_ptr<shared_segment> segment;
  VS_TRY(shared_segment::open(device_key, &segment));
  device_lock opened;
  opened.segment_ = std::move(segment);
  opened.max_hold_ns_ = max_hold_ns;
  opened.release_signal_ = signal_of(release_signal);
  opened.uid_ = static_cast<uint32_t>(::geteuid());
  try {
    opened.device_key_ = device_key;
  } catch (const std::bad_alloc&) {
    return fail(err_out_of_memory, "device_lock::open: out of host memory");
  }
  *out = std::move(opened);
  return ok;
}

int device_lock::remove(const std::string& device_key) noexcept { return shared_segment::remove(device_key); }

bool device_lock::held_by(pid_t pid, pid_t tid) const noexcept {
  return holder_tid_.load(std::memory_order_relaxed) == tid && holder_pid_.load(std::memory_order_relaxed) == pid;
}

bool device_lock::held() const noexcept {
  process_identity me{};
  if (segment_ == nullptr || current_process(&me) != 0) return false;
  return held_by(me.pid, current_tid());
}

void device_lock::forget_holding() noexcept {
  holder_tid_.store(0, std::memory_order_relaxed);
  holder_pid_.store(0, std::memory_order_relaxed);
  depth_ = 0;
}

uint64_t device_lock::recoveries() const noexcept {
  return segment_ == nullptr ? 0 : lock_state_of(segment_->base())->recoveries;
}

// --- the internal mutex and the one recovery function ------------------------------------

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
    if (interrupted(false)) {
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
  at_crash_point(crash_point::recovery_midway);
  uint32_t holder = k_no_slot;
  uint32_t waiters = 0;
  uint32_t high_water = 0;
  for (uint32_t i = 0; i < k_slot_count; ++i) {
    const uint32_t state = slots[i].state.load(std::memory_order_relaxed);
    if (state == slot_free) continue;
    high_water = i + 1;
    if (state == slot_waiting) {
      ++waiters;
    } else if (holder == k_no_slot) {
      holder = i;
    } else {
      st->broken = 1;
      return fail(err_internal,
                  "lock: slots %u and %u of %s both hold the lock, which no sequence of deaths can cause "
                  "(memory corruption); the segment is now marked broken: stop every process using this device and "
                  "remove it",
                  holder, i, segment_->name().c_str());
    }
  }
  const uint32_t holder_before = st->holder_slot.load(std::memory_order_relaxed);
  if (holder_before != holder || st->waiter_count != waiters || st->slot_high_water != high_water) repaired = true;
  st->holder_slot = holder;
  st->waiter_count = waiters;
  st->slot_high_water = high_water;
  // With nobody holding, a waiter should have been granted, unless the next is a gang
  // member waiting for its other devices (which is not a repair).
  if (holder == k_no_slot && waiters > 0 && dispatch_locked(k_no_slot) != k_no_slot) repaired = true;
  if (repaired) ++st->recoveries;
  // A dead holder's yielding jobs run again (or look at the next holder).
  if (st->holder_slot.load(std::memory_order_relaxed) != holder_before &&
      st->compute_watchers.load(std::memory_order_seq_cst) != 0) {
    futex_wake_all(&st->holder_slot);
  }
  return ok;
}

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

// --- acquire / release ----------------------------------------------------------------

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

int device_lock::acquire(lock_priority priority, int64_t timeout_ns, acquire_info* info) noexcept {
  const uint64_t start_ns = monotonic_ns();
  if (info != nullptr) *info = acquire_info{};
  if (segment_ == nullptr) {
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
  VS_TRY(reopen_if_forked());
  process_identity me{};
  VS_TRY(current_process(&me));
  const pid_t tid = current_tid();
  if (held_by(me.pid, tid)) {
    if (depth_ == std::numeric_limits<uint32_t>::max()) {
      return fail(err_invalid_argument, "device_lock::acquire: re-entered %u times without release", depth_);
    }
    ++depth_;
    if (info != nullptr) info->reentered = true;
    return ok;
  }

  lock_state* st = lock_state_of(segment_->base());
  waiter_slot* slots = slots_of(segment_->base());
  const uint64_t deadline = deadline_after(start_ns, timeout_ns);
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
  if (st->holder_slot == k_no_slot) dispatch_locked(mine);
  const uint64_t my_ticket = slot.ticket;

  if (slot.state.load(std::memory_order_relaxed) != slot_holding && timeout_ns == 0) {
    slot.state.store(slot_free, std::memory_order_release);
    at_crash_point(crash_point::timeout_slot_freed);
    --st->waiter_count;
    unlock_mutex();
    let_go_of_lease(mine);
    char queue[768];
    describe_queue(static_cast<uint32_t>(priority), my_ticket, queue, sizeof queue);
    return fail(err_busy, "device_lock::try_acquire: %s is taken: %s", segment_->name().c_str(), queue);
  }
  unlock_mutex();

  VS_TRY(wait_for_grant(mine, start_ns, timeout_ns, deadline));
  // The penalty is spent by this grant (unless a later long hold has set a new one).
  uint64_t spent = penalty;
  if (spent != 0) penalty_behind_.compare_exchange_strong(spent, 0, std::memory_order_relaxed);
  became_holder(mine, my_ticket, me.pid, tid, start_ns, info);
  return ok;
}

int device_lock::reopen_if_forked() noexcept {
  if (segment_->opened_in_this_process()) return ok;
  // A forked child: its descriptor of the segment was its parent's (liveness_lease.hpp).
  std::unique_ptr<shared_segment> own;
  VS_TRY(shared_segment::open(device_key_, &own));
  segment_ = std::move(own);
  penalty_behind_.store(0);  // the parent's long hold is not the child's
  return ok;
}

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
    if (now - last_tick >= static_cast<uint64_t>(k_liveness_poll_ns)) {
      liveness_tick(std::min(deadline, now + static_cast<uint64_t>(k_liveness_poll_ns)));
      last_tick = now;
      stop = interrupted(false);
      continue;
    }
    uint64_t sleep_ns = std::min(last_tick + static_cast<uint64_t>(k_liveness_poll_ns) - now, deadline - now);
    // A regular holder's release is predictable: be awake for it.
    uint64_t predicted_until = 0;
    const uint64_t spin_from = predicted_spin_start(mine, &predicted_until);
    if (spin_from != 0 && predicted_until > now && spun_for != predicted_until) {
      if (now >= spin_from) {
        spun_for = predicted_until;  // one spin per predicted release
        const uint64_t until = std::min(predicted_until, deadline);
        while (slot.state.load(std::memory_order_acquire) == slot_waiting && monotonic_ns() < until) cpu_relax();
        continue;
      }
      sleep_ns = std::min(sleep_ns, spin_from - now);
    }
    const int wrc = futex_wait(&slot.state, slot_waiting, sleep_ns);
    if (wrc == EINTR) {
      // A signal handler ran on this thread: the caller may want to stop.
      stop = interrupted(true);
      continue;
    }
    // Back well before the timeout and not granted: a heads-up (announce_release), most
    // likely. The grant follows within microseconds; spin for it rather than sleep again.
    const uint64_t woke = monotonic_ns();
    if (woke - now < sleep_ns && slot.state.load(std::memory_order_acquire) == slot_waiting) {
      const uint64_t heads_up_until = std::min(woke + static_cast<uint64_t>(k_heads_up_spin_ns), deadline);
      while (slot.state.load(std::memory_order_acquire) == slot_waiting && monotonic_ns() < heads_up_until) cpu_relax();
    }
  }
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
  if (stop) {
    return fail(err_interrupted, "device_lock::acquire: interrupted after %.3f s of waiting for %s (%s); this thread left the queue",
                static_cast<double>(monotonic_ns() - start_ns) / 1e9, segment_->name().c_str(), queue);
  }
  return fail(err_timeout, "device_lock::acquire: %s not granted within %.3f s: %s. Wait longer, or see `vramswap status`",
              segment_->name().c_str(), static_cast<double>(timeout_ns) / 1e9, queue);
}

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

int device_lock::release() noexcept {
  if (segment_ == nullptr) {
    return fail(err_not_owner, "device_lock::release: this lock is not open, so it cannot be held");
  }
  process_identity me{};
  VS_TRY(current_process(&me));
  const pid_t tid = current_tid();
  if (!held_by(me.pid, tid)) {
    const pid_t holder_pid = holder_pid_.load(std::memory_order_relaxed);
    if (holder_pid != 0 && holder_pid != me.pid) {
      return fail(err_not_owner,
                  "device_lock::release: %s was acquired by process %d; a forked child (here pid %d) never "
                  "inherits the lock",
                  segment_->name().c_str(), holder_pid, me.pid);
    }
    return fail(err_not_owner,
                "device_lock::release: thread %d does not hold %s (release without acquire, a double release, "
                "or a release from another thread than the one that acquired)",
                tid, segment_->name().c_str());
  }
  if (depth_ > 1) {
    --depth_;
    return ok;
  }
  lock_state* st = lock_state_of(segment_->base());
  waiter_slot* slots = slots_of(segment_->base());
  const uint32_t mine = holder_slot_.load(std::memory_order_relaxed);
  waiter_slot& slot = slots[mine];
  const bool ours = slot.pid == me.pid && slot.tid == tid && slot.pid_start_time == me.start_time;
  const int mrc = lock_mutex(monotonic_ns() + static_cast<uint64_t>(k_release_mutex_ns));
  if (mrc == err_timeout && ours) {
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
  uint64_t unwarned = warned_over_ticket_.load(std::memory_order_relaxed);
  if (over_since != 0 && unwarned != ticket && warned_over_ticket_.compare_exchange_strong(unwarned, ticket)) {
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
  return ok;
}

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

lock_layout::turn_histograms* device_lock::turns() const noexcept {
  return segment_ == nullptr ? nullptr : turns_of(segment_->base());
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

// --- fair turns -------------------------------------------------------------------------

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
  const uint64_t asked_ns = slot.release_requested_ns.load(std::memory_order_acquire);
  const pid_t asker = slot.release_requester_pid.load(std::memory_order_relaxed);
  const uint64_t asker_ns = slot.release_requester_pid_ns.load(std::memory_order_relaxed);
  const uint32_t asker_uid = slot.release_requester_uid.load(std::memory_order_relaxed);
  unlock_mutex();

  char held[32], limit[32], who[1024];
  format_duration(out.held_ns, held, sizeof held);
  format_duration(max_hold_ns_, limit, sizeof limit);
  uint64_t unwarned = warned_over_ticket_.load(std::memory_order_relaxed);
  if (out.over_limit_since_ns != 0 && unwarned != ticket && warned_over_ticket_.compare_exchange_strong(unwarned, ticket)) {
    waiters.describe(now, who, sizeof who);
    log(log_level::warn,
        "lock: this process has held %s for %s, past its VRAMSWAP_MAX_HOLD of %s, while others wait (%u waiting%s%s). "
        "Release it when you can: its next acquire queues behind every one still waiting then (docs/concepts.md, Fair turns)",
        segment_->name().c_str(), held, limit, waiters.count, waiters.count > 0 ? ": " : "", who);
  }
  uint64_t untold = told_release_ticket_.load(std::memory_order_relaxed);
  if (asked_ns != 0 && untold != ticket && told_release_ticket_.compare_exchange_strong(untold, ticket)) {
    char by[192];
    describe_process_in(asker, asker_ns, by, sizeof by);
    std::string owner;
    try {
      owner = describe_uid(asker_uid);
    } catch (...) {  // out of memory: the uid's name is a nicety
    }
    char ago[32];
    format_duration(now > asked_ns ? now - asked_ns : 0, ago, sizeof ago);
    log(log_level::warn,
        "lock: %s%s%s asked this process to release %s (`vramswap release-request`, %s ago), which it has held for %s; "
        "%u waiting. Nothing is taken from it: release the lock when you can (vramswap.release_requested() tells the "
        "program)%s",
        by, owner.empty() ? "" : " of ", owner.c_str(), segment_->name().c_str(), ago, held, waiters.count,
        release_signal_ != 0 ? "; VRAMSWAP_RELEASE_SIGNAL is set: sending it to this process" : "");
    if (release_signal_ != 0) ::kill(::getpid(), release_signal_);
  }
  out.release_requested = asked_ns != 0;
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
