// A process-shared, robust pthread mutex: the only mutual exclusion inside the lock.
//
// Why not Boost's interprocess_mutex: when its owner dies it stays locked forever (or, on
// glibc, returns EOWNERDEAD once and then becomes ENOTRECOVERABLE for everyone), and Boost
// gives no hook to repair the protected state. A robust mutex hands the next locker
// EOWNERDEAD; that locker repairs the state and marks the mutex consistent. Every lock of
// this mutex goes through lock_robust(), which routes EOWNERDEAD to the single recovery
// function the caller passes (LMDB's mdb_mutex_failed discipline).
#pragma once

#include <pthread.h>
#include <sys/types.h>

#include <cstdint>

namespace vramswap::detail {

// Initialize `m` in shared memory as PTHREAD_PROCESS_SHARED + PTHREAD_MUTEX_ROBUST.
int robust_mutex_init(pthread_mutex_t* m) noexcept;

// Lock `m`. When the previous owner died holding it, call `recover(context)` while holding
// it; if that returns 0 the mutex is marked consistent and lock_robust returns 0. If it
// fails, the mutex is unlocked without being made consistent (so every later locker fails
// too: the state is known broken) and its code is returned.
int lock_robust(pthread_mutex_t* m, int (*recover)(void* context), void* context) noexcept;

// lock_robust, waiting at most until `deadline_ns` (CLOCK_MONOTONIC). Returns err_timeout,
// without a detail (the caller knows what the mutex guards and writes it, naming the owner:
// robust_mutex_owner), when the mutex was still held then.
int lock_robust_until(pthread_mutex_t* m, uint64_t deadline_ns, int (*recover)(void* context), void* context) noexcept;

// The kernel thread id of the thread holding `m` now (0: nobody). Read from the mutex word
// without locking: a robust mutex keeps its owner's tid there for the kernel's death
// handling. Diagnostics only: the owner may leave it the next moment.
pid_t robust_mutex_owner(const pthread_mutex_t* m) noexcept;

void unlock_robust(pthread_mutex_t* m) noexcept;

}  // namespace vramswap::detail
