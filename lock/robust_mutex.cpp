#include "lock/robust_mutex.hpp"

#include <linux/futex.h>

#include <cerrno>
#include <ctime>

#include "core/status.hpp"

namespace vramswap::detail {

int robust_mutex_init(pthread_mutex_t* m) noexcept {
  pthread_mutexattr_t attr;
  int rc = pthread_mutexattr_init(&attr);
  if (rc != 0) return fail_errno(rc, "lock: pthread_mutexattr_init");
  rc = pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  if (rc == 0) rc = pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  if (rc == 0) rc = pthread_mutex_init(m, &attr);
  pthread_mutexattr_destroy(&attr);
  if (rc != 0) return fail_errno(rc, "lock: cannot create a robust process-shared mutex");
  return ok;
}

namespace {

int after_lock(pthread_mutex_t* m, int rc, int (*recover)(void* context), void* context) noexcept {
  if (rc == 0) return ok;
  if (rc == EOWNERDEAD) {
    const int repaired = recover(context);
    if (repaired != 0) {
      pthread_mutex_unlock(m);  // not consistent: every later locker gets ENOTRECOVERABLE
      return repaired;
    }
    pthread_mutex_consistent(m);
    return ok;
  }
  if (rc == ENOTRECOVERABLE) {
    return fail(err_internal,
                "lock: the segment's internal mutex is unrecoverable (an earlier repair failed); "
                "stop every process using this device and remove the segment");
  }
  return fail_errno(rc, "lock: pthread_mutex_lock on the segment's internal mutex");
}

}  // namespace

int lock_robust(pthread_mutex_t* m, int (*recover)(void* context), void* context) noexcept {
  return after_lock(m, pthread_mutex_lock(m), recover, context);
}

int lock_robust_until(pthread_mutex_t* m, uint64_t deadline_ns, int (*recover)(void* context), void* context) noexcept {
  // CLOCK_MONOTONIC, so that a change of the wall clock neither ends the wait early nor
  // stretches it.
  const timespec deadline{static_cast<time_t>(deadline_ns / 1'000'000'000ull), static_cast<long>(deadline_ns % 1'000'000'000ull)};
  const int rc = pthread_mutex_clocklock(m, CLOCK_MONOTONIC, &deadline);
  if (rc == ETIMEDOUT) return err_timeout;
  return after_lock(m, rc, recover, context);
}

pid_t robust_mutex_owner(const pthread_mutex_t* m) noexcept {
  // glibc keeps the futex word of a robust mutex as owner tid | FUTEX_WAITERS | FUTEX_OWNER_DIED.
  const int word = __atomic_load_n(&m->__data.__lock, __ATOMIC_RELAXED);
  return static_cast<pid_t>(static_cast<unsigned>(word) & FUTEX_TID_MASK);
}

void unlock_robust(pthread_mutex_t* m) noexcept { pthread_mutex_unlock(m); }

}  // namespace vramswap::detail
