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
// Errors. Every function below that can fail throws one of the exceptions of "errors"; its
// comment lists them. The C API's codes map to them one to one (throw_error): the comment on
// each function in vramswap/vramswap.h says what each code means there, and the first call
// about a device may also throw what opening its session throws:
//   unavailable       a forked child (below); no usable backend (no CUDA driver or device);
//                     vramswapd not found, or it could not start, or it exited meanwhile.
//   invalid_argument  no such device; a malformed VRAMSWAP_* setting (named in what()).
//   timeout           vramswapd did not get ready, or did not answer, in time.
//   version_mismatch  vramswapd, or a shared segment, of another vramswap version.
//   out_of_memory     out of host memory.
//   cuda_error        the CUDA driver failed.
//   error             code() VRAMSWAP_ERR_NOT_OWNER (the pool server or runtime dir belongs to
//                     another user), VRAMSWAP_ERR_BUSY (the server has no free member slot),
//                     VRAMSWAP_ERR_SYSTEM (an OS call failed).
// A failed open is not cached: the next call tries again.
//
// Caveats (docs/api.md explains each):
//   - One runtime per process, in libvramswap.so. The Python module (vramswap._vramswap) and
//     the preload shim (libvramswap_preload.so) use this library's runtime, so a process may
//     use any of them together: one session per device, one lock view, one set of stats. A
//     module or shim of another vramswap release than the library loaded first refuses to
//     load (docs/troubleshooting.md, "One process, one runtime").
//   - The lock is per device and per thread. A thread that holds a device's lock may lock it
//     again (counted: every lock needs its unlock). Another thread of the same process that
//     locks the device waits like any other process. Unlock on the thread that locked.
//   - Several devices: take them together with one gang guard, gpu_lock({0, 1}) (all or none,
//     FIFO on each device: docs/lock.md, "Gangs"), or one guard each in increasing device
//     order (0 before 1). A thread that holds device d and makes a blocking or timed lock of a
//     device below d gets vramswap::invalid_argument instead of a possible deadlock (a gang
//     counts as taking all its devices at its lowest). try_lock() may go in any order (it
//     never waits), so std::lock(a, b) works.
//   - fork after first use: a child forked after vramswap was used in the parent cannot use
//     vramswap (nor CUDA): every call there throws vramswap::unavailable saying so. Start
//     helpers with posix_spawn/exec (Python multiprocessing: the "spawn" start method). A
//     child forked before first use may use vramswap for itself.
//   - Memory is the device's only while the lock is held. malloc and free need no lock, but
//     the device (kernels, copies) may touch this process's memory only while one of its
//     threads holds the lock. Outside the lock an allocation is backed at once only if the
//     pool has free frames for it; malloc otherwise backs it at the next lock (touching it
//     before is an illegal address on CUDA, a SIGSEGV on the host backend), malloc_async
//     throws out_of_memory. Memory touched outside the lock may have gone to another process
//     since: allocate and first-touch outside the lock only at start-up.
//   - Device memory that is not vramswap's (cudaMalloc, CUDA's context, library workspaces)
//     is never swapped: it stays on the device, outside the pool.
//   - Oversubscription (VRAMSWAP_OVERSUBSCRIBE=1, docs/oversubscription.md): such a process
//     is low priority and never takes the lock (gpu_lock throws invalid_argument); its memory
//     is always mapped, in pool frames while free, else in host memory up to
//     VRAMSWAP_OVERSUBSCRIBE_LIMIT (then out_of_memory), and its device work is made safe to
//     move only by the preload shim's launch gate: run such programs under the shim. One that
//     cannot give frames back makes the lock holders' gpu_lock throw timeout after
//     VRAMSWAP_EVICT_TIMEOUT, naming it.
//   - A lock taken from a process that died holding it is granted normally; the death is
//     logged and counted (stats::lock_holder_deaths, gpu_lock::previous_holder_died()), not
//     thrown: the lock's state was repaired, and this process's own memory is intact.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

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
//
// What taking the lock throws (the constructors that take it, lock(), try_lock*()), nothing
// held after any of them:
//   invalid_argument  a waiting lock of a device below one this thread holds; an
//                     oversubscribed process; lock() on a guard that owns already.
//   timeout           (waiting forms) granted, but a process did not give back the frames
//                     this one needs within VRAMSWAP_EVICT_TIMEOUT; the timed constructor
//                     also when its time ran out.
//   out_of_memory, cuda_error, unavailable, error (code() VRAMSWAP_ERR_IO)
//                     granted, but bringing this process's memory back failed; the lock was
//                     released again.
//   error             code() VRAMSWAP_ERR_INTERNAL: a bug in vramswap.
//   and what opening the device's session throws (above).
// try_lock() and try_lock_for() return false where the lock was taken or the time ran out.
class VRAMSWAP_API gpu_lock {
 public:
  // Wait for the lock (no time limit).
  explicit gpu_lock(int device = 0, priority p = priority::normal);
  // Wait at most `timeout`; throws vramswap::timeout when it runs out (its message names the
  // holder and the waiters ahead).
  gpu_lock(int device, std::chrono::nanoseconds timeout, priority p = priority::normal);
  // Take it only if that needs no waiting; owns_lock() tells.
  gpu_lock(int device, std::try_to_lock_t, priority p = priority::normal);
  // Do not take it yet.
  gpu_lock(int device, std::defer_lock_t, priority p = priority::normal) noexcept;

