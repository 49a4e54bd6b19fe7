#include "lock/lease_mutex.hpp"

#include <unistd.h>

#include <cerrno>

#include "core/log.hpp"
#include "core/status.hpp"
#include "lock/futex.hpp"
#include "lock/liveness_lease.hpp"
#include "lock/process_identity.hpp"

namespace vramswap::detail {
namespace {

constexpr uint32_t k_waiters = 1u << 31;
// How often a waiter asks whether the owner is still alive: a dead owner's waiters go on
// within this, a live owner's cost one fcntl per waiter per slice.
constexpr uint64_t k_owner_check_ns = 10'000'000;

uint32_t lease_of(uint32_t token) { return k_mutex_lease_first + token - 1; }

// Every way into the critical section: stamps the owner, and holds this thread's log lines
// until it leaves (core/log.hpp: a blocked stderr must not keep everyone out).
void stamp_owner(lease_mutex* m) noexcept {
  log_defer_begin();
  m->owner_pid.store(static_cast<int32_t>(::getpid()), std::memory_order_relaxed);
  m->owner_tid.store(static_cast<int32_t>(current_tid()), std::memory_order_relaxed);
  m->owner_uid.store(static_cast<uint32_t>(::geteuid()), std::memory_order_relaxed);
  m->owner_pid_ns.store(current_pid_namespace(), std::memory_order_relaxed);
}

// Is the owner named by `token` gone? Never true for our own token (another thread of ours
// holds it), nor where the kernel cannot say.
bool owner_dead(const lease_mutex_owner& me, uint32_t token) noexcept {
  return token != me.token && token != 0 && token <= k_mutex_tokens && !lease_held_elsewhere(me.lease_fd, lease_of(token));
}

}  // namespace

int take_mutex_token(lease_mutex* m, int lease_fd, const char* what, uint32_t* token) noexcept {
  // Start at a place of our own, so that openings at once do not all walk the same leases.
  const uint32_t start = (static_cast<uint32_t>(::getpid()) * 2654435761u) % k_mutex_tokens;
  for (uint32_t n = 0; n < k_mutex_tokens; ++n) {
    const uint32_t t = (start + n) % k_mutex_tokens + 1;
    if ((m->word.load(std::memory_order_acquire) & ~k_waiters) == t) continue;
    const int rc = take_lease(lease_fd, lease_of(t), what);
    if (rc == err_busy) {
      clear_error();
      continue;
    }
    VS_TRY(rc);
    // The lease was free, so whoever had this token is gone; if it died holding the mutex,
    // the word still names it, and its waiters must see it dead: leave the token to them.
    if ((m->word.load(std::memory_order_acquire) & ~k_waiters) == t) {
      drop_lease(lease_fd, lease_of(t));
      continue;
    }
    *token = t;
    return ok;
  }
  return fail(err_busy, "lock: %s is open %u times at once (every token of its internal mutex is taken); close some of the "
              "processes using it", what, k_mutex_tokens);
}

void drop_mutex_token(int lease_fd, uint32_t token) noexcept {
  if (token != 0) drop_lease(lease_fd, lease_of(token));
}

int lease_mutex_lock(lease_mutex* m, const lease_mutex_owner& me, uint64_t deadline_ns, int (*recover)(void* context),
                     void* context) noexcept {
  if (me.token == 0) {
    return fail(err_unavailable, "lock: this opening of the segment holds no token of its internal mutex (a forked child that "
                "did not open it again); open it in this process");
  }
  uint32_t cur = 0;
  if (m->word.compare_exchange_strong(cur, me.token, std::memory_order_acquire, std::memory_order_relaxed)) {
    stamp_owner(m);
    return ok;
  }
  bool check_owner = true;  // once on arrival, then after each slice that saw no change
  for (;;) {
    if (cur == 0) {
      // Taken with k_waiters: we cannot know that nobody else sleeps on the word.
      if (m->word.compare_exchange_weak(cur, me.token | k_waiters, std::memory_order_acquire, std::memory_order_relaxed)) {
        stamp_owner(m);
        return ok;
      }
      continue;
    }
    const uint32_t owner = cur & ~k_waiters;
    if (check_owner && owner_dead(me, owner)) {
      // It died inside: the mutex is ours (unless another waiter got there first), and so is
      // the repair of what it guards.
      if (!m->word.compare_exchange_strong(cur, me.token | k_waiters, std::memory_order_acquire, std::memory_order_relaxed)) continue;
      stamp_owner(m);
      const int repaired = recover(context);
      if (repaired != ok) lease_mutex_unlock(m);
      return repaired;
    }
    check_owner = false;
    if ((cur & k_waiters) == 0) {
      if (!m->word.compare_exchange_weak(cur, cur | k_waiters, std::memory_order_relaxed, std::memory_order_relaxed)) continue;
      cur |= k_waiters;
    }
    const uint64_t now = monotonic_ns();
    if (now >= deadline_ns) {
      // A last look: an owner that died since the last check is not a timeout.
      cur = m->word.load(std::memory_order_acquire);
      if (cur != 0 && !owner_dead(me, cur & ~k_waiters)) return err_timeout;
      check_owner = true;
      continue;
    }
    const uint64_t slice = deadline_ns - now < k_owner_check_ns ? deadline_ns - now : k_owner_check_ns;
    const int rc = futex_wait(&m->word, cur, slice);
    if (rc == ETIMEDOUT) check_owner = true;
    cur = m->word.load(std::memory_order_relaxed);
  }
}

void lease_mutex_unlock(lease_mutex* m) noexcept {
  if ((m->word.exchange(0, std::memory_order_release) & k_waiters) != 0) futex_wake_one(&m->word);
  log_defer_end();
}

bool lease_mutex_locked(const lease_mutex* m) noexcept { return m->word.load(std::memory_order_relaxed) != 0; }

}  // namespace vramswap::detail
