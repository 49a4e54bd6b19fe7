// runtime: the process-wide state behind the public APIs, and the one face the front ends
// (the C and C++ API in cpp_api/, the Python module in python/, the LD_PRELOAD shim in
// preload/) reach it through.
//
// The runtime lives in libvramswap.so and nowhere else: the Python module and the shim link
// that library instead of carrying the layers' objects, so a process that uses the shim, the
// Python module and the C++ API at once has one runtime: one pool client per device, one lock
// view, one set of stats. This header is that library's private face: its declarations are
// exported (default visibility) under the version node VRAMSWAP_RUNTIME_<version>
// (cpp_api/libvramswap.map.in), beside the public VRAMSWAP_0, so that a front end built
// against another release of the library refuses to load ("version ... not found") rather
// than call into a runtime it does not match. The front ends' builds see this header and the
// public ones only (CMakeLists.txt, vramswap_runtime_face): a front end that includes a layer's
// header does not build.
//
// One device_session per device, opened on first use (thread-safe) and closed at exit; the
// per-thread record of held device locks that enforces the device order; the fork check.
// Every function returns 0 or a negative status (vramswap.h's VRAMSWAP_ERR_*) with
// last_error() set, never throws. This header deliberately includes no core header: the
// public C++ header defines names (vramswap::advice, vramswap::stats) that core/ also uses,
// so a file implementing the public API includes this header and the public one, never both
// core and public.
//
// Rules enforced here (docs/api.md):
//   - fork: once a session exists, a process forked from this one gets err_unavailable from
//     every call (its copies of the sessions have no threads, and CUDA forbids it). At
//     exit, a forked child leaves the sessions alone.
//   - device order: a blocking or timed lock of device d by a thread that holds a device
//     above d is err_invalid_argument. Tries (timeout 0) may go in any order.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "vramswap/vramswap.h"

// VRAMSWAP_PROCESS_STATS(X): the one list of this process's numbers on a device, in their
// order. It calls X(name, type) once per field of vramswap_stats_t (after its `size`) and of
// vramswap::stats, in the order both public structs declare them. The conversion between the
// two (cpp_api/src/api.cpp), the Python dict (python/src/memory.cpp) and its field list are
// generated from it. The public headers keep their written-out structs, because they are the
// documentation; static_asserts in cpp_api/src/api.cpp tie each of them to this list field
// by field (offset and type) and in size, so that a field added to a struct and not here, or
// here and not in a struct, fails to build. A new field goes at the end (vramswap_stats_t is
// versioned by size: callers built against an older header get the fields that fit): add it
// to both public structs and here, then fill it where runtime.cpp's sessions fill the others
// (runtime/session.hpp: stats).
#define VRAMSWAP_PROCESS_STATS(X) \
  X(allocated_bytes, uint64_t)    \
  X(allocations, uint64_t)        \
  X(resident_bytes, uint64_t)     \
  X(host_bytes, uint64_t)         \
  X(disk_bytes, uint64_t)         \
  X(bytes_in, uint64_t)           \
  X(bytes_out, uint64_t)          \
  X(acquires, uint64_t)           \
  X(evictions_served, uint64_t)   \
  X(lock_holder_deaths, uint64_t) \
  X(acquire_seconds, double)      \
  X(lock_wait_seconds, double)    \
  X(evict_seconds, double)        \
  X(restore_seconds, double)      \
  X(cached_bytes, uint64_t)       \
  X(graph_bytes, uint64_t)        \
  X(host_frame_bytes, uint64_t)   \
  X(pages_demoted, uint64_t)      \
  X(pages_promoted, uint64_t)     \
  X(reclaim_seconds, double)      \
  X(cache_hits, uint64_t)         \
  X(cache_misses, uint64_t)       \
  X(cache_trims, uint64_t)        \
  X(allocator_seconds, double)    \
  X(yield_waits, uint64_t)        \
  X(yield_seconds, double)        \
  X(frames_asked_ahead, uint64_t) \
  X(frames_asked_at_acquire, uint64_t) \
  X(cache_miss_bytes, uint64_t)   \
  X(placement_rounds, uint64_t)   \
  X(placement_rounds_skipped, uint64_t) \
  X(pages_placed_in, uint64_t)    \
  X(pages_placed_out, uint64_t)   \
  X(host_pinned_bytes, uint64_t)  \
  X(asleep_bytes, uint64_t)

