// Minimal shared (not process-private) futex helpers: the word lives in shared memory and
// the waiter and waker are different processes, so FUTEX_PRIVATE_FLAG must not be used.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <ctime>

namespace vramswap::detail {

// Sleep while *word == expected, at most timeout_ns (relative). Returns when woken, on
// timeout, on a signal, or at once if *word != expected; the caller re-checks the word.
// Returns 0, or the errno: EINTR when a signal handler ran on this thread meanwhile.
inline int futex_wait(std::atomic<uint32_t>* word, uint32_t expected, uint64_t timeout_ns) noexcept {
  timespec ts{static_cast<time_t>(timeout_ns / 1000000000ull), static_cast<long>(timeout_ns % 1000000000ull)};
  const long rc = ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
  return rc == 0 ? 0 : errno;
}

// One iteration of a spin-wait: tells the CPU (and a hypervisor) that this core is waiting.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Sleep while every word[i] == expected[i], until `deadline_ns` (CLOCK_MONOTONIC, absolute):
// futex_waitv, one sleep on several words (up to 128). Returns 0 when woken, or the errno:
// ETIMEDOUT, EAGAIN (a word differs already), EINTR (a signal handler ran), ENOSYS (a kernel
// before 5.16: the caller sleeps on one word in short slices instead).
inline int futex_wait_any(std::atomic<uint32_t>* const* words, const uint32_t* expected, unsigned count,
                          uint64_t deadline_ns) noexcept {
  struct futex_waitv waiters[128] = {};
  if (count > 128) count = 128;
  for (unsigned i = 0; i < count; ++i) {
    waiters[i].val = expected[i];
    waiters[i].uaddr = reinterpret_cast<uintptr_t>(words[i]);
    waiters[i].flags = FUTEX_32;  // shared: no FUTEX_PRIVATE_FLAG
  }
  timespec ts{static_cast<time_t>(deadline_ns / 1000000000ull), static_cast<long>(deadline_ns % 1000000000ull)};
  const long rc = ::syscall(SYS_futex_waitv, waiters, count, 0, &ts, CLOCK_MONOTONIC);
  return rc >= 0 ? 0 : errno;
}

// Wake at most one thread sleeping on `word`.
inline void futex_wake_one(std::atomic<uint32_t>* word) noexcept {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, 1, nullptr, nullptr, 0);
}

// Wake every thread sleeping on `word`.
inline void futex_wake_all(std::atomic<uint32_t>* word) noexcept {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

}  // namespace vramswap::detail
