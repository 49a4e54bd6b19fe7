// runtime: the process-wide state behind the public APIs (vramswap.hpp, vramswap.h, Python).
//
// One device_session per device, opened on first use (thread-safe) and closed at exit; the
// per-thread record of held device locks that enforces the device order; the fork check.
// Every function returns 0 or a negative vramswap::detail::status with last_error() set, never
// throws. This header deliberately includes no core header: the public C++ header defines
// names (vramswap::advice, vramswap::stats) that core/ also uses, so a file implementing
// the public API includes this header and the public one, never both core and public.
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

#include "vramswap/vramswap.h"

namespace vramswap::detail::rt {

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

}  // namespace vramswap::detail::rt