namespace vramswap::detail {
namespace __attribute__((visibility("default"))) rt {

// timeout_ns: -1 forever, 0 try (err_busy), > 0 (err_timeout). priority: 1 normal, 2 high.
// *holder_died (optional): the lock was taken over from a holder that died holding it.
int lock(int device, uint32_t priority, int64_t timeout_ns, bool* holder_died) noexcept;
int unlock(int device) noexcept;
// A gang (docs/lock.md, "Gangs"): the locks of devices[0..count) at once, all or none, each
// then held as by lock() (unlock each, or unlock_gang). The devices may come in any order;
// each once. Device order: the gang counts as taking all its devices at its lowest one, so a
// waiting gang by a thread that holds a device above its lowest is err_invalid_argument
// (unless the thread holds the whole gang: re-entry). *holder_died: a member device was
// taken over from a holder that died holding it.
int lock_gang(const int* devices, size_t count, uint32_t priority, int64_t timeout_ns, bool* holder_died) noexcept;
// Gangs of processes (lock/rank_gang.hpp): from now on this process's locks of `device` are
// the rounds of rank `rank` of the gang of `job` (world_size ranks, one process per device):
// each is granted when every rank has asked and the gang is next on every rank's device.
// job nullptr: leave the gang (plain locks again). Only while no thread of this process holds
// or waits for the device. Errors: rank_gang::open's; err_invalid_argument (holding the
// device, an oversubscribed device, already a rank of another gang here).
int join_gang(const char* job, int rank, int world_size, int device) noexcept;
// unlock() of each device, highest first; the first error is returned, after every device
// was tried.
int unlock_gang(const int* devices, size_t count) noexcept;
// Locks of `device` this thread holds (its re-entry depth), 0 in a forked child.
uint32_t held_by_this_thread(int device) noexcept;

int malloc(int device, size_t size, uintptr_t* out) noexcept;
int free(int device, uintptr_t ptr) noexcept;
int advise(int device, uintptr_t ptr, size_t size, uint8_t advice) noexcept;
// The driver's virtual memory API as the preload shim gives it to a program (core/pager.hpp,
// reserve): addresses reserved in this process's arena with nothing behind them; memory at
// an address the program chooses inside such a reservation (free() takes it out again);
// the reservation given back once nothing is in it (err_busy names what still is).
int reserve_addresses(int device, size_t size, size_t alignment, uintptr_t* out) noexcept;
int free_addresses(int device, uintptr_t ptr) noexcept;
int map_at(int device, uintptr_t ptr, size_t size) noexcept;
// The preload shim saw `delta_bytes` of device memory go to (or come back from) the driver
// past vramswap: this process's memory outside the pool, published for `vramswap status`.
int note_outside_pool(int device, int64_t delta_bytes) noexcept;
// Memory classes and sleep/wake (runtime/memory_tags.hpp, docs/sleep.md). malloc_tagged: memory
// of tag `tag` (free() and free_async() take it back; free_async synchronizes the device
// first, as the tag's pages may leave with it). sleep: tags[i] sleeps as modes[i]
// (VRAMSWAP_SLEEP_OFFLOAD or VRAMSWAP_SLEEP_DISCARD); count 0 does nothing. wake: the named
// tags, or every sleeping one when count is 0. keep_resident: this process's memory stays
// resident without the lock from now on (it sleeps and wakes instead of taking turns).
// tags: up to `capacity` reports into out, *count set to how many tags there are.
int malloc_tagged(int device, size_t size, const char* tag, uintptr_t* out) noexcept;
// This thread's allocation tag: while set (not nullptr, not ""), malloc and malloc_async of
// this thread allocate memory of that tag (malloc_async then as malloc_tagged, not from the
// stream allocator's cache). err_invalid_argument for a name that is no valid tag (nothing
// changes); thread_tag() is "" when none is set.
int set_thread_tag(const char* tag) noexcept;
const char* thread_tag() noexcept;
int sleep(int device, const char* const* tags, const uint8_t* modes, size_t count) noexcept;
int wake(int device, const char* const* tags, size_t count) noexcept;
int keep_resident(int device) noexcept;
int tags(int device, vramswap_tag_info_t* out, size_t capacity, size_t* count) noexcept;
// Stream-ordered (runtime/stream_allocator.hpp); `stream` is a CUstream as a number.
// free() of a malloc_async pointer is refused: it must go through free_async.
int malloc_async(int device, size_t size, uintptr_t stream, uintptr_t* out) noexcept;
int free_async(int device, uintptr_t ptr, uintptr_t stream) noexcept;
int release_cached(int device) noexcept;
// Whether this process's memory on `device` is resident (some thread of it holds the lock):
// *out false also when the device's session is not open yet.
int resident(int device, bool* out) noexcept;
// The memory-info view that cudaMemGetInfo/cuMemGetInfo give under the preload shim
// (docs/oversubscription.md). Time-sharing: total = the pool; free = the pool less this
// process's live pages (at its next acquire it can have all the rest). Oversubscribed:
// total = the pool + VRAMSWAP_OVERSUBSCRIBE_LIMIT; free = free pool frames + the limit's
// unused part.
int memory_info(int device, uint64_t* free_bytes, uint64_t* total_bytes) noexcept;
// Whether `ptr` lies in this process's arena on `device` (came from vramswap); false when
// the device's session is not open. Never opens one.
bool owns(int device, uintptr_t ptr) noexcept;
// Whether `device`'s session is oversubscribed (opening it if needed).
int oversubscribed(int device, bool* out) noexcept;
// Fills every field of *out (size included).
int stats(int device, vramswap_stats_t* out) noexcept;
// Whether an operator asked this process to release `device`'s lock during its current hold
// (`vramswap release-request`); false when it does not hold it, or the device's session is
// not open (never opens one), or in a forked child. A safe point: the request (and a hold
// past VRAMSWAP_MAX_HOLD) is logged here if the service thread has not yet done so.
bool release_requested(int device) noexcept;

// For tests (C++ and Python's vramswap._testing): copy bytes between host memory and this
// process's device memory through pinned staging; the calling thread must hold the lock.
int copy_to_device(int device, uintptr_t dst, const void* src, size_t size) noexcept;
int copy_from_device(int device, void* dst, uintptr_t src, size_t size) noexcept;

// Close every session of this process (tests: each test gets its own pool server and
// segments; the runtime is process-wide). Locks this process holds are released.
void reset() noexcept;

// Tests: stop `device`'s pool server (SIGTERM to the pid in its pool segment, waiting up to
// 2 s for it to exit) and remove the device's segment names. Call after reset().
int stop_pool_server(int device) noexcept;

// Tests: the pid of `device`'s pool server, from its pool segment (0 when none is there).
int pool_server_pid(int device, pid_t* out) noexcept;

// True in a process forked after this one's first session was opened.
bool forked_child() noexcept;

// --- errors and the log, for the front ends' own messages ---------------------------------

// This thread's last error message ("" when none), and a status code's name.
const char* last_error() noexcept;
const char* status_name(int code) noexcept;
// Sets this thread's last error from a printf format and returns `code`.
int fail_with(int code, const char* fmt, ...) noexcept __attribute__((format(printf, 2, 3)));

// The library's log (VRAMSWAP_LOG; core/log.hpp): one line at `level`, if enabled.
enum class log_severity : int { error = 0, warn = 1, info = 2, debug = 3 };
void log_line(log_severity level, const char* fmt, ...) noexcept __attribute__((format(printf, 2, 3)));

// --- interrupting a wait -------------------------------------------------------------------

// Asked by a waiting acquire whether to give up (lock/wait_bounds.hpp, wait_interrupt, has
// the rules). signal_ran: a signal handler ran on this thread since the previous call.
// Return true to stop waiting: the call ends with VRAMSWAP_ERR_INTERRUPTED, holding nothing.
struct wait_check {
  bool (*should_stop)(void* context, bool signal_ran) = nullptr;
  void* context = nullptr;
  // Asked instead of should_stop while the device's session opens, under the runtime's own
  // mutex: it must not block on anything that a thread waiting for that mutex may hold
  // (Python's GIL). nullptr: should_stop is asked there too (it must not block either, then).
  bool (*should_stop_without_blocking)(void* context, bool signal_ran) = nullptr;
};

// Installs `check` for this thread's waits until the scope ends (restoring the previous).
class scoped_wait_check {
 public:
  explicit scoped_wait_check(const wait_check& check) noexcept;
  ~scoped_wait_check();
  scoped_wait_check(const scoped_wait_check&) = delete;
  scoped_wait_check& operator=(const scoped_wait_check&) = delete;