  // A gang: the locks of several devices (0 to 15, each once, any order) at once, all or
  // none (docs/lock.md, "Gangs"). The guard waits in FIFO order on every one of them and is
  // granted them together when it is next on each; meanwhile a member device that is free
  // idles rather than serve those queued behind the gang. Then this process's memory on every
  // one of them is resident; unlocking releases them all. The same forms as for one device;
  // what they throw is the same too, and also invalid_argument for an empty list, a device
  // listed twice or above 15, or a thread that holds some but not all of them. One device in
  // the list is a plain lock of that device.
  explicit gpu_lock(const std::vector<int>& devices, priority p = priority::normal);
  gpu_lock(const std::vector<int>& devices, std::chrono::nanoseconds timeout, priority p = priority::normal);
  gpu_lock(const std::vector<int>& devices, std::try_to_lock_t, priority p = priority::normal);
  gpu_lock(const std::vector<int>& devices, std::defer_lock_t, priority p = priority::normal);
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
  // lock (nothing changed), unavailable in a forked child (nothing changed), cuda_error when
  // the lock was handed on but this process's device work failed, and out_of_memory or
  // vramswap::error (VRAMSWAP_ERR_IO, VRAMSWAP_ERR_NO_SPACE) when evicting failed under
  // VRAMSWAP_EAGER_RELEASE or VRAMSWAP_STRICT (the lock was released). After any but the
  // first two the guard no longer owns.
  void unlock();
  // Stop managing the lock without releasing it; the caller must release it through the C
  // API (vramswap_unlock; a gang's: vramswap_unlock_devices) from this thread. Returns
  // whether it was owned.
  bool release() noexcept;

  bool owns_lock() const noexcept { return owned_; }
  explicit operator bool() const noexcept { return owned_; }
  // The device (a gang's lowest).
  int device() const noexcept { return device_; }
  // Every device of the guard, increasing (one for a single-device guard).
  std::vector<int> devices() const;
  priority get_priority() const noexcept { return priority_; }
  // Whether the last successful lock took over from a holder that died holding it.
  bool previous_holder_died() const noexcept { return previous_holder_died_; }

 private:
  bool acquire(int64_t timeout_ns);  // false: busy or timed out (only for timeout_ns >= 0)
  int unlock_all() noexcept;         // the runtime's unlock of every device of the guard

  int device_ = 0;
  priority priority_ = priority::normal;
  bool owned_ = false;
  bool previous_holder_died_ = false;
  // A gang's devices, bit d for device d (0: the one device_). In what was padding, so that
  // the guard keeps its size and layout.
  uint16_t gang_ = 0;
  int owner_pid_ = 0;  // the process that took it, to recognize a forked child
};

// A gang of processes (docs/lock.md, "Gangs of processes"; vramswap.h, vramswap_join_gang,
// says it all): from now on this process's locks of `device` are the turns of rank `rank` of
// `world_size` in the gang of `job`, granted when every rank has asked and the gang is next
// on every rank's device. A lock of such a device throws vramswap::error with code()
// VRAMSWAP_ERR_OWNER_DIED when a rank died (what() names it: restart the whole job), and
// vramswap::timeout naming the ranks that never asked. Throws invalid_argument, error (codes
// VRAMSWAP_ERR_BUSY, VRAMSWAP_ERR_OWNER_DIED) as vramswap_join_gang returns them.
VRAMSWAP_API void join_gang(const std::string& job, int rank, int world_size, int device = 0);
// Leave the gang: plain locks of `device` again.
VRAMSWAP_API void leave_gang(int device = 0);

// Whether an operator asked this process to release `device`'s lock during its current hold
// (`vramswap release-request`; docs/concepts.md, "Fair turns"): false when this process does
// not hold it, nobody asked, or the device was not used yet (this never opens a session).
// Cheap enough to poll between steps; a request takes nothing from the holder.
VRAMSWAP_API bool release_requested(int device = 0) noexcept;

