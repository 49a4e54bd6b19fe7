// lease_mutex: the one mutual exclusion inside a shared segment, robust to the death of its
// owner in any PID namespace.
//
// Why not a robust pthread mutex (what this was): its owner is the thread id in the futex
// word, and the kernel's death handling compares that id with the dying thread's own, each
// seen from its own PID namespace. Threads of two containers often have the same id (every
// container's first process is pid 1), so the death of a thread blocked on the mutex in one
// container, while a thread with the same id holds it in another, marks the mutex as left by
// a dead owner: the next locker repairs the state while the live owner is still inside it,
// and two threads are in the critical section at once.
//
// Here the owner is named by a lease (lock/liveness_lease.hpp): each opening of a segment
// takes a lease of its own, an OFD lock that the kernel drops when the process dies, in
// whatever namespace, and that any process with the segment open can test. The futex word
// holds that lease's token (its index + 1) in its low 31 bits, and k_waiters when a thread
// may sleep on it. Lock: CAS 0 -> token. Contended: set k_waiters and FUTEX_WAIT in slices
// of k_owner_check_ns; after each, when nobody holds the token's lease the owner died inside,
// and the waiter CASes the word from that token to its own and runs the caller's recovery
// function (the role of EOWNERDEAD). Unlock: exchange 0, and wake one thread when k_waiters
// was set. Uncontended, both are one atomic instruction, as with glibc.
//
// A token comes back into use only when its lease is free and the word does not hold it
// (take_mutex_token): a process that took the lease of an owner that died inside would make
// that owner look alive to its waiters.
//
// Threads of one process share its token; the CAS excludes them from each other as from
// everyone else. A thread that leaves the critical section other than by unlocking (it
// cannot die alone: a fatal signal ends the whole process) is not provided for.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>

namespace vramswap::detail {

// The mutex as it lies in shared memory (plain words: every value of each is meaningful).
// Zeroed is unlocked.
struct lease_mutex {
  std::atomic<uint32_t> word;  // 0, or the owner's token | k_waiters
  // Hints for messages, stored by each owner right after it locked (it may die before it
  // does: they may name an earlier owner).
  std::atomic<int32_t> owner_pid;   // in the owner's PID namespace
  std::atomic<int32_t> owner_tid;
  std::atomic<uint32_t> owner_uid;
  std::atomic<uint64_t> owner_pid_ns;
};
static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free);

// Which lease names a locker: the descriptor its segment's leases are taken on, and its token.
struct lease_mutex_owner {
  int lease_fd = -1;
  uint32_t token = 0;  // 0: none (this opening took no lease; it cannot lock)
};

// The lease indices the tokens use, past every index a slot or a rank uses.
constexpr uint32_t k_mutex_lease_first = 1u << 20;
constexpr uint32_t k_mutex_tokens = 4096;  // openings of one segment at once

// Take a token for `m`'s lockers through the lease description `lease_fd`: the first whose
// lease is free and that `m`'s word does not hold. err_busy (detail naming `what`) when all
// k_mutex_tokens are held; err_system when the file system refuses OFD locks.
int take_mutex_token(lease_mutex* m, int lease_fd, const char* what, uint32_t* token) noexcept;
void drop_mutex_token(int lease_fd, uint32_t token) noexcept;

// Lock `m` by `me`, waiting at most until `deadline_ns` (CLOCK_MONOTONIC; UINT64_MAX:
// forever). When its owner died holding it, run `recover(context)` first, holding it; when
// that fails, `m` is unlocked and its code returned. err_timeout, without a detail (the caller
// knows what the mutex guards and says so, naming the owner from the hints), past the
// deadline; err_unavailable (detail set) when `me` has no token.
int lease_mutex_lock(lease_mutex* m, const lease_mutex_owner& me, uint64_t deadline_ns, int (*recover)(void* context),
                     void* context) noexcept;
void lease_mutex_unlock(lease_mutex* m) noexcept;

// Is `m` locked now (by anyone)? Diagnostics only: the owner may let go the next moment.
bool lease_mutex_locked(const lease_mutex* m) noexcept;

}  // namespace vramswap::detail
