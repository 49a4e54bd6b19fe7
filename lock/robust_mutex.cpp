#include "lock/robust_mutex.hpp"

#include <cerrno>

#include "core/status.hpp"

namespace vramswap {

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

int lock_robust(pthread_mutex_t* m, int (*recover)(void* context), void* context) noexcept {
  const int rc = pthread_mutex_lock(m);
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

void unlock_robust(pthread_mutex_t* m) noexcept { pthread_mutex_unlock(m); }

}  // namespace vramswap
