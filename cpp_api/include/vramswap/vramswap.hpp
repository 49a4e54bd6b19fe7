// vramswap: time-share one GPU among processes whose GPU memory does not fit on it together.
//
// The public C++ API. Everything here throws on failure (the exception types below); the C
// API (vramswap/vramswap.h) offers the same operations with return codes.
//
//   vramswap::gpu_lock lock(0);          // waits (FIFO, by priority); this process's memory
//   train_step(model, batch);            // on device 0 is resident until the guard goes
//                                        // ~gpu_lock: device work synchronized, lock released
//
// One process-wide session per device does the work: it is opened on first use (a gpu_lock,
// malloc, stats... on that device), connects to the device's pool server `vramswapd`
// (started on demand) and lives until the process exits. Configuration comes from VRAMSWAP_*
// environment variables (README.md).
//
// Rules (docs/api.md explains each):
//   - Ownership is per thread. A thread that holds a device's lock may lock it again
//     (counted: every lock needs its unlock). Another thread of the same process that locks
//     the device waits like any other process.
//   - Several devices: take their locks in increasing device order (0 before 1). A thread
//     that holds device d and makes a blocking or timed lock of a device below d gets
//     vramswap::invalid_argument instead of a possible deadlock. try_lock() may go in any
//     order (it never waits), so std::lock(a, b) works.
//   - fork: a child forked after vramswap was used in the parent cannot use vramswap (nor
//     CUDA): every call there throws vramswap::unavailable saying so. Start helpers with
//     posix_spawn/exec (Python multiprocessing: the "spawn" start method). A child forked
//     before first use may use vramswap for itself.
//   - A lock taken from a process that died holding it is granted normally; the death is
//     logged and counted (stats::lock_holder_deaths), not thrown: the lock's state was
//     repaired, and this process's own memory is intact.
//   - Device memory (malloc) may be allocated and freed with or without the lock; it may be
//     touched by the device (kernels, copies) only while this process holds the lock.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>

#include "vramswap/version.hpp"

#if defined(__GNUC__)
#define VRAMSWAP_API __attribute__((visibility("default")))
#else
#define VRAMSWAP_API
#endif

namespace vramswap {

// --- errors --------------------------------------------------------------------------------
// Every exception derives from vramswap::error (a std::runtime_error) and carries the status
// code of the C API (code(), VRAMSWAP_ERR_* in vramswap.h). what() names the failing call and
// says what to do.
class VRAMSWAP_API error : public std::runtime_error {
 public:
  error(int code, const std::string& what);
  int code() const noexcept { return code_; }

 private:
  int code_;
};
// A bad argument or a broken usage rule (lock order); nothing was changed.
class VRAMSWAP_API invalid_argument : public error {
 public:
  using error::error;
};
// Device, pool or host memory exhausted. (Not also a std::bad_alloc: a class that is both a
// runtime_error and a bad_alloc has two std::exception bases, and catch (std::exception&)
// would no longer catch it. Python gets MemoryError.)
class VRAMSWAP_API out_of_memory : public error {
 public:
  using error::error;
};
// The CUDA driver reported an error (the message carries its name).
class VRAMSWAP_API cuda_error : public error {
 public:
  using error::error;
};
// Shared state or the pool server belongs to an incompatible vramswap version.
class VRAMSWAP_API version_mismatch : public error {
 public:
  using error::error;
};
// A timed lock ran out of time.
class VRAMSWAP_API timeout : public error {
 public:
  using error::error;
};
// vramswap cannot work here: no usable backend or device, no pool server, a forked child.
class VRAMSWAP_API unavailable : public error {
 public:
  using error::error;
};
// Maps a status code (< 0) and its detail to the exception above that fits, and throws it.
[[noreturn]] VRAMSWAP_API void throw_error(int code, const std::string& detail);

// --- the lock ------------------------------------------------------------------------------
enum class priority : uint32_t { normal = 1, high = 2 };  // high waiters go first; FIFO within a class

// RAII guard of a device's cross-process lock, shaped like std::unique_lock: while it owns
// the lock, this process's memory on the device is resident and the device is its alone
// (but for the previous holder's already-queued work, which may still be draining when the
// lock passes). Unlocking hands the lock on, then waits for this process's device work to
// finish: when unlock() returns, the work is done.
//
// It also meets the standard's BasicLockable, Lockable and TimedLockable requirements, so
// generic code can drive one (std::unique_lock<vramswap::gpu_lock>, std::scoped_lock,
// std::lock for try_lock-based deadlock avoidance). Such code needs a gpu_lock that does
// not yet own: make it with std::defer_lock.
class VRAMSWAP_API gpu_lock {
 public:
  // Wait for the lock (no time limit).
  explicit gpu_lock(int device = 0, priority p = priority::normal);
  // Wait at most `timeout`; throws vramswap::timeout when it runs out.
  gpu_lock(int device, std::chrono::nanoseconds timeout, priority p = priority::normal);
  // Take it only if that needs no waiting; owns_lock() tells.
  gpu_lock(int device, std::try_to_lock_t, priority p = priority::normal);
  // Do not take it yet.
  gpu_lock(int device, std::defer_lock_t, priority p = priority::normal) noexcept;
  // Releases the lock if owned. Never throws: a failure is logged.
  ~gpu_lock();

  gpu_lock(gpu_lock&& other) noexcept;
  gpu_lock& operator=(gpu_lock&& other) noexcept;  // releases what *this owned first
  gpu_lock(const gpu_lock&) = delete;
  gpu_lock& operator=(const gpu_lock&) = delete;