// --- memory --------------------------------------------------------------------------------
// Hints for advise(), a promise by the caller about a range of an allocation.
enum class advice : uint8_t {
  normal = 0,       // contents preserved across swaps (the default)
  discardable = 1,  // contents need not survive eviction: they come back zero-filled
  read_mostly = 2,  // not written while the hint stands: a host copy is kept, evicting is free
};

// Device memory of this process on `device`, cudaMalloc-like (256-byte aligned). The
// address never changes, whatever is swapped. Allocation without the lock is fine (Caveats).
// Throws invalid_argument (size 0), out_of_memory (the arena or the pool cannot hold it; an
// oversubscribed process at its limit), cuda_error (mapping its pages), and what opening the
// device's session throws.
VRAMSWAP_API void* malloc(size_t size, int device = 0);
// Free what malloc returned (nullptr is ignored). Throws invalid_argument for anything else
// (an interior pointer, a double free, a malloc_async block; nothing is freed), cuda_error
// (unmapping its pages), and what opening the device's session throws.
VRAMSWAP_API void free(void* ptr, int device = 0);
// Stream-ordered allocation (cudaMallocAsync-like; `stream` is a cudaStream_t, nullptr the
// legacy default stream), for code that allocates and frees at a high rate. free_async is
// ordered on `stream`: later allocations on that stream reuse the block at once; other
// streams only after release_cached() (which synchronizes the device and gives wholly free
// segments back) or after an allocation that found no room did the same. Free blocks are
// never copied by an eviction (a page they share with a live block is).
// Memory allocated for, or freed on, a stream being captured into a CUDA graph is the
// graph's until the process exits. See vramswap_malloc_async in vramswap.h.
// malloc_async throws invalid_argument (size 0), out_of_memory (no room; or outside the lock
// with no free frame to back it now: allocate inside the lock), cuda_error (asking whether
// `stream` is being captured, or mapping). free_async throws invalid_argument (not a
// malloc_async block of this device, or given back already; nothing is freed), cuda_error.
// release_cached synchronizes the device: cuda_error. All three also throw what opening the
// device's session throws.
VRAMSWAP_API void* malloc_async(size_t size, void* stream, int device = 0);
VRAMSWAP_API void free_async(void* ptr, void* stream, int device = 0);
VRAMSWAP_API void release_cached(int device = 0);
// Attach a hint to [ptr, ptr + size), a range inside one allocation. Any later advise of a
// read_mostly range (after writing it) drops its kept copy. Throws invalid_argument (not an
// advice value; the range is not inside one live allocation), and what opening the device's
// session throws.
VRAMSWAP_API void advise(void* ptr, size_t size, advice a, int device = 0);

// --- memory classes: sleep and wake (docs/sleep.md; vramswap.h says it all) ----------------
// A tag names a memory class ("weights", "kv_cache"): 1 to 63 letters, digits or _ - . : /,
// at most 64 a process and device. A tag's allocations share no page with other memory, so
// sleep() can take its pages off the device, their frames free for others, until wake().
// The addresses stay valid; while a tag sleeps the device must not touch its memory.
enum class sleep_mode : int {
  offload = 0,  // the bytes go to host memory (disk past its limit); wake brings them back
  discard = 1,  // the bytes are dropped; wake gives the pages back zero-filled
};
struct tag_sleep {
  std::string tag;
  sleep_mode mode = sleep_mode::offload;
};
struct tag_info {
  std::string name;
  uint64_t allocated_bytes = 0;
  uint64_t allocations = 0;
  uint64_t reserved_bytes = 0;
  bool asleep = false;
  sleep_mode mode = sleep_mode::offload;  // while asleep
};
// malloc of tag `tag`; free() (and free_async()) take it back. Throws what malloc throws, and
// invalid_argument for a bad tag name, a 65th tag, or a tag asleep.
VRAMSWAP_API void* malloc(size_t size, int device, const std::string& tag);
// This thread's allocation tag (vramswap_set_thread_tag): while set, malloc(size, device) and
// malloc_async of this thread allocate memory of that tag. "" clears it. Throws
// invalid_argument for a name that is no valid tag (nothing changed).
VRAMSWAP_API void set_thread_tag(const std::string& tag);
VRAMSWAP_API std::string thread_tag();
// RAII: this thread's allocations are of `tag` until the scope ends (the previous tag back then).
class tag_scope {
 public:
  explicit tag_scope(const std::string& tag) : previous_(thread_tag()) { set_thread_tag(tag); }
  ~tag_scope() {
    try {
      set_thread_tag(previous_);
    } catch (...) {  // the previous tag was valid: cannot fail
    }
  }
  tag_scope(const tag_scope&) = delete;
  tag_scope& operator=(const tag_scope&) = delete;