 private:
  wait_check previous_;
};

// --- the preload shim's hooks ----------------------------------------------------------

// The launch gate (core/launch_gate.hpp): the shim brackets every call that queues device
// work, so that an oversubscribed process's pages change frames only with none in flight.
// (Out of line, as everything here: the front ends hold none of the runtime's code.)
struct launch_pass {
  launch_pass() noexcept;
  ~launch_pass();
  launch_pass(const launch_pass&) = delete;
  launch_pass& operator=(const launch_pass&) = delete;
};
// The shim says it brackets this process's launches (once its table is built).
void set_launches_bracketed() noexcept;

// Observing kernel launches for placement by use (runtime/use_tracker.hpp): whether this
// launch is one of the sample; its parameters' bytes; what was observed.
bool sample_this_launch() noexcept;
void record_launch_argument_bytes(const void* bytes, size_t size) noexcept;
void note_launch_observed() noexcept;
void note_launch_unreadable() noexcept;

// The stream handle that means "this thread's default stream" to malloc_async/free_async
// (CU_STREAM_PER_THREAD, cudaStreamPerThread).
constexpr uintptr_t k_per_thread_stream = 0x2;

// The version to ask cuGetProcAddress for the driver function `name` at, for a caller
// compiled against `wanted` (core/cuda/declared_abi.hpp: CUDA 13 redeclared two functions).
int driver_abi_version(const char* name, int wanted) noexcept;

// Whether the shim reports a crash with the native stack (VRAMSWAP_PRELOAD_BACKTRACE=1):
// read as the shim is loaded, without reading (and fixing) the other options
// (core/options.hpp, preload_backtrace_at_load).
bool crash_backtrace_wanted() noexcept;

// --- for tests -----------------------------------------------------------------------------

// Read the VRAMSWAP_* environment again (it is read once per process otherwise).
void reread_options_for_testing() noexcept;
// The lock queue of the device whose lock is named `key` ("host-0"), the holder first.
struct queue_entry {
  pid_t pid = 0;
  bool holding = false;
};
int lock_queue(const char* key, std::vector<queue_entry>* out) noexcept;

}  // namespace rt
}  // namespace vramswap::detail