  // Throws invalid_argument when this guard already owns the lock (use a second guard to
  // re-enter), plus what the constructors throw.
  void lock();
  bool try_lock();
  bool try_lock_for(std::chrono::nanoseconds timeout);
  template <class Clock, class Duration>
  bool try_lock_until(const std::chrono::time_point<Clock, Duration>& deadline) {
    const auto left = deadline - Clock::now();
    return try_lock_for(left > decltype(left)::zero() ? std::chrono::duration_cast<std::chrono::nanoseconds>(left)
                                                      : std::chrono::nanoseconds(0));
  }
  // Throws vramswap::error (code VRAMSWAP_ERR_NOT_OWNER) when this guard does not own the
  // lock, and unavailable in a forked child.
  void unlock();
  // Stop managing the lock without releasing it; the caller must release it through the C
  // API (vramswap_unlock) from this thread. Returns whether it was owned.
  bool release() noexcept;

  bool owns_lock() const noexcept { return owned_; }
  explicit operator bool() const noexcept { return owned_; }
  int device() const noexcept { return device_; }
  priority get_priority() const noexcept { return priority_; }
  // Whether the last successful lock took over from a holder that died holding it.
  bool previous_holder_died() const noexcept { return previous_holder_died_; }

 private:
  bool acquire(int64_t timeout_ns);  // false: busy or timed out (only for timeout_ns >= 0)

  int device_ = 0;
  priority priority_ = priority::normal;
  bool owned_ = false;
  bool previous_holder_died_ = false;
  int owner_pid_ = 0;  // the process that took it, to recognize a forked child
};

// --- memory --------------------------------------------------------------------------------
// Hints for advise(), a promise by the caller about a range of an allocation.
enum class advice : uint8_t {
  normal = 0,       // contents preserved across swaps (the default)
  discardable = 1,  // contents need not survive eviction: they come back zero-filled
  read_mostly = 2,  // not written while the hint stands: a host copy is kept, evicting is free
};

// Device memory of this process on `device`, cudaMalloc-like (256-byte aligned). The
// address never changes, whatever is swapped. Throws out_of_memory, invalid_argument (size 0,
// bad device). Allocation without the lock is fine; the memory is backed at the next lock.
VRAMSWAP_API void* malloc(size_t size, int device = 0);
// Free what malloc returned (nullptr is ignored). Throws invalid_argument for anything else.
VRAMSWAP_API void free(void* ptr, int device = 0);
// Stream-ordered allocation (cudaMallocAsync-like; `stream` is a cudaStream_t, nullptr the
// legacy default stream), for code that allocates and frees at a high rate. free_async is
// ordered on `stream`: later allocations on that stream reuse the block at once; other
// streams only after release_cached() (which synchronizes the device) or after an
// allocation that found no room did the same. Kept blocks are never copied by an eviction.
// Memory allocated for, or freed on, a stream being captured into a CUDA graph is the
// graph's until the process exits. See vramswap_malloc_async in vramswap.h.
VRAMSWAP_API void* malloc_async(size_t size, void* stream, int device = 0);
VRAMSWAP_API void free_async(void* ptr, void* stream, int device = 0);
VRAMSWAP_API void release_cached(int device = 0);
// Attach a hint to [ptr, ptr + size), a range inside one allocation. Any later advise of a
// read_mostly range (after writing it) drops its kept copy.
VRAMSWAP_API void advise(void* ptr, size_t size, advice a, int device = 0);

// This process's numbers on one device. Plain data; see vramswap_stats_t for the C version.
struct stats {
  uint64_t allocated_bytes = 0;  // live allocations (rounded to 256 bytes)
  uint64_t allocations = 0;
  uint64_t resident_bytes = 0;   // pages in device frames
  uint64_t host_bytes = 0;       // saved pages in host memory
  uint64_t disk_bytes = 0;       // saved pages only in the swap file
  uint64_t bytes_in = 0;         // copied host -> device, total
  uint64_t bytes_out = 0;        // copied device -> host, total
  uint64_t acquires = 0;         // lock acquisitions (re-entries not counted)
  uint64_t evictions_served = 0; // frames evicted because another process needed them
  uint64_t lock_holder_deaths = 0;  // acquisitions that took over from a dead holder
  double acquire_seconds = 0;    // total time in acquisitions, waiting included
  double lock_wait_seconds = 0;  // of which waiting for the lock
  double evict_seconds = 0;      // total time evicting this process's memory
  double restore_seconds = 0;    // total time bringing it back
  uint64_t cached_bytes = 0;     // freed by free_async, kept for reuse (part of allocated_bytes)
  uint64_t graph_bytes = 0;      // malloc_async memory held for CUDA graphs (part of allocated_bytes)
  // Oversubscribed processes (VRAMSWAP_OVERSUBSCRIBE=1; docs/oversubscription.md), else 0:
  uint64_t host_frame_bytes = 0;  // pages in host frames, mapped at their addresses (part of resident_bytes)
  uint64_t pages_demoted = 0;     // moved from pool frames to host frames because a lock holder needed them
  uint64_t pages_promoted = 0;    // moved back into free pool frames
  double reclaim_seconds = 0;     // total time demoting
};
// Opens the device's session if needed (so it may start the pool server).
VRAMSWAP_API stats get_stats(int device = 0);

}  // namespace vramswap