 private:
  std::string previous_;
};
// Sleep each tag as its mode says, in one pass (discards first); synchronizes the device. A
// tag asleep already stays so (a discard drops what an offload kept). Throws invalid_argument
// (an unknown tag, one named twice, an oversubscribed process), out_of_memory, cuda_error,
// error (VRAMSWAP_ERR_IO, VRAMSWAP_ERR_NO_SPACE); what() says which tags are asleep then.
VRAMSWAP_API void sleep(const std::vector<tag_sleep>& tags, int device = 0);
// Wake the named tags (none named: every sleeping tag): brought in now while this process's
// memory is resident (lock held, or keep_resident), else at the next lock. Throws
// invalid_argument (an unknown tag, an oversubscribed process), timeout (no frames within
// VRAMSWAP_EVICT_TIMEOUT), cuda_error, error (VRAMSWAP_ERR_IO); the tags not woken stay asleep.
VRAMSWAP_API void wake(const std::vector<std::string>& tags = {}, int device = 0);
// This process's memory on `device` stays resident without the lock from now on; it leaves
// only by sleep(), and gpu_lock of the device is refused. Throws invalid_argument (the lock
// held, a rank of a gang, an oversubscribed process) and what bringing memory in at a lock throws.
VRAMSWAP_API void keep_resident(int device = 0);
// This process's tags on `device`, in the order they were made.
VRAMSWAP_API std::vector<tag_info> tags(int device = 0);

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
  uint64_t cached_bytes = 0;     // free bytes in the allocator's segments, kept for reuse (part of allocated_bytes)
  uint64_t graph_bytes = 0;      // malloc_async memory held for CUDA graphs (part of allocated_bytes)
  // Oversubscribed processes (VRAMSWAP_OVERSUBSCRIBE=1; docs/oversubscription.md), else 0:
  uint64_t host_frame_bytes = 0;  // pages in host frames, mapped at their addresses (part of resident_bytes)
  uint64_t pages_demoted = 0;     // moved from pool frames to host frames because a lock holder needed them
  uint64_t pages_promoted = 0;    // moved back into free pool frames
  double reclaim_seconds = 0;     // total time demoting
  // The stream-ordered allocator (malloc_async / free_async; vramswap.torch):
  uint64_t cache_hits = 0;        // allocations served from a free block of a segment
  uint64_t cache_misses = 0;      // allocations that took a new segment from the pager
  uint64_t cache_trims = 0;       // times the device was synchronized and free segments given back
  double allocator_seconds = 0;   // total time inside malloc_async, free_async and trims
  // Oversubscribed processes: device work held back for lock holders
  // (VRAMSWAP_OVERSUBSCRIBE_COMPUTE; the process's, all devices):
  uint64_t yield_waits = 0;       // launches that waited for a lock holder
  double yield_seconds = 0;       // total time they waited (summed over threads)
  // Time-sharing: frames other processes were asked to evict for this one's acquires
  uint64_t frames_asked_ahead = 0;       // before the acquire, between turns (VRAMSWAP_EVICT_AHEAD)
  uint64_t frames_asked_at_acquire = 0;  // during the acquire, after the lock was granted
  // The stream-ordered allocator, again:
  uint64_t cache_miss_bytes = 0;  // bytes of the segments its misses took from the pager, total
  // Oversubscribed processes: placement by use (VRAMSWAP_OVERSUBSCRIBE_PLACEMENT):
  uint64_t placement_rounds = 0;          // rounds that moved pages
  uint64_t placement_rounds_skipped = 0;  // rounds whose gain was below their cost, not run
  uint64_t pages_placed_in = 0;           // moved from host frames into pool frames
  uint64_t pages_placed_out = 0;          // moved from pool frames into host frames
  // Host memory this process pinned of its own for its pages, used or not: its host tier's
  // slots (those pinned ahead of need included; 0 with the shared host pool, which vramswapd
  // owns), and an oversubscribed process's host frames (in use and spare).
  uint64_t host_pinned_bytes = 0;
  // Memory classes (sleep): bytes of the allocations of the tags asleep now.
  uint64_t asleep_bytes = 0;
};
// Opens the device's session if needed (so it may start the pool server). Throws
// out_of_memory (host memory), and what opening the device's session throws.
VRAMSWAP_API stats get_stats(int device = 0);

}  // namespace vramswap
